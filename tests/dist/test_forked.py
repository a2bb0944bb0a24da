"""The fork server the harness starts Python processes from (tests/forked.py) against a fresh
interpreter: for the same script and arguments, both give the same exit status, stdout, stderr,
argv, cwd and environment, run atexit handlers and join non-daemon threads at the end, and take
signals the same way. As a worker (run as `__main__`) this module is that script.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import forked
import procs as harness

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]
CASES = ["ok", "code-3", "message", "raise", "thread", "env", "threads"]


def both(tmp_path: Path, *args: str) -> list[subprocess.CompletedProcess[str]]:
    """The worker run with `args` forked, then as a fresh interpreter."""
    argv = [sys.executable, __file__, *args]
    env = harness.env(SEEDFLOOD_PROBE="seen")
    assert forked.command(argv) is not None
    fork = harness.run(argv, env=env, cwd=tmp_path, timeout=120)
    fresh = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    return [fork, fresh]


@pytest.mark.parametrize("case", CASES)
def test_a_forked_process_ends_as_a_fresh_interpreter_does(tmp_path, case):
    fork, fresh = both(tmp_path, case)
    assert (fork.returncode, fork.stdout) == (fresh.returncode, fresh.stdout)
    # a traceback names the runner's frames first (runpy's, not the interpreter's): compare its end
    assert fork.stderr.splitlines()[-2:] == fresh.stderr.splitlines()[-2:], (fork.stderr, fresh.stderr)
    assert fork.stdout, fork.stderr


def test_signals_reach_a_forked_process_in_a_session_of_its_own(tmp_path):
    """A SIGSTOP holds it, SIGCONT lets it go on, SIGKILL ends it with -9; its process group is
    its own (a harness killpg never reaches the test process)."""
    with harness.Procs(tmp_path) as group:
        p = group.start("sleeper", [sys.executable, __file__, "sleep"], env=harness.env())
        group.wait_for(lambda: "sleeping" in p.stdout, "the worker to start")
        assert isinstance(p.popen, forked.Forked)
        assert os.getpgid(p.pid) == p.pid != os.getpgid(0)
        group.signal("sleeper", signal.SIGSTOP)
        time.sleep(0.3)
        assert p.returncode is None
        group.signal("sleeper", signal.SIGCONT)
        group.signal("sleeper", signal.SIGKILL)
        assert group.wait(["sleeper"]) == [-signal.SIGKILL]


def test_a_forked_process_starts_with_torch_and_seedflood_imported(tmp_path):
    """What makes it cheap: the preloaded modules are there before the child's first line."""
    out = harness.run([sys.executable, __file__, "preloaded"], cwd=tmp_path, timeout=120)
    assert out.returncode == 0 and out.stdout.split()[-len(forked.PRELOAD) :] == ["True"] * len(forked.PRELOAD), out


def test_fork_off_starts_a_fresh_interpreter():
    """SEEDFLOOD_TEST_FORK=0 in the environment turns the fork server off."""
    code = "import forked, sys; print(forked.command([sys.executable, '-m', 'seedflood']))"
    env = harness.env(SEEDFLOOD_TEST_FORK="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "None", out.stderr


def worker(case: str) -> None:
    if case == "preloaded":
        print(*(name in sys.modules for name in forked.PRELOAD))
        return
    print(f"argv {sys.argv[1:]} cwd {Path.cwd().name} probe {os.environ.get('SEEDFLOOD_PROBE')}")
    print("to stderr", file=sys.stderr)
    atexit.register(lambda: print("atexit ran"))
    if case == "code-3":
        sys.exit(3)
    if case == "message":
        sys.exit("a message for stderr")
    if case == "raise":
        raise ValueError("uncaught")
    if case == "thread":
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread done"))).start()
    if case == "env":
        os.write(1, f"getenv {os.popen('echo $SEEDFLOOD_PROBE').read().strip()}\n".encode())
    if case == "threads":  # OpenMP reads OMP_NUM_THREADS (1, procs.env) when torch loads: in the server
        import torch

        print(f"intra-op threads {torch.get_num_threads()}")
    if case == "sleep":
        print("sleeping")
        time.sleep(600)


if __name__ == "__main__":
    worker(sys.argv[1])
