"""Churn under SLURM, on the real single-machine cluster of slurm_cluster.py.

`launch/slurm/churn.sh` submits the run's store as its own job (store.sbatch) and one job array
with a task per process (churn.sbatch: task 0 the evaluator, task I client node I-1, --requeue).
`scontrol requeue` of one task mid-run ends its process; released at once (Slurm would hold it
~2 minutes), SLURM starts it again and it comes back as a new incarnation. One run, open to one
brand-new id (churn.max_nodes = 5), takes a join and two requeues in turn:
- `launch/slurm/join.sh STOREJOB 1` submits a second job (churn.sbatch, SEEDFLOOD_JOIN=1) whose
  task 4 is new node id 4: it knocks at the first job's store, is sponsored and joins by replay,
  and ends COMPLETED on the evaluator's hash with the founders;
- a client leaves, is sponsored by a neighbour, rejoins by replay; every task ends COMPLETED,
  the four clients on the evaluator's hash, the log holds one leave and one join of that node;
- then the evaluator resumes from its checkpoint and log and catches up from the attach node.
The store job ends by itself (COMPLETED) once the array and the join job are done. Preflight
failures (a strict config, an array that does not fit the run, new ids the run is not open to)
end with status 2 before anything connects.
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
JOIN = "launch/slurm/join.sh"
STEPS = 400  # with PACE, 2-7 steps/s: all three done by step ~130 (seen at 2 steps/s on a loaded machine)
PACE = "run.step_delay_s=0.1"  # the requeues need wall time, not steps: a sleep per step costs no CPU
PROGRESS = re.compile(r"seedflood:\s+\d+%\|")  # the evaluator's progress bar (tqdm)
CLIENT_RANK = 3  # client node 2, not the attach node (node 0): the launcher's case, nothing more
NEW = 4  # the brand-new id: churn.max_nodes = 5 opens id 4 only


def _outputs(tmp_path: Path) -> str:
    """The jobs' outputs for assertion messages: the last lines of each, without progress bars."""
    parts = []
    for p in sorted(tmp_path.glob("slurm-*.out")):
        lines = [x for x in sup.tail(p, 10**6).splitlines() if x.strip() and not PROGRESS.match(x)]
        parts.append(f"== {p.name}\n" + "\n".join(lines[-25:]))
    return "\n".join(parts)


def _submit(slurm, tmp_path: Path, *sets: str, store_port: int = 0) -> tuple[str, str]:
    """churn.sh as a user runs it; returns (store job, array job)."""
    port = str(store_port or sup.free_port())
    env = sup.launcher_env(LOG_DIR=str(tmp_path), STORE_PORT=port, STORE_POLL_S="1")
    r = slurm.run(["bash", CHURN, "--time=10", str(sup.DEBUG_CONFIG), *sets], env=env, cwd=sup.REPO, timeout=180)
    ids = dict(line.split("=", 1) for line in r.stdout.split())
    return ids["store"], ids["array"]


def _join(slurm, tmp_path: Path, store: str, count: int, *sets: str, check: bool = True, **env: str):
    """join.sh as a user runs it against the run of store job `store`, with the run's own settings."""
    env = sup.launcher_env(LOG_DIR=str(tmp_path), **env)
    argv = ["bash", JOIN, "--time=10", store, str(count), str(sup.DEBUG_CONFIG), *sets]
    return slurm.run(argv, env=env, cwd=sup.REPO, timeout=180, check=check)


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


def _wait_all(slurm, store: str, array: str, join: str, tmp_path: Path) -> None:
    """Every array task, the join job's task and then the store job end COMPLETED with status 0."""
    states = slurm.wait_job(array, watch=[tmp_path, tmp_path / "run" / "log.bin"])
    assert len(states) == 5 and all(s == ("COMPLETED", "0:0") for s in states.values()), (
        f"{states}\n{_outputs(tmp_path)}\n{slurm.logs()}"
    )
    assert slurm.wait_job(join, watch=[tmp_path]) == {f"{join}_{NEW}": ("COMPLETED", "0:0")}, (
        f"{_outputs(tmp_path)}\n{slurm.logs()}"
    )
    assert slurm.wait_job(store, watch=[tmp_path]) == {store: ("COMPLETED", "0:0")}, (
        f"{_outputs(tmp_path)}\n{slurm.logs()}"
    )


def _check_run(out: Path, tmp_path: Path) -> dict:
    """The evaluator's summary: nobody left, every client (the newcomer too) on its hash; the log
    replays to it."""
    return sup.check_churn_run(out, STEPS, _outputs(tmp_path), clients=NEW + 1)


@pytest.fixture
def churn_entry(entry: str) -> str:
    if entry != "seedflood":
        pytest.skip("churn needs the real `seedflood train` (the probe has no churn)")
    return entry


@pytest.mark.timeout(1800)  # an outer bound: every wait is bounded by progress
def test_a_new_id_joins_then_a_requeued_client_rejoins_then_a_requeued_evaluator_resumes_and_catches_up(
    slurm, churn_entry, tmp_path: Path
) -> None:
    """One run, a join and two requeues in turn (one launched run instead of three: CI time): a
    second job adds node 4; once it has joined, a client is requeued; once that one has rejoined,
    the evaluator."""
    out = tmp_path / "run"
    # A user's checkpoint.resume=false too: churn.sbatch forces resume, or the restart would refuse the run dir.
    sets = sup.churn_sets(
        out, STEPS, PACE, "checkpoint.every=100", "checkpoint.resume=false", f"churn.max_nodes={NEW + 1}"
    )
    port = sup.free_port()
    store, array = _submit(slurm, tmp_path, *sets, store_port=port)
    victim_out = tmp_path / f"slurm-seedflood-churn-{array}_{CLIENT_RANK}.out"

    def victim() -> str:
        return victim_out.read_text(errors="replace") if victim_out.exists() else ""

    join = ""
    try:
        slurm.until(lambda: _logged_steps(out) >= 5, "the run to start", lambda: harness.size(tmp_path))
        # an id beyond churn.max_nodes: refused in one line, nothing submitted
        refused = _join(slurm, tmp_path, store, 2, *sets, check=False, STORE_PORT=str(port))
        assert refused.returncode == 2 and refused.stdout == "", refused.stdout + refused.stderr
        assert "new ids 4..5 do not fit the run: it takes ids 4..4" in refused.stderr, refused.stderr
        r = _join(slurm, tmp_path, store, 1, *sets, STORE_PORT=str(port))  # the port churn.sh was given
        join = dict(line.split("=", 1) for line in r.stdout.split())["join"]
        newcomer_out = tmp_path / f"slurm-seedflood-join-{join}_{NEW}.out"
        slurm.until(
            lambda: newcomer_out.exists() and "joined by replaying" in newcomer_out.read_text(errors="replace"),
            f"node {NEW} to join",
            lambda: (harness.size(newcomer_out), harness.size(out / "log.bin")),
        )
        _requeue_mid_run(slurm, array, CLIENT_RANK, out, _logged_steps(out) + 20, tmp_path)
        slurm.until(
            lambda: "rejoined by replaying" in victim(),
            f"task {CLIENT_RANK} to rejoin",
            lambda: (harness.size(victim_out), harness.size(out / "log.bin")),
        )
        # the evaluator resumes from a checkpoint: requeue it once one is on disk (checkpoint.every=100;
        # on a loaded machine the rejoin can be over before step 100: seen at 2 steps/s)
        slurm.until(
            lambda: any((out / "checkpoints").glob("step_*/meta.json")),
            "the evaluator's first checkpoint",
            lambda: harness.size(out / "log.bin"),
        )
        _requeue_mid_run(slurm, array, 0, out, _logged_steps(out) + 20, tmp_path)
        _wait_all(slurm, store, array, join, tmp_path)
    finally:
        slurm.run(["scancel", store, array, *([join] if join else [])], check=False)
    said = newcomer_out.read_text(errors="replace")
    assert f"new node id {NEW} joining the run of 4 founding clients" in said, said[-4000:]
    assert f"node {NEW}: a new node id: knocked at the run's store" in said, said[-4000:]
    assert "attempt 1" in victim() and "rejoined by replaying" in victim(), _outputs(tmp_path)
    evaluator = (tmp_path / f"slurm-seedflood-churn-{array}_0.out").read_text(errors="replace")
    assert "attempt 1" in evaluator, _outputs(tmp_path)
    summary = _check_run(out, tmp_path)
    assert 0 < summary["resumed_from_step"] < STEPS, summary["resumed_from_step"]  # its own log, then caught up
    reader = LogReader(out / "log.bin")
    _, records = reader.read()
    assert len(records) == STEPS
    (joined, leave, rejoin) = sorted(reader.changes.items())  # the evaluator is no member: only clients'
    node = CLIENT_RANK - 1
    assert joined[0] < leave[0] < rejoin[0], reader.changes
    assert joined[1].join == ((NEW, 1),) and joined[1].leave == (), reader.changes
    assert leave[1].leave == (node,) and rejoin[1].join == ((node, 2),), reader.changes
    origins = [{m.origin for m in msgs} for _, msgs in records]
    assert [NEW in o for o in origins] == [s >= joined[0] for s in range(STEPS)]  # counted from its join step


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
