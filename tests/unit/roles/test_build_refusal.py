"""train._resume's check of a process that is not rank 0 (a client at start, a restart rejoining, a
new id joining: each takes rank 0's broadcast) against the run's build that rank 0 broadcasts.

Another build is refused with one RunError line naming both (the CLI prints it and exits 2); the
same build, and a broadcast without a build, go on. Rank 0's own check is
tests/dist/test_train_gloo.py's (a launched resume at 2 threads) and tests/unit/rundir/test_build.py's.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import runs
from seedflood.core.config import runconfig as config
from seedflood.core.flood.protocol import Protocol
from seedflood.core.topology.resolve import topology_of
from seedflood.roles import train
from seedflood.rundir import build

torch.set_num_threads(1)


def resume_as_a_client(tmp_path, run_build: dict | None):
    cfg = config.load(runs.DEBUG, [f"run.out_dir={tmp_path}"])
    mine = build.current(cfg.model.device, cfg.model.dtype)
    process = SimpleNamespace(cfg=cfg, protocol=Protocol.of(cfg, topology_of(cfg).diameter), workload=None, build=mine)
    payload = {"records": [], **({"build": run_build} if run_build is not None else {})}
    group = SimpleNamespace(world=SimpleNamespace(is_evaluator=False), broadcast=lambda _: payload)
    return train._resume(process, None, group), mine


def test_a_process_on_the_runs_build_goes_on(tmp_path):
    mine = build.current("cpu", "float32")
    assert resume_as_a_client(tmp_path, mine)[0] == ([], {})
    assert resume_as_a_client(tmp_path, None)[0] == ([], {})  # a rank 0 that broadcast no build


def test_a_process_on_another_build_is_refused_naming_both(tmp_path):
    run_build = {**build.current("cpu", "float32"), "torch": "2.12.0+cpu", "cpu_capability": "ZVECTOR"}
    with pytest.raises(train.RunError) as e:
        resume_as_a_client(tmp_path, run_build)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{tmp_path} was made by another build: seedflood ")
    assert "torch 2.12.0+cpu" in line and f"torch {torch.__version__}" in line
    assert "differs: torch (2.12.0+cpu -> " in line and "cpu_capability (ZVECTOR -> " in line
