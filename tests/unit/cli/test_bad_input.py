"""Bad input that once failed badly, as a user meets it through the real `seedflood` command: a
port another process holds (store, serve-log, a launched rank 0), a run.out_dir that is a file,
a key file that is not its node's (trust.sign), an empty or unparsable YAML file. Each is one
line on stderr, exit status 2, no traceback, and the directory the command ran in is as it was
(nothing half-created). Each has a control that shows the same command does not refuse
everything: the good input passes the same check."""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from seedflood.comm import identity

ROOT = Path(__file__).resolve().parents[3]
DEBUG = str(ROOT / "launch" / "configs" / "debug.yaml")
WORLD = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "SEEDFLOOD_STORE", "SEEDFLOOD_NODE")


def environment(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in WORLD and not k.startswith("TORCHELASTIC")}
    return {**base, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **extra}


def seedflood(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`python -m seedflood ARGS` run in `cwd` (relative paths land there), bounded in time."""
    return subprocess.run(
        [sys.executable, "-m", "seedflood", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
        env=environment(**env),
    )


def one_error_line(p: subprocess.CompletedProcess) -> str:
    """The refusal: exit status 2 and one line on stderr (so no traceback, no log lines)."""
    assert p.returncode == 2, (p.returncode, p.stderr[-3000:])
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("seedflood: error: "), p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    return lines[0]


def listing(root: Path) -> list[tuple[str, int]]:
    """Every path under `root` with its size (directories 0): what a refusal must leave as it was."""
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else 0) for p in root.rglob("*"))


@pytest.fixture
def here(tmp_path: Path) -> Path:
    """The directory each command runs in, holding a plain file `afile`."""
    (tmp_path / "afile").write_text("not a directory\n")
    return tmp_path


@pytest.fixture
def held_port() -> Iterator[int]:
    """A TCP port another process (this one) listens on, on every address, for the test's length."""
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        yield s.getsockname()[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(*sets: str) -> list[str]:
    return ["--config", DEBUG, *[a for s in sets for a in ("--set", s)]]


# --- a port another process holds --------------------------------------------------------------

SERVERS = {
    "store": lambda port: ["store", "--host", "127.0.0.1", "--port", str(port)],
    "serve-log": lambda port: ["serve-log", "run", "--host", "127.0.0.1", "--port", str(port)],
}


@pytest.mark.parametrize("command", list(SERVERS))
def test_a_port_in_use_is_refused_in_one_line_naming_it(here, held_port, command):
    before = listing(here)
    line = one_error_line(seedflood(here, *SERVERS[command](held_port)))
    assert f"cannot listen on 127.0.0.1:{held_port}: address already in use" in line, line
    assert f"another process holds port {held_port}; pick another --port" in line, line
    assert listing(here) == before


@pytest.mark.parametrize("command", list(SERVERS))
def test_control_on_a_free_port_the_same_command_listens(here, command):
    """The refusal above is the port's: on a free one the command starts and says where it listens."""
    port = free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "seedflood", *SERVERS[command](port)],
        cwd=here,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert p.stdout is not None
        deadline = time.monotonic() + 180
        first = ""
        while not first and time.monotonic() < deadline and p.poll() is None:
            if select.select([p.stdout], [], [], 1.0)[0]:
                first = p.stdout.readline()
        assert f"127.0.0.1:{port}" in first, (first, p.poll())
    finally:
        p.kill()
        p.wait(timeout=30)


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_that_is_no_tcp_port_is_refused_in_one_line(here, port):
    for command in SERVERS:
        line = one_error_line(seedflood(here, *SERVERS[command](0)[:-1], port))
        assert f"--port {port}: not a TCP port (0..65535)" in line


@pytest.mark.parametrize("mode", ["strict", "churn"])
def test_a_launched_rank_0_whose_master_port_is_taken_stops_before_its_model_loads(here, held_port, mode):
    """Rank 0 hosts the rendezvous store on MASTER_PORT (no torchrun agent store): a port another
    process holds is one line naming it; its model never loaded (no log line of it)."""
    before = listing(here)
    sets = ["run.out_dir=run", *(["churn.settle=1"] if mode == "churn" else [])]
    world = {"RANK": "0", "WORLD_SIZE": "5", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(held_port)}
    line = one_error_line(seedflood(here, "train", *config(*sets), **world))
    assert f"rank 0 (the rendezvous store's host) cannot listen on port {held_port}" in line, line
    assert "pick another MASTER_PORT" in line
    assert listing(here) == before


# --- run.out_dir is a file ---------------------------------------------------------------------


@pytest.mark.parametrize("command", ["world-size", "simulate", "train", "launch"])
@pytest.mark.parametrize("out", ["afile", "afile/run"])
def test_an_out_dir_that_is_a_file_or_under_one_is_refused_by_the_preflight(here, command, out):
    before = listing(here)
    line = one_error_line(seedflood(here, command, *config(f"run.out_dir={out}")))
    assert f"run.out_dir: cannot write {out}: {here / 'afile'} is a file, not a directory" in line, line
    assert listing(here) == before


@pytest.mark.parametrize("command", ["compare", "reproduce"])
def test_an_out_that_is_a_file_is_refused_before_anything_runs(here, command):
    args = {
        "compare": ["compare", "--config", DEBUG, "--algorithms", "seedflood", "--steps", "1"],
        "reproduce": ["reproduce", "--config", DEBUG, "--budget", "1"],
    }[command]
    before = listing(here)
    line = one_error_line(seedflood(here, *args, "--out", "afile/out"))
    assert f"--out afile/out: {here / 'afile'} is a file, not a directory" in line, line
    assert listing(here) == before


def test_client_logs_under_a_file_are_refused_and_a_fresh_out_dir_passes(here):
    churn = ("churn.settle=1", "run.out_dir=run")
    line = one_error_line(seedflood(here, "world-size", *config(*churn, f"eval.client_logs={here / 'afile' / 'c'}")))
    assert "eval.client_logs: cannot write" in line and "is a file, not a directory" in line
    p = seedflood(here, "world-size", *config(*churn))  # control: a directory to be created passes
    assert (p.returncode, p.stdout.strip()) == (0, "5"), p.stderr
    assert not (here / "run").exists(), "the preflight creates nothing"


# --- a key file that is not its node's ---------------------------------------------------------


@pytest.fixture
def keys(here: Path) -> Path:
    """Keys for the debug config's 4 clients, node 0's file replaced by node 1's key."""
    out = here / "keys"
    identity.write_keys(out, 4)
    shutil.copy2(out / "node-1.key", out / "node-0.key")
    return out


def signed(keys: Path) -> tuple[str, ...]:
    return ("trust.sign=true", f"trust.keys={keys}", "run.out_dir=run")


@pytest.mark.parametrize("command", ["world-size", "simulate", "train"])
def test_another_nodes_key_file_is_refused_by_the_preflight(here, keys, command):
    before = listing(here)
    line = one_error_line(seedflood(here, command, *config(*signed(keys))))
    assert "node-0.key is not the key of node 0 in roster.json (it is node 1's)" in line, line
    assert listing(here) == before
    (keys / "node-0.key").unlink()  # control: the key files that are here are their nodes'
    p = seedflood(here, "world-size", *config(*signed(keys)))
    assert (p.returncode, p.stdout.strip()) == (0, "5"), p.stderr


def test_a_launched_client_without_its_nodes_key_stops_before_its_model_loads(here, keys):
    """The preflight cannot know the key of a node whose file is not on its machine; the
    process of that node refuses itself before its model loads (one line: no log line of a model)."""
    (keys / "node-0.key").unlink()
    before = listing(here)
    world = {"RANK": "1", "WORLD_SIZE": "5", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    line = one_error_line(seedflood(here, "train", *config(*signed(keys)), **world))
    assert f"node 0 cannot read its key {keys / 'node-0.key'}" in line, line
    assert listing(here) == before


# --- empty or unparsable YAML ------------------------------------------------------------------

YAML = {
    "empty": ("", "the config file is empty"),
    "comments only": ("# settings to come\n\n", "the config file is empty"),
    "flow": ("run: {steps: 6\nmodel: {name: tiny}\n", "not valid YAML at line 2, column 6: expected ',' or '}'"),
    "indent": ("run:\n  steps: 6\n bad: 1\n", "not valid YAML at line 3, column 2: expected <block end>"),
    "tab": ("run:\n\tsteps: 6\n", "not valid YAML at line 2, column 1: found character '\\t' that cannot start"),
    "two documents": ("run: {steps: 6}\n---\nzo: {lr: 1}\n", "not valid YAML at line 2, column 1: but found another"),
}


@pytest.mark.parametrize("command", ["world-size", "simulate", "train", "launch"])
@pytest.mark.parametrize("case", list(YAML))
def test_an_empty_or_unparsable_config_is_one_line_with_where(here, command, case):
    text, words = YAML[case]
    (here / "c.yaml").write_text(text)
    before = listing(here)
    line = one_error_line(seedflood(here, command, "--config", "c.yaml", "--set", "run.out_dir=run"))
    assert line.startswith(f"seedflood: error: c.yaml: {words}"), line
    assert listing(here) == before
