"""SLURM as a user runs it, on a real single-machine cluster faking 2 nodes (slurm_cluster.py).

- `sbatch launch/slurm/run.sbatch` runs the debug config across both nodes (one torchrun agent
  per node, c10d rendezvous) and every client ends with the loopback run's hash.
- `sbatch --array=0-3 launch/slurm/sweep.sbatch` runs a 4-point sweep; the summary has 4 rows.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import e2e_support as sup
from seedflood.experiments import sweep

pytestmark = pytest.mark.e2e


def _outputs(tmp_path: Path) -> str:
    return "\n".join(f"== {p.name}\n{sup.tail(p)}" for p in sorted(tmp_path.glob("slurm-*.out")))


@pytest.mark.timeout(1200)  # outer bounds: every wait is bounded by progress (slurm_cluster.wait_job)
def test_run_sbatch_two_nodes(slurm, reference_hash: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = slurm.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=2",
            "--time=5",
            f"--output={tmp_path}/slurm-%j.out",
            "launch/slurm/run.sbatch",
            str(sup.DEBUG_CONFIG),
            *sup.sets(f"run.out_dir={out}"),
        ],
        env=sup.launcher_env(),
        cwd=sup.REPO,
    )
    job = r.stdout.strip().split(";")[0]
    states = slurm.wait_job(job, watch=[tmp_path, out / "log.bin"])
    assert states == {job: ("COMPLETED", "0:0")}, f"{states}\n{_outputs(tmp_path)}\n{slurm.logs()}"
    text = "".join(p.read_text(errors="replace") for p in tmp_path.glob("slurm-*.out"))
    assert "--nnodes=2" in text and "--nproc-per-node=3" in text and "--nproc-per-node=2" in text, _outputs(tmp_path)
    summary = sup.check_run(out)
    assert summary["param_hash"] == reference_hash


@pytest.mark.timeout(1800)
def test_sweep_array_and_summary(slurm, entry: str, tmp_path: Path) -> None:
    sweep_file = sup.REPO / "launch" / "sweeps" / "debug.yaml"
    runs = tmp_path / "runs"
    n = len(sweep.load(sweep_file))
    assert n == 4
    r = slurm.run(
        [
            "sbatch",
            "--parsable",
            f"--array=0-{n - 1}",
            "--time=5",
            f"--output={tmp_path}/slurm-%A_%a.out",
            "launch/slurm/sweep.sbatch",
            str(sweep_file),
            "--out-root",
            str(runs),
            *sup.sets(),
        ],
        env=sup.launcher_env(),
        cwd=sup.REPO,
    )
    job = r.stdout.strip().split(";")[0]
    logs = [r.out_dir / "log.bin" for r in sweep.expand(sweep.load(sweep_file, out_root=runs))]
    states = slurm.wait_job(job, watch=[tmp_path, *logs])
    assert len(states) == n and all(s == ("COMPLETED", "0:0") for s in states.values()), (
        f"{states}\n{_outputs(tmp_path)}"
    )
    # The summary command, as a user types it.
    res = subprocess.run(
        [sys.executable, "-m", entry, "sweep-summary", str(sweep_file), "--out-root", str(runs), "--format", "tsv"],
        capture_output=True,
        text=True,
        env=sup.launcher_env(),
        cwd=sup.REPO,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    header, *rows = [line.split("\t") for line in res.stdout.strip().splitlines()]
    assert len(rows) == n, res.stdout
    col = {name: i for i, name in enumerate(header)}
    assert [row[col["status"]] for row in rows] == ["done"] * n, res.stdout
    assert [row[col["consensus"]] for row in rows] == ["yes"] * n, res.stdout
    for run in sweep.expand(sweep.load(sweep_file, out_root=runs)):
        sup.check_run(run.out_dir)
