"""The launchers' preflight (`seedflood world-size`, the full `preflight`) never imports torch when
model.device is cpu: every launcher runs it before starting anything and CI runs it ~40 times,
and torch alone costs 2-4 s of CPU per call. Refusals keep their one line; a cuda device still
asks torch how many GPUs there are.

The probe is `python -X importtime`: one stderr line per module imported, so a module that is
absent from those lines was never imported by the process (lazy imports included)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from seedflood import cli

ROOT = Path(__file__).resolve().parents[3]
DEBUG = str(ROOT / "launch" / "configs" / "debug.yaml")


def seedflood(*args: str) -> tuple[subprocess.CompletedProcess, set[str], list[str]]:
    """Run `python -X importtime -m seedflood ARGS`; the process, the modules it imported, and
    its stderr lines that are not importtime lines."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    p = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "seedflood", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**env, "HF_HUB_OFFLINE": "1"},
    )
    lines = p.stderr.splitlines()
    # "import time: <self us> | <cumulative us> | <indent><module>"
    modules = {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}
    return p, modules, [line for line in lines if not line.startswith("import time:") and line.strip()]


def loaded(modules: set[str], package: str) -> bool:
    return any(m == package or m.startswith(package + ".") for m in modules)


def world_size(*sets: str) -> tuple[subprocess.CompletedProcess, set[str], list[str]]:
    return seedflood("world-size", "--config", DEBUG, *[a for s in sets for a in ("--set", s)])


def test_world_size_of_the_debug_config_imports_no_torch():
    p, modules, errors = world_size()
    assert (p.returncode, p.stdout.strip(), errors) == (0, "5", []), p.stderr[-2000:]
    # the probe saw the full preflight: the data, the model check, the ε floor, the run directory
    for module in ("seedflood.ml.sampling", "seedflood.ml.modelcheck", "seedflood.core.zo.precision"):
        assert module in modules, module
    assert "seedflood.rundir.resume" in modules
    assert not loaded(modules, "torch"), sorted(m for m in modules if m.startswith("torch"))[:5]
    assert not loaded(modules, "transformers")


@pytest.mark.parametrize(
    "sets, words",
    [
        (["model.name=/nonexistent/model"], "model path /nonexistent/model does not exist"),
        (["model.tiny={hidden_size: 66}"], "model.tiny.hidden_size (66) must be divisible"),
        (
            ["zo.direction=subcge", "model.dtype=bfloat16"],
            "zo.eps=0.001 is too small for zo.direction=subcge in model.dtype=bfloat16",
        ),
        (["topology.nodes=300"], "task.train_examples=256 is fewer than the 300 clients"),
    ],
    ids=["model-path", "tiny-shape", "eps-floor", "data"],
)
def test_refusals_after_the_config_check_are_one_line_without_torch(sets, words):
    """Errors of the model, precision and data checks: exit 2, one line (each error class is
    found under the module that defines it), and still no torch."""
    p, modules, errors = world_size(*sets)
    assert p.returncode == 2, p.stderr[-2000:]
    assert len(errors) == 1 and errors[0].startswith("seedflood: error: ") and words in errors[0], errors
    assert not loaded(modules, "torch")


def test_a_signed_run_and_an_existing_run_directory_stay_torch_free(tmp_path, monkeypatch):
    """trust.sign reads the roster (cryptography, not torch); a run directory to resume is checked
    (log, checkpoints) without torch, and a corrupt checkpoint is a warning, not a failure. The
    keys and the run directory are made in this process (what is probed is `world-size`, each
    call a fresh process): `seedflood keys` and `seedflood simulate` as the subprocesses ran them."""
    keys, run = tmp_path / "keys", tmp_path / "run"
    monkeypatch.chdir(ROOT)  # where the subprocesses run
    assert cli.main(["keys", "--nodes", "4", "--out", str(keys)]) == 0
    p, modules, errors = world_size("trust.sign=true", f"trust.keys={keys}")
    assert (p.returncode, p.stdout.strip(), errors) == (0, "5", []), p.stderr[-2000:]
    assert "seedflood.comm.identity" in modules and not loaded(modules, "torch")

    sets = (f"run.out_dir={run}", "run.steps=3")
    assert cli.main(["simulate", "--config", DEBUG, *[a for s in sets for a in ("--set", s)]]) == 0
    assert (run / "log.bin").is_file()
    (state,) = run.glob("checkpoints/step_*/state.pt")
    state.write_bytes(state.read_bytes() + b"x")  # its checksum no longer matches
    p, modules, errors = world_size(*sets)
    assert (p.returncode, p.stdout.strip()) == (0, "5"), p.stderr[-2000:]
    assert len(errors) == 1 and "skipping corrupt checkpoint step_000003" in errors[0], errors
    assert not loaded(modules, "torch")


def test_a_cuda_device_still_asks_torch_for_its_gpus():
    """model.device=cuda legitimately needs torch.cuda: the answer is the world size on a GPU
    machine and the one-line CUDA error without one."""
    p, modules, errors = world_size("model.device=cuda")
    assert loaded(modules, "torch")
    if p.returncode == 0:  # stderr: the GPU plan of this machine's GPUs
        assert p.stdout.strip() == "5" and errors[0].startswith("seedflood: GPU plan: 5 processes on 1 host of ")
    else:
        assert p.returncode == 2 and errors == ["seedflood: error: model.device is cuda but CUDA is not available"]


def test_a_gpu_plan_for_a_given_count_stays_torch_free():
    """`--gpus N` plans for N GPUs without asking torch: stdout is still the process count alone
    (what the launchers read), the plan is on stderr; a placement that cannot be is one line."""
    p, modules, errors = seedflood(
        "world-size", "--config", DEBUG, "--gpus", "4", "--set", "model.device=cuda", "--set", "eval.device=own"
    )
    assert (p.returncode, p.stdout.strip()) == (0, "5"), p.stderr[-2000:]
    assert errors[:2] == [
        "seedflood: GPU plan: 5 processes on 1 host of 4 GPUs (client n is rank n+1)",
        "seedflood:   cuda:0: evaluator",
    ]
    assert not loaded(modules, "torch")
    p, modules, errors = seedflood("world-size", "--config", DEBUG, "--gpus", "4")  # model.device=cpu
    assert (p.returncode, p.stdout.strip()) == (0, "5") and errors[1:] == ["seedflood:   cpu: evaluator, clients 0-3"]
    for args, words in (
        (
            ["--gpus", "1", "--set", "model.device=cuda", "--set", "eval.device=own"],
            "eval.device=own needs at least 2 GPUs, 1 visible",
        ),
        (["--gpus", "-1"], "--gpus must be >= 0, got -1"),
        (["--gpus", "2", "--hosts", "9"], "5 processes cannot fill 9 hosts"),
    ):
        p, modules, errors = seedflood("world-size", "--config", DEBUG, *args)
        assert (p.returncode, errors) == (2, [f"seedflood: error: {words}"]), p.stderr[-2000:]
        assert not loaded(modules, "torch")
