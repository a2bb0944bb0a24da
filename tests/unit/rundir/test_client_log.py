"""rundir.clientlog (ClientLog / steps_from_clients / complete_from_clients): each churn client's
own copy of the agreed log (eval.client_logs), and how a (re)started evaluator completes its log
from it; RunDir's client-log paths.

Files of a few hundred bytes under tmp_path; milliseconds, no processes, no model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedflood.core.config import runconfig as config
from seedflood.core.flood import protocol as proto
from seedflood.core.membership.roster import Change
from seedflood.core.topology.resolve import topology_of
from seedflood.core.wire.message import Message
from seedflood.rundir import resume
from seedflood.rundir.clientlog import ClientLog, client_report, complete_from_clients, steps_from_clients
from seedflood.rundir.layout import RunDir
from seedflood.rundir.logfile import LogReader, LogWriter
from seedflood.rundir.logheader import log_header

ROOT = Path(__file__).resolve().parents[3]
DEBUG = ROOT / "launch" / "configs" / "debug.yaml"


def setup(tmp_path: Path, *sets: str):
    cfg = config.load(DEBUG, [f"run.out_dir={tmp_path / 'run'}", "churn.settle=1", "run.steps=8", *sets])
    p = proto.Protocol.of(cfg, topology_of(cfg).diameter)
    header = log_header(cfg, proto.trajectory(cfg, p, "digest"), "tiny", "abc")
    return RunDir.of(cfg), p, header


def step(p: proto.Protocol, s: int, members=range(4), scalar: float = 1.0) -> tuple[int, list[Message]]:
    return s, [Message.make(o, s, p.seed(o, s, 0), scalar + o, 0) for o in members]


def test_a_client_log_is_a_replayable_run_directory_with_its_report(tmp_path):
    run, p, header = setup(tmp_path)
    history = [step(p, 0), step(p, 1)]
    changes = {2: Change(2, leave=(3,))}
    own = ClientLog(run, p, header, 1)
    own.extend(history, changes)
    history += [step(p, 2, members=range(3))]
    own.extend(history, changes)
    own.close()
    own.report({"node": 1, "hash": "h"})
    d = tmp_path / "run" / "clients" / "node-1"
    assert (d / "config.yaml").is_file() and json.loads((d / "report.json").read_text()) == {"node": 1, "hash": "h"}
    assert client_report(run, 1) == {"node": 1, "hash": "h"} and client_report(run, 0) is None
    reader = LogReader(d / "log.bin")
    _, records = reader.read(check=p.check_step)
    assert records == history and reader.changes == changes
    # what `seedflood replay` reads: config.yaml against the log header, every record checked
    cfg2, p2 = resume.recorded(RunDir.at(d))
    assert resume.recorded_steps(RunDir.at(d), p2, proto.trajectory(cfg2, p2, "digest")) == history


def test_a_reopened_client_log_keeps_what_agrees_and_cuts_a_difference_keeping_a_copy(tmp_path):
    run, p, header = setup(tmp_path)
    first = ClientLog(run, p, header, 0)
    first.extend([step(p, 0), step(p, 1), step(p, 2)], {})
    first.close()
    # a restart: the history handed over is shorter at first (nothing is cut), then reaches them
    again = ClientLog(run, p, header, 0)
    assert client_report(run, 0) is None  # a report of an earlier launch is not this one's
    history = [step(p, 0)]
    again.extend(history, {})
    history += [step(p, 1), step(p, 2, scalar=5.0), step(p, 3)]  # step 2 differs: never expected
    again.extend(history, {})
    again.close()
    d = tmp_path / "run" / "clients" / "node-0"
    assert LogReader(d / "log.bin").read()[1] == history
    (old,) = d.glob("log.bin.*.old")
    assert len(LogReader(old).read()[1]) == 3


def test_one_process_per_node_directory(tmp_path):
    run, p, header = setup(tmp_path)
    a = ClientLog(run, p, header, 2)
    b = ClientLog(run, p, header, 2)  # a second incarnation while the first is alive
    assert a.writer is not None and b.writer is None
    a.close()
    b.close()


def test_off_when_eval_client_logs_is_empty(tmp_path):
    run, p, header = setup(tmp_path, "eval.client_logs=")
    own = ClientLog(run, p, header, 0)
    own.extend([step(p, 0)], {})
    own.report({"node": 0})
    own.close()
    assert not (tmp_path / "run" / "clients").exists() and client_report(run, 0) is None


def write_client(run, p, header, node: int, history, changes=None) -> None:
    own = ClientLog(run, p, header, node)
    own.extend(history, changes or {})
    own.close()


def test_the_evaluator_log_is_completed_from_the_longest_agreeing_client_log(tmp_path):
    run, p, header = setup(tmp_path)
    history = [step(p, s) for s in range(8)]
    own = LogWriter(tmp_path / "run" / "log.bin", header, check=p.check_step)
    for s, m in history[:3]:
        own.append(s, m)
    own.close()
    write_client(run, p, header, 0, history[:5])
    write_client(run, p, header, 1, history)  # the longest
    write_client(run, p, header, 2, [step(p, s, scalar=9.0) for s in range(8)])  # another history
    records = complete_from_clients(run, p, header, history[:3])
    assert records == history
    assert LogReader(tmp_path / "run" / "log.bin").read(check=p.check_step)[1] == history
    # complete already: nothing more to take
    assert complete_from_clients(run, p, header, history) == history


def test_control_no_client_logs_no_completion(tmp_path):
    """The control of the test above: with `eval.client_logs: ""` the same clients keep no log,
    and the evaluator's log stays at the three steps it had."""
    run, p, header = setup(tmp_path, "eval.client_logs=")
    history = [step(p, s) for s in range(8)]
    own = LogWriter(tmp_path / "run" / "log.bin", header, check=p.check_step)
    for s, m in history[:3]:
        own.append(s, m)
    own.close()
    write_client(run, p, header, 0, history[:5])
    write_client(run, p, header, 1, history)
    assert complete_from_clients(run, p, header, history[:3]) == history[:3]
    assert LogReader(tmp_path / "run" / "log.bin").read(check=p.check_step)[1] == history[:3]


def test_a_client_log_of_other_settings_is_not_used(tmp_path):
    run, p, header = setup(tmp_path)
    other = {**header, "base_hash": "zzz"}
    write_client(run, p, other, 0, [step(p, s) for s in range(8)])
    assert steps_from_clients(run, p, header) is None
    assert complete_from_clients(run, p, header, []) == []


@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_client_root(tmp_path, where):
    value = "mine" if where == "relative" else str(tmp_path / "elsewhere")
    run, _, _ = setup(tmp_path, f"eval.client_logs={value}")
    expect = tmp_path / "run" / "mine" if where == "relative" else tmp_path / "elsewhere"
    assert run.clients == expect and run.client(3) == expect / "node-3"


def test_a_report_older_than_since_is_not_this_launchs(tmp_path):
    """The evaluator counts a client as done from a report on its disk only if it was written
    since the evaluator started: one an earlier launch left says nothing about this one."""
    import os
    import time

    run, p, header = setup(tmp_path)
    own = ClientLog(run, p, header, 0)
    own.close()
    own.report({"node": 0})
    path = tmp_path / "run" / "clients" / "node-0" / "report.json"
    now = time.time()
    os.utime(path, (now - 100, now - 100))
    assert client_report(run, 0) == {"node": 0}
    assert client_report(run, 0, since=now - 50) is None
    assert client_report(run, 0, since=now - 150) == {"node": 0}
