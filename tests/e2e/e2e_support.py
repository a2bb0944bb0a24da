"""Helpers for the e2e tests: which program the launchers start, their environment, run checks.

Processes are started, waited on (by progress) and killed by the one harness, tests/procs.py;
the run settings and shared checks are tests/runs.py's.

The launchers run `python -m $SEEDFLOOD_MODULE train ...`. The tests target the real
`seedflood` by default; SEEDFLOOD_E2E_ENTRY=probe swaps in tests/e2e/gloo_probe.py (a stand-in
that honours the same contract), which is how the infrastructure is checked without the runtime:
    SEEDFLOOD_E2E_ENTRY=probe .venv/bin/python -m pytest -q tests/e2e
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import procs as harness
import runs
from seedflood.bench import common

REPO = harness.REPO
E2E_DIR = Path(__file__).resolve().parent
DEBUG_CONFIG = runs.DEBUG
free_port = harness.free_port
replay = runs.replay
read_summary = runs.summary
check_churn_run = runs.check_churn_run
ENTRY = os.environ.get("SEEDFLOOD_E2E_ENTRY", "seedflood")
MODULE = "gloo_probe" if ENTRY == "probe" else "seedflood"
# Every e2e run: fail fast instead of hanging on a dead peer. Bits do not depend on this.
COMMON_SETS = ("transport.timeout_s=60",)


def launcher_env(**extra: str) -> dict[str, str]:
    """Environment for a launcher: this venv first on PATH, the entry module, quiet threads."""
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["PYTHON"] = sys.executable
    env["SEEDFLOOD_MODULE"] = MODULE
    env["HF_HUB_OFFLINE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    if MODULE == "gloo_probe":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(E2E_DIR), env.get("PYTHONPATH", "")) if p)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID"):
        env.pop(key, None)  # never inherit another launcher's world
    env.update(extra)
    return env


def entry_unavailable() -> str | None:
    """Why the entry module cannot run the e2e tests, or None when it can."""
    if MODULE == "gloo_probe":
        return None
    try:
        r = subprocess.run(
            [sys.executable, "-m", MODULE, "world-size", "--config", str(DEBUG_CONFIG)],
            capture_output=True,
            text=True,
            timeout=120,
            env=launcher_env(),
            cwd=REPO,
        )
    except subprocess.TimeoutExpired:
        return "`seedflood world-size` timed out"
    if r.returncode != 0 or r.stdout.strip() != "5":
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return (
            f"`python -m seedflood world-size` is not available yet ({tail}); "
            "SEEDFLOOD_E2E_ENTRY=probe runs these tests with the stand-in"
        )
    return None


def sets(*overrides: str) -> list[str]:
    """`--set` arguments for the common settings plus `overrides`."""
    return harness.sets(*COMMON_SETS, *overrides)


def churn_sets(out_dir: Path, steps: int, *overrides: str) -> list[str]:
    """`--set` arguments of a churn e2e run (runs.churn: settle 1, a 3 s hop timeout, no scoring
    or checkpoints unless `overrides` ask)."""
    return harness.sets(*runs.churn(out_dir, steps, *overrides))


def netns_unavailable(tools: Sequence[str] = ("ip", "nft")) -> str | None:
    """Why this host cannot make network namespaces with `tools` (None: it can)."""
    return common.netns_unavailable(tools, "iproute2, nftables; run .ci/setup-e2e.sh")


def final_metrics(out_dir: Path) -> dict[str, Any]:
    lines = [json.loads(x) for x in (Path(out_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    finals = [rec for rec in lines if rec.get("final") is True]
    assert finals, f"no final metrics line in {out_dir}/metrics.jsonl"
    return finals[-1]


def check_run(out_dir: Path, clients: int = 4) -> dict[str, Any]:
    """A finished run: every client's hash equals the evaluator's; returns summary.json."""
    summary = read_summary(out_dir)
    hashes = summary["client_hashes"]
    assert len(hashes) == clients, f"{len(hashes)} client hashes, expected {clients}"
    assert set(hashes) == {summary["param_hash"]}, f"clients disagree: {hashes} vs {summary['param_hash']}"
    final = final_metrics(out_dir)
    assert final.get("param_hash", summary["param_hash"]) == summary["param_hash"]
    ckpt = Path(out_dir) / "checkpoints"
    assert ckpt.is_dir() and any(ckpt.iterdir()), f"no checkpoint in {ckpt}"
    assert (Path(out_dir) / "log.bin").is_file()
    return summary


def simulated_hash(*overrides: str) -> str:
    """The debug config's final parameter hash (with `overrides`) from the single-process
    reference, one thread: every launched run of it ends on these bits (tests/dist/test_train_gloo.py
    checks launched runs against it), so a test that only compares hashes pays for no launched run."""
    import torch

    from seedflood.core.config import runconfig
    from seedflood.roles.inprocess import simulate

    torch.set_num_threads(1)
    cfg = runconfig.load(str(DEBUG_CONFIG), [*overrides, "run.out_dir=/nonexistent"])
    (expected,) = set(simulate(cfg, hash_every_step=False).hashes.values())
    return str(expected)


def procs(tmp: Path) -> harness.Procs:
    """The harness for launcher processes: SIGTERM first (10 s), so a launcher ends its own
    workers, then SIGKILL of every group."""
    return harness.Procs(tmp, term_grace_s=10)


def tail(path: Path, n: int = 60) -> str:
    """The last n lines of a log, without gloo's connection-retry noise."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return f"(no {path})"
    return "\n".join([line for line in lines if "debug_logger" not in line][-n:])


def run_checked(argv: Sequence[str], *, env: Mapping[str, str], log: Path, cwd: Path = REPO, **wait: Any) -> None:
    """Run to completion in its own session, bounded by progress (its log's growth and any
    `watch`ed file: tests/procs.py), killed whole on the way out; assert exit status 0."""
    watch = wait.pop("watch", ())
    with procs(Path(tempfile.mkdtemp(prefix="run-", dir=log.parent))) as group:
        group.watch(*watch)
        group.start("run", argv, env=env, log=log, cwd=cwd)
        (code,) = group.wait(**wait)
    assert code == 0, f"{' '.join(map(str, argv))} exited {code}:\n{tail(log)}"
