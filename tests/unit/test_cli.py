"""Bad input fails before training: one line on stderr, exit status 2, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEBUG = str(ROOT / "launch" / "configs" / "debug.yaml")


def seedflood(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.run([sys.executable, "-m", "seedflood", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**base, "HF_HUB_OFFLINE": "1", **(env or {})})


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


def test_malformed_topology_file(tmp_path, out):
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: 4\nedges: [[0, 1], [1, 1], [2, 3]]\n")
    line = one_error_line(seedflood("train", "--config", DEBUG, "--set", f"run.out_dir={out}",
                                    "--set", "topology.kind=file", "--set", f"topology.file={bad}"))
    assert "self loop" in line
    assert not out.exists()


def test_wrong_world_size_in_a_single_process(out):
    line = one_error_line(seedflood("train", "--config", DEBUG, "--set", f"run.out_dir={out}",
                                    env={"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
                                         "MASTER_PORT": "1"}))
    assert "world size 3 does not match" in line


def test_world_size_and_topology_show():
    p = seedflood("world-size", "--config", DEBUG, "--set", "topology.nodes=6")
    assert p.returncode == 0 and p.stdout.strip() == "7"
    p = seedflood("topology", "show", "torus:8x16")
    assert p.returncode == 0 and "diameter" in p.stdout and "128" in p.stdout
    one_error_line(seedflood("topology", "show", "moebius:8"))


def test_replay_of_a_missing_run(tmp_path):
    assert "not a run directory" in one_error_line(seedflood("replay", str(tmp_path)))
