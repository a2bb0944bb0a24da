"""Bad input fails before training: one line on stderr, exit status 2, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEBUG = str(ROOT / "launch" / "configs" / "debug.yaml")


def seedflood(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.run(
        [sys.executable, "-m", "seedflood", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**base, "HF_HUB_OFFLINE": "1", **(env or {})},
    )


def one_error_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("seedflood: error: "), p.stderr
    return lines[0]


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.mark.parametrize(
    "sets, words",
    [
        (["task.name=nope"], "unknown task 'nope'"),
        (["model.name=/nonexistent/model"], "/nonexistent/model"),
        (["topology.kind=file", "topology.file=missing.yaml"], "missing.yaml"),
        (["zo.lr=fast"], "zo.lr: must be a number"),
        (["zo.lrr=1"], "unknown key 'zo.lrr'"),
    ],
)
def test_train_rejects_bad_input_before_training(sets, words, out):
    args = ["train", "--config", DEBUG, "--set", f"run.out_dir={out}"]
    for s in sets:
        args += ["--set", s]
    line = one_error_line(seedflood(*args))
    assert words in line
    assert not out.exists()


@pytest.mark.parametrize("command", ["train", "world-size", "simulate"])
def test_one_client_is_refused_in_one_line(command, out):
    """Issue 18: `--set topology.nodes=1` was accepted (a one-client "decentralized" run)."""
    p = seedflood(command, "--config", DEBUG, "--set", f"run.out_dir={out}", "--set", "topology.nodes=1")
    line = one_error_line(p)
    assert "topology.nodes: a decentralized run needs at least 2 clients, got 1" in line, line
    assert not out.exists()


def test_malformed_topology_file(tmp_path, out):
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: 4\nedges: [[0, 1], [1, 1], [2, 3]]\n")
    line = one_error_line(
        seedflood(
            "train",
            "--config",
            DEBUG,
            "--set",
            f"run.out_dir={out}",
            "--set",
            "topology.kind=file",
            "--set",
            f"topology.file={bad}",
        )
    )
    assert "self loop" in line
    assert not out.exists()


def test_wrong_world_size_in_a_single_process(out):
    line = one_error_line(
        seedflood(
            "train",
            "--config",
            DEBUG,
            "--set",
            f"run.out_dir={out}",
            env={"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
        )
    )
    assert "world size 3 does not match" in line


def test_world_size_and_topology_show():
    p = seedflood("world-size", "--config", DEBUG, "--set", "topology.nodes=6")
    assert p.returncode == 0 and p.stdout.strip() == "7"
    p = seedflood("topology", "show", "torus:8x16")
    assert p.returncode == 0 and "diameter" in p.stdout and "128" in p.stdout
    one_error_line(seedflood("topology", "show", "moebius:8"))


@pytest.mark.parametrize(
    "sets, answer",
    [
        (["topology.nodes=100000"], "fewer than the 100000 clients"),  # the data refuses it, in one line
        (["topology.nodes=100000", "task.train_examples=100000"], "100001"),
        (["topology.nodes=100000", "topology.kind=random_regular"], "did not settle within 100,000,000 edge visits"),
        (["topology.nodes=20000", "topology.kind=erdos_renyi"], "above the 10000 an erdos_renyi draw may have"),
    ],
    ids=["ring-data", "ring", "random_regular", "erdos_renyi"],
)
def test_world_size_answers_in_seconds_for_100000_nodes(sets, answer):
    """The preflight ran past 300 s at 100000 nodes (all-pairs shortest paths for the diameter):
    now it answers, or refuses the size with one line naming the limit, within seconds (the
    bound below leaves a loaded 2-core machine three times the ~10 s measured here)."""
    t = time.monotonic()
    p = seedflood("world-size", "--config", DEBUG, *[a for s in sets for a in ("--set", s)])
    took = time.monotonic() - t
    if answer.isdigit():
        assert p.returncode == 0 and p.stdout.strip() == answer, p.stderr
    else:
        assert answer in one_error_line(p)
    assert took < 40, took


def test_replay_of_a_missing_run(tmp_path):
    assert "not a run directory" in one_error_line(seedflood("replay", str(tmp_path)))


@pytest.mark.parametrize(
    "sets, words",
    [
        (["zo.lr=.inf"], "zo.lr: must be a finite number"),
        (["zo.eps=.inf"], "zo.eps: must be a finite number"),
        (["transport.timeout_s=.inf"], "transport.timeout_s: must be a finite number"),
        (["zo.lr=.nan"], "zo.lr: must be a finite number"),
        (["model.tiny={hidden_size: -5}"], "hidden_size"),
        (["task.train_examples=2"], "task.train_examples=2 is fewer than the 4 clients"),
        (["task.test_examples=0"], "test"),
        (["flood.hops_per_step=1", "flood.step_window=1"], "flood.step_window"),
    ],
)
def test_world_size_rejects_values_that_used_to_fail_mid_run(sets, words, out):
    """The launchers' preflight: one line, exit 2, nothing written (no run directory)."""
    args = ["world-size", "--config", DEBUG, "--set", f"run.out_dir={out}"]
    for s in sets:
        args += ["--set", s]
    line = one_error_line(seedflood(*args))
    assert words in line, line
    assert not out.exists()


def test_world_size_rejects_a_bad_data_file_and_duplicate_keys(tmp_path, out):
    data = tmp_path / "train.csv"
    data.write_text("sentence,label\ngood film,1\nbad film,maybe\n")
    line = one_error_line(
        seedflood(
            "world-size",
            "--config",
            DEBUG,
            "--set",
            f"run.out_dir={out}",
            "--set",
            "task.name=sst2",
            "--set",
            f"task.data_files={{train: {data}, test: {data}}}",
        )
    )
    assert "maybe" in line or "label" in line
    dup = tmp_path / "dup.yaml"
    dup.write_text(Path(DEBUG).read_text() + "zo: {lr: 2.0}\n")
    line = one_error_line(seedflood("world-size", "--config", str(dup)))
    assert "duplicate key 'zo'" in line
    assert not out.exists()


def test_torchrun_launcher_stops_bad_values_before_any_process(out):
    """launch/torchrun.sh runs the preflight first: one line, exit 2, torchrun never starts."""
    p = subprocess.run(
        ["launch/torchrun.sh", DEBUG, "--set", f"run.out_dir={out}", "--set", "zo.lr=.inf"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHON": sys.executable},
    )
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines == [lines[0]] and "zo.lr: must be a finite number" in lines[0], p.stderr
    assert "torch.distributed.run" not in p.stderr
    assert not out.exists()


def test_torchrun_launcher_finds_the_project_venv_without_python_on_path(out):
    """With PYTHON unset and no venv on PATH, launch/torchrun.sh runs the repository's .venv
    (before: the first `python` on PATH, i.e. 'No module named seedflood')."""
    venv = ROOT / ".venv" / "bin" / "python"
    if not venv.exists():
        pytest.skip("no .venv in this checkout (make install creates it)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV")}
    env.update(PATH="/usr/bin:/bin", HF_HUB_OFFLINE="1")
    p = subprocess.run(
        ["launch/torchrun.sh", DEBUG, "--set", f"run.out_dir={out}", "--set", "zo.eps=.inf"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    assert p.returncode == 2 and "zo.eps: must be a finite number" in p.stderr, p.stderr


EXIT_SCRIPT = """
import sys, threading, time
from datetime import timedelta
import torch.distributed as dist
from seedflood.cli import exit_process

store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))

def blocked():  # in a C++ call (GIL released) that returns 0.5 s from now
    try:
        store.wait(["never"], timedelta(seconds=0.5))
    except Exception:
        pass

threading.Thread(target=blocked, name="seedflood-blocked", daemon=True).start()

class Slow:  # keeps the interpreter finalizing while the call returns
    def __del__(self, sleep=time.sleep):  # a default: module globals may be gone by then
        sleep(1.5)

slow = Slow()
time.sleep(0.1)
print("report written", flush=True)
exit_process(3)
"""


def test_the_exit_status_survives_a_thread_left_in_a_torch_call():
    """A daemon thread whose torch.distributed call returns while the interpreter finalizes
    makes a plain exit abort (SIGABRT: "terminate called without an active exception", seen on
    a stopped churn client in CI); `exit_process` ends the process with its own status and
    output, without finalizing."""
    p = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert p.returncode == 3, (p.returncode, p.stderr[-2000:])
    assert p.stdout == "report written\n" and "terminate called" not in p.stderr
