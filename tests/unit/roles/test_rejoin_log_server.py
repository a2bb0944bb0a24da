"""A restarted client takes the decided prefix from a read-only log server (`seedflood
serve-log`, churn.log_server) in process, over the real TCP server: its sponsor sends only the
steps after it; a tampered prefix is found by the sponsor's chain and the whole log is sent.
Cheaper cases (the bytes, the checks, the server) are in test_logserver.py."""

from __future__ import annotations

import dataclasses
import logging
import re

import pytest
from test_churn import PACED, cfg_for, check_survivors, protocol_of

from seedflood.comm import logserve
from seedflood.core.config.runconfig import Config
from seedflood.core.flood.protocol import trajectory
from seedflood.ml.workload import Workload
from seedflood.roles.inprocess import Event, SimResult, simulate
from seedflood.roles.logserver import LogSource
from seedflood.rundir.logfile import LogWriter

STEPS = 14
KILL = [Event(3, 5, "kill"), Event(7, 5, "restart")]  # node 5 of the 2×4 torus; steps 0..2 hold every member


@pytest.fixture(scope="module")
def first_steps():
    """Steps 0..2 of the run, all members: what its evaluator's log holds early on."""
    r = simulate(cfg_for(steps=STEPS), stop=5, hash_every_step=False)
    assert [s for s, _ in r.records][:3] == [0, 1, 2]
    return r.records[:3]


def serve(tmp_path, steps) -> logserve.LogServer:
    cfg = cfg_for(steps=STEPS)
    p, w = protocol_of(cfg), Workload.build(cfg)
    header = {"trajectory": trajectory(cfg, p, w.train_digest()), "base_hash": w.loaded.base_hash}
    (tmp_path / "served").mkdir()
    writer = LogWriter(tmp_path / "served" / "log.bin", header)
    for s, msgs in steps:
        writer.append(s, list(msgs))
    writer.close()
    source = LogSource(tmp_path / "served")
    return logserve.LogServer(source, source.describe, "127.0.0.1", 0).start()


def restart_with(tmp_path, caplog, steps) -> tuple[Config, SimResult]:
    """The run with node 5 killed and restarted, its restart given a log server of `steps`."""
    server = serve(tmp_path, steps)
    caplog.set_level(logging.WARNING, logger="seedflood.roles")
    try:
        cfg = cfg_for(PACED, f"churn.log_server={server.address}", steps=STEPS)
        return cfg, simulate(cfg, events=KILL)
    finally:
        server.close()


def said(caplog, pattern: str) -> list[re.Match]:
    return [m for r in caplog.records if (m := re.search(pattern, r.getMessage()))]


@pytest.mark.timeout(300)
def test_a_restart_replays_the_servers_prefix_and_its_sponsor_sends_only_the_steps_after_it(
    tmp_path, caplog, first_steps
):
    cfg, r = restart_with(tmp_path, caplog, first_steps)
    assert r.exits == {} and sorted(r.hashes) == list(range(8)), r.exits
    check_survivors(cfg, r, tmp_path)  # one hash, a replay of the decided steps gives it
    assert r.records[:3] == first_steps
    assert said(caplog, r"node 5: fetched steps 0\.\.2 from the log server")
    (sponsor,) = said(caplog, r"sponsoring node 5 .*; catch-up of (\d+) bytes \(steps from 3: it holds 0\.\.2\)")
    assert said(caplog, r"node 5: rejoined by replaying \d+ steps from node \d+ \(steps 0\.\.2 from the log server\)")
    assert not said(caplog, "the whole log")


@pytest.mark.timeout(300)
def test_a_tampered_prefix_is_found_by_the_sponsors_chain_and_the_restart_takes_the_whole_log(
    tmp_path, caplog, first_steps
):
    s, msgs = first_steps[1]
    msgs = sorted(msgs)
    tampered = [first_steps[0], (s, [dataclasses.replace(msgs[0], scalar=-msgs[0].scalar), *msgs[1:]]), first_steps[2]]
    cfg, r = restart_with(tmp_path, caplog, tampered)  # well-formed steps, another history: only a chain can tell
    assert r.exits == {} and sorted(r.hashes) == list(range(8)), r.exits
    check_survivors(cfg, r, tmp_path)
    assert r.records[:3] == first_steps  # the run's history, not the server's
    assert said(caplog, r"node 5: fetched steps 0\.\.2 from the log server")  # internally consistent
    assert said(caplog, r"sponsoring node 5 .*; catch-up of \d+ bytes \(the whole log\)")
    assert said(caplog, r"node 5: node \d+ sent its whole log: the log server's steps 0\.\.2 are not its chain")
    assert said(caplog, r"node 5: rejoined by replaying \d+ steps from node \d+; originates")
