"""A launched churn run's health reaches TensorBoard and a tracker (core/churn/health.py, the
clients' status records, rundir/health.py, the evaluator's `report_health`).

1 evaluator + 4 clients over gloo, `churn.settle: 1`; node 2 is SIGKILLed after a few steps. The
survivors' commit latency (hops), ballots per step, the dropped edges of the killed node and the
committed exclusion are read back from the run's event files (tb/) and, when the trackers extra
is installed, from MLflow's file store. metrics.jsonl holds none of it. The control: the same
readers over a strict run (no churn) find no health at all.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

import runs
from procs import Procs

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "rundir"))
from test_metrics import read_events  # noqa: E402  (TensorBoard's record framing, read as it does)

pytestmark = [pytest.mark.dist, pytest.mark.timeout(900)]
WORLD = 5
VICTIM = 2
STEPS = 30


def health_of(events: dict[str, list[tuple[int, float]]]) -> dict[str, list[tuple[int, float]]]:
    return {tag[len("health/") :]: pts for tag, pts in events.items() if tag.startswith("health/")}


def test_a_churn_runs_health_reaches_tensorboard_and_a_tracker(run_world, tmp_path: Path) -> None:
    out = tmp_path / "health"
    trackers = "[mlflow]" if _has("mlflow") else "[]"
    sets = runs.churn(out, STEPS, "run.step_delay_s=0.1", f"eval.trackers={trackers}")
    logged = runs.Steps(out, node=VICTIM)
    hit: list[bool] = []
    rank = str(VICTIM + 1)

    def strike(group: Procs) -> None:
        if not hit and logged() >= 3:
            group.signal(rank, signal.SIGKILL)
            hit.append(True)

    procs = run_world(runs.train(*sets), nprocs=WORLD, on_poll=strike, watch=[out / "log.bin"])
    assert hit, "the fault must land mid-run"
    for i, p in enumerate(procs):
        assert p.returncode == (-signal.SIGKILL if i == VICTIM + 1 else 0), p.describe()
    health = health_of(read_events(out / "tb"))
    assert {"commit_hops", "ballots_per_step", "drops", "heals", "joins", "exclusions", "clients"} <= set(health)
    last = {tag: pts[-1] for tag, pts in health.items()}
    assert last["exclusions"] == (STEPS - 1, 1.0) and last["joins"] == (STEPS - 1, 0.0)
    assert last["drops"][1] >= 2  # node 2's two ring neighbours lost it (each end counts)
    assert all(v > 0 for _, v in health["commit_hops"]) and all(v >= 1 for _, v in health["ballots_per_step"])
    assert [s for s, _ in health["exclusions"]] == sorted(s for s, _ in health["exclusions"])  # against steps
    assert b"health" not in (out / "metrics.jsonl").read_bytes()  # timing: never in the run's record
    if trackers == "[]":
        pytest.skip("health reached TensorBoard; the trackers extra is not installed for the tracker half")
    from seedflood.rundir.mlflowtracker import client_of

    client = client_of(out)
    run_id = (out / "trackers" / "mlflow.id").read_text().strip()
    for tag in ("health/exclusions", "health/commit_hops", "health/drops"):
        got = [(m.step, m.value) for m in client.get_metric_history(run_id, tag)]
        assert sorted(got) == sorted(health[tag.split("/")[1]]), tag
    summary = json.loads((out / "summary.json").read_text())
    assert client.get_run(run_id).data.tags["param_hash"] == summary["param_hash"]


def test_a_strict_run_writes_no_health(run_world, procs_ok, tmp_path: Path) -> None:
    """The control: the same readers over a strict run find the scores and no health."""
    out = tmp_path / "strict"
    procs = run_world(runs.train(f"run.out_dir={out}", "run.steps=4"), nprocs=WORLD, watch=[out / "log.bin"])
    procs_ok(procs)
    events = read_events(out / "tb")
    assert "accuracy" in events and health_of(events) == {}


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
