"""Churn under SLURM, on the real single-machine cluster of slurm_cluster.py.

`launch/slurm/churn.sh` submits the run's store as its own job (store.sbatch) and one job array
with a task per process (churn.sbatch: task 0 the evaluator, task I client node I-1, --requeue).
`scontrol requeue` of one task mid-run ends its process; released at once (Slurm would hold it
~2 minutes), SLURM starts it again and it comes back as a new incarnation. One run takes two
requeues in turn:
- a client leaves, is sponsored by a neighbour, rejoins by replay; every task ends COMPLETED,
  the four clients on the evaluator's hash, the log holds one leave and one join of that node;
- then the evaluator resumes from its checkpoint and log and catches up from the attach node.
The store job ends by itself (COMPLETED) once the array is done. Preflight failures (a strict
config, an array that does not fit the run) end with status 2 before anything connects.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

import e2e_support as sup
import procs as harness
from seedflood.rundir.layout import CheckpointError
from seedflood.rundir.logfile import LogReader

pytestmark = pytest.mark.e2e
CHURN = "launch/slurm/churn.sh"
STEPS = 400  # with PACE, 5-7 steps/s: a requeued task is back (~10-30 s) well before the end
PACE = "run.step_delay_s=0.1"  # the requeues need wall time, not steps: a sleep per step costs no CPU
PROGRESS = re.compile(r"seedflood:\s+\d+%\|")  # the evaluator's progress bar (tqdm)
CLIENT_RANK = 3  # client node 2, not the attach node (node 0): the launcher's case, nothing more


def _outputs(tmp_path: Path) -> str:
    """The jobs' outputs for assertion messages: the last lines of each, without progress bars."""
    parts = []
    for p in sorted(tmp_path.glob("slurm-*.out")):
        lines = [x for x in sup.tail(p, 10**6).splitlines() if x.strip() and not PROGRESS.match(x)]
        parts.append(f"== {p.name}\n" + "\n".join(lines[-25:]))
    return "\n".join(parts)


def _submit(slurm, tmp_path: Path, *sets: str) -> tuple[str, str]:
    """churn.sh as a user runs it; returns (store job, array job)."""
    env = sup.launcher_env(LOG_DIR=str(tmp_path), STORE_PORT=str(sup.free_port()), STORE_POLL_S="1")
    r = slurm.run(["bash", CHURN, "--time=10", str(sup.DEBUG_CONFIG), *sets], env=env, cwd=sup.REPO, timeout=180)
    ids = dict(line.split("=", 1) for line in r.stdout.split())
    return ids["store"], ids["array"]


def _logged_steps(out: Path) -> int:
    try:
        return len(LogReader(out / "log.bin").read()[1])
    except (CheckpointError, OSError):  # not there yet
        return 0


def _requeue_mid_run(slurm, array: str, rank: int, out: Path, after_steps: int, tmp_path: Path) -> None:
    """Once the log holds `after_steps` steps: requeue task `rank`, and release it once it is
    pending (Slurm 22.05 holds a requeued job ~120 s: Reason=BeginTime) and 2 s have passed:
    earlier, the requeue sets BeginTime again after the update, or slurmd refuses a relaunch
    within the second of the kill ("Job credential revoked") and the task ends FAILED 1:0.
    (StartTime=now+2 instead would wait for the next periodic scheduling pass, 30-60 s.)"""
    task = f"{array}_{rank}"
    states: dict = {}

    def logged() -> bool:
        states.update(slurm.job_states(array))
        assert all(s in ("PENDING", "RUNNING") for s, _ in states.values()), f"{states}\n{_outputs(tmp_path)}"
        return _logged_steps(out) >= after_steps

    def progress():
        return (tuple(sorted(states.items())), harness.size(tmp_path), harness.size(out / "log.bin"))

    slurm.until(logged, f"{after_steps} steps logged", progress)
    slurm.run(["scontrol", "requeue", task])
    slurm.until(lambda: slurm.job_states(array).get(task, ("?",))[0] == "PENDING", f"{task} pending", progress)
    time.sleep(2.0)
    slurm.run(["scontrol", "update", f"JobId={task}", "StartTime=now"])


def _wait_all(slurm, store: str, array: str, tmp_path: Path) -> None:
    """Every array task and then the store job end COMPLETED with status 0."""
    states = slurm.wait_job(array, watch=[tmp_path, tmp_path / "run" / "log.bin"])
    assert len(states) == 5 and all(s == ("COMPLETED", "0:0") for s in states.values()), (
        f"{states}\n{_outputs(tmp_path)}\n{slurm.logs()}"
    )
    assert slurm.wait_job(store, watch=[tmp_path]) == {store: ("COMPLETED", "0:0")}, (
        f"{_outputs(tmp_path)}\n{slurm.logs()}"
    )


def _check_run(out: Path, tmp_path: Path) -> dict:
    """The evaluator's summary: nobody left, every client on its hash; the log replays to it."""
    return sup.check_churn_run(out, STEPS, _outputs(tmp_path))


@pytest.fixture
def churn_entry(entry: str) -> str:
    if entry != "seedflood":
        pytest.skip("churn needs the real `seedflood train` (the probe has no churn)")
    return entry


@pytest.mark.timeout(1800)  # an outer bound: every wait is bounded by progress
def test_a_requeued_client_rejoins_then_a_requeued_evaluator_resumes_and_catches_up(
    slurm, churn_entry, tmp_path: Path
) -> None:
    """One run, two requeues in turn (one launched run instead of two: CI time): a client, then
    once it has rejoined, the evaluator."""
    out = tmp_path / "run"
    # A user's checkpoint.resume=false too: churn.sbatch forces resume, or the restart would refuse the run dir.
    store, array = _submit(
        slurm, tmp_path, *sup.churn_sets(out, STEPS, PACE, "checkpoint.every=100", "checkpoint.resume=false")
    )
    victim_out = tmp_path / f"slurm-seedflood-churn-{array}_{CLIENT_RANK}.out"

    def victim() -> str:
        return victim_out.read_text(errors="replace") if victim_out.exists() else ""

    try:
        _requeue_mid_run(slurm, array, CLIENT_RANK, out, 50, tmp_path)
        slurm.until(
            lambda: "rejoined by replaying" in victim(),
            f"task {CLIENT_RANK} to rejoin",
            lambda: (harness.size(victim_out), harness.size(out / "log.bin")),
        )
        _requeue_mid_run(slurm, array, 0, out, _logged_steps(out) + 20, tmp_path)
        _wait_all(slurm, store, array, tmp_path)
    finally:
        slurm.run(["scancel", store, array], check=False)
    assert "attempt 1" in victim() and "rejoined by replaying" in victim(), _outputs(tmp_path)
    evaluator = (tmp_path / f"slurm-seedflood-churn-{array}_0.out").read_text(errors="replace")
    assert "attempt 1" in evaluator, _outputs(tmp_path)
    summary = _check_run(out, tmp_path)
    assert 0 < summary["resumed_from_step"] < STEPS, summary["resumed_from_step"]  # its own log, then caught up
    reader = LogReader(out / "log.bin")
    _, records = reader.read()
    assert len(records) == STEPS
    (leave, join) = sorted(reader.changes.items())  # the evaluator is no member: only the client's
    node = CLIENT_RANK - 1
    assert leave[0] < join[0], reader.changes
    assert leave[1].leave == (node,) and join[1].join == ((node, 2),), reader.changes


@pytest.mark.timeout(1200)  # an outer bound: every wait is bounded by progress
def test_preflight_refuses_before_anything_runs(slurm, churn_entry, tmp_path: Path) -> None:
    """A strict config: churn.sh submits nothing (status 2, one line). An array that does not
    fit the run: every task ends with status 2 and says which --array to use."""
    env = sup.launcher_env(LOG_DIR=str(tmp_path))
    before = slurm.run(["squeue", "-h", "-o", "%i"]).stdout.split()
    r = slurm.run(
        ["bash", CHURN, "--time=5", str(sup.DEBUG_CONFIG), "--set", f"run.out_dir={tmp_path / 'strict'}"],
        env=env,
        cwd=sup.REPO,
        check=False,
        timeout=180,
    )
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert "churn.settle is 0" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert slurm.run(["squeue", "-h", "-o", "%i"]).stdout.split() == before

    r = slurm.run(
        [
            "sbatch",
            "--parsable",
            "--array=0-2",
            "--time=5",
            f"--output={tmp_path}/slurm-%x-%A_%a.out",
            "launch/slurm/churn.sbatch",
            str(sup.DEBUG_CONFIG),
            *sup.churn_sets(tmp_path / "misfit", STEPS),
        ],
        env=sup.launcher_env(SEEDFLOOD_STORE="127.0.0.1:1"),  # never reached: the preflight stops first
        cwd=sup.REPO,
    )
    array = r.stdout.strip().split(";")[0]
    states = slurm.wait_job(array, watch=[tmp_path])
    assert len(states) == 3 and all(s == ("FAILED", "2:0") for s in states.values()), f"{states}\n{_outputs(tmp_path)}"
    assert "submit with --array=0-4" in _outputs(tmp_path), _outputs(tmp_path)
    assert not (tmp_path / "misfit").exists()
