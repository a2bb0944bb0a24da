"""torchrun with per-process agents (launch/churn.sh): SIGKILL one client's worker mid-run and
its own agent restarts it alone (MAX_RESTARTS); it rejoins by replay while the others train on,
and the run ends with every client on the evaluator's hash (docs/churn-design.md, Supervisors).
With LOG_SERVER_PORT churn.sh also starts `seedflood serve-log` on the run directory: the
restarted worker takes the decided prefix there and its sponsor sends only the steps after it."""

from __future__ import annotations

import os
import re
import signal

import pytest

import e2e_support as sup
import runs
from seedflood.experiments.gpuevidence_run import worker  # the worker of a rank, found through /proc
from seedflood.rundir.logfile import LogReader

pytestmark = pytest.mark.e2e
CHURN = sup.REPO / "launch" / "churn.sh"
DEBUG = sup.REPO / "launch" / "configs" / "debug.yaml"
VICTIM_RANK = 3  # node 2; the evaluator attaches to node 0
STEPS = 200  # with PACE: a worker restarted at step 11 rejoined at 98 in CI at ~25 steps/s (3.5 s): 5x margin
PACE = "run.step_delay_s=0.05"  # the restart needs wall time, not steps: a sleep per step costs no CPU


@pytest.mark.timeout(1800)  # an outer bound: the waits are bounded by the run's progress
def test_a_killed_worker_is_restarted_by_its_own_agent_and_rejoins(entry, tmp_path):
    if entry != "seedflood":
        pytest.skip("churn needs the real `seedflood train` (the probe has no churn)")
    out = tmp_path / "run"
    port = sup.free_port()
    store = f"127.0.0.1:{port}"
    env = sup.launcher_env(STORE_PORT=str(port), MAX_RESTARTS="2", LOG_SERVER_PORT=str(sup.free_port()))
    argv = ["bash", str(CHURN), str(DEBUG), *sup.churn_sets(out, STEPS, PACE)]
    log = tmp_path / "churn.log"
    with sup.procs(tmp_path / "procs") as procs:
        procs.start("churn.sh", argv, env=env, log=log)
        runs.wait_for_steps(procs, out, 10)
        pid = worker(store, VICTIM_RANK)
        assert pid is not None, "the victim's worker must be running"
        os.kill(pid, signal.SIGKILL)
        (code,) = procs.wait()
    text = sup.tail(log, 200)
    assert code == 0, text
    said = log.read_text(errors="replace")
    assert "rejoined by replaying" in said, text
    fetched = re.search(rf"node {VICTIM_RANK - 1}: fetched steps 0\.\.(\d+) from the log server", said)
    assert fetched is not None, text
    assert f"steps from {int(fetched[1]) + 1}: it holds 0..{fetched[1]})" in said, text  # the sponsor's rest
    sup.check_churn_run(out, STEPS, text)
    reader = LogReader(out / "log.bin")
    _, records = reader.read()
    assert len(records) == STEPS
    (leave, join) = sorted(reader.changes.items())
    assert leave[1].leave == (VICTIM_RANK - 1,) and join[1].join == ((VICTIM_RANK - 1, 2),), reader.changes
