"""A launched tiny-model process imports what its role needs and no more, and sizes its thread
pools before torch loads: 2 clients on a ring + the evaluator, each a fresh interpreter (not a fork
of the harness's preloaded server, whose modules a child would inherit).

Each process runs `seedflood train` under `python -c` with an atexit hook that prints, last on
stdout, the top-level packages in sys.modules and the thread variables as torch saw them.
Controls: an eager `import transformers` in a module every process loads (ml/tinyllama.py, say)
fails the first assertion; dropping cli/runs.py's `_threads_before_torch` leaves the harness's
OMP_NUM_THREADS=7 below and fails the second.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]
DEBUG = str(ROOT / "launch" / "configs" / "debug.yaml")
HOOK = """
import atexit, json, os, sys
def report():
    import torch
    top = sorted({m.split(".")[0] for m in sys.modules})
    print(json.dumps({"packages": top, "env": {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}, "threads": torch.get_num_threads()}))
atexit.register(report)
from seedflood.cli import console
console()
"""
NOT_FOR_TINY = {"transformers", "datasets", "peft", "accelerate", "pandas", "matplotlib", "sklearn", "scipy"}


@pytest.mark.timeout(600)
def test_a_tiny_model_process_imports_no_transformers_and_sets_threads_before_torch(run_world, procs_ok, tmp_path):
    out = tmp_path / "run"
    sets = ["topology.nodes=2", "run.steps=1", "run.threads=0", "eval.every=1", "checkpoint.every=0"]
    argv = [sys.executable, "-c", HOOK, "train", "--config", DEBUG]
    argv += [a for o in [*sets, f"run.out_dir={out}"] for a in ("--set", o)]
    # 7 threads asked for by the environment; run.threads = 0 over 3 local processes on this
    # machine's cores says max(1, cpus // 3): what the process must have set before torch loaded.
    procs = run_world(argv, 3, env={"OMP_NUM_THREADS": "7", "MKL_NUM_THREADS": "7"}, watch=[out / "log.bin"])
    procs_ok(procs)
    from seedflood.ml import machine

    want = str(machine.threads_for(0, 3))
    for p in procs:
        got = p.last_json()
        assert not NOT_FOR_TINY & set(got["packages"]), (p.name, sorted(NOT_FOR_TINY & set(got["packages"])))
        assert got["env"] == {"OMP_NUM_THREADS": want, "MKL_NUM_THREADS": want}, p.name
        assert got["threads"] == int(want), p.name
