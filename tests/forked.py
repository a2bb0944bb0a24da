"""Started Python processes forked from an interpreter that has imported torch once.

Owns: the fork server of one test process (multiprocessing's forkserver, preloaded with torch,
torch.distributed, the seedflood modules a `seedflood` command imports and tests/forkwarm.py), `spawn` (start
`python -m MODULE ...` or `python SCRIPT ...` as a forked child, with its own session, working
directory, environment and output files, looking to the harness like a subprocess.Popen), and
`command` (which argument vectors it can start).

Why: a started process spends about 1.8 s of CPU importing torch before its first line of work
(2.0 of 2.2 s for a median launched test process, measured with process accounting), and the
launched tests start about 500 of them: on this 2-core machine that was a quarter of CI. A fork
of an interpreter that already imported them starts in milliseconds.

What stays as with a fresh interpreter: one OS process per role with its own pid, session and
process group (signals, SIGSTOP, SIGKILL and exit statuses as before: -9 for a SIGKILL), its own
environment (os.environ, and so the C getenv that gloo reads, set before any of its code runs),
its own cwd, stdout and stderr in the given files (unbuffered, as PYTHONUNBUFFERED), stdin from
/dev/null, `__main__` run as `python -m` / `python script` would, and at the end what the
interpreter does before it exits: non-daemon threads joined, atexit handlers run, stdio flushed.
What differs: the preloaded modules are imported once in the server (with its environment:
OMP_NUM_THREADS=1, read by OpenMP at load), not in the child; str hashes share one random seed
across the forked children; the interpreter's final teardown of daemon threads is skipped (the
child ends with os._exit after the atexit handlers), so a crash that only that teardown causes is
caught by the tests that start real interpreters (the torchrun, SLURM and netns launcher tests,
tests/unit/cli/test_cli.py) and not here. SEEDFLOOD_TEST_FORK=0 starts every process as a fresh interpreter instead.

Assumes: Linux (fork), CPython 3.11+; the forked code does not itself use multiprocessing; the
test process's `__main__` is guarded by `if __name__ == "__main__"` (pytest's and xdist's are):
multiprocessing imports it again in every child, as `__mp_main__`.
"""

from __future__ import annotations

import atexit
import io
import multiprocessing
import os
import runpy
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from unittest import mock

ENABLED = os.environ.get("SEEDFLOOD_TEST_FORK", "1") != "0"
PRELOAD = ["torch", "torch.distributed", "seedflood.cli", "seedflood.roles.train", "seedflood.ml.tinyllama", "forkwarm"]
"""Imported by the server before its first fork, in order; forkwarm (tests/forkwarm.py) does the
rest of the start-up every `seedflood` command repeats (its parser's imports, the config's
pydantic models): ~0.3 s of CPU per child. The server imports by the children's PYTHONPATH
(SERVER_KEYS: src, then tests/) and skips a module it cannot import: `_server` checks."""
SERVER_KEYS = ("OMP_NUM_THREADS", "PYTHONUNBUFFERED", "HF_HUB_OFFLINE", "PYTHONPATH")
"""Variables read while the preloaded modules import (OpenMP reads its thread count at load;
PYTHONPATH: the server finds this checkout's src and tests/ by it, since multiprocessing's
forkserver main ignores the sys.path it is handed before Python 3.13): the server takes them
from the first child's environment, which the harness builds (procs.env)."""

OWN_PATH = (str(Path(__file__).resolve().parents[1] / "src"), str(Path(__file__).resolve().parent))
"""This checkout's src and tests/, first on the server's PYTHONPATH."""

_context: multiprocessing.context.ForkServerContext | None = None


def command(argv: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """("module" | "path", target, args) for `python -m MODULE args` or `python SCRIPT.py args`
    run by this interpreter; None for anything else (a launcher, a shell script, another
    Python), which the harness starts as a plain subprocess."""
    if not ENABLED or len(argv) < 2 or argv[0] != sys.executable:
        return None
    if argv[1] == "-m" and len(argv) > 2:
        return "module", argv[2], list(argv[3:])
    if argv[1].endswith(".py") and not argv[1].startswith("-"):
        return "path", argv[1], list(argv[2:])
    return None


class Forked:
    """A forked child, seen through the part of subprocess.Popen the harness uses."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self.process = process

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """The exit status (negative: ended by that signal), None while it runs."""
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        self.process.join(timeout)
        return self.poll()


def spawn(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, out: Path, err: Path | None) -> Forked:
    """Start `argv` (which `command` accepts) as a forked child: stdout appended to `out`,
    stderr to `err` (None: to `out` too)."""
    kind, target, args = command(argv) or (None, "", [])
    assert kind is not None, f"not a command the fork server runs: {argv}"
    process = _server(env).Process(
        target=_child, args=(kind, target, args, dict(env), str(cwd), str(out), None if err is None else str(err))
    )
    process.daemon = True  # ended with the test process if the harness could not
    process.start()
    return Forked(process)


def _server(env: Mapping[str, str]) -> multiprocessing.context.ForkServerContext:
    """This test process's fork server, started on first use with PRELOAD and the SERVER_KEYS
    of `env` (the server inherits this process's environment)."""
    global _context
    if _context is None:
        from multiprocessing import forkserver

        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        keys = {k: env[k] for k in SERVER_KEYS if k in env}
        # This checkout's src and tests/ whatever the first child's path (a compose service's
        # environment, as its image gives it, has neither): forkwarm lives in tests/.
        keys["PYTHONPATH"] = os.pathsep.join(filter(None, [*OWN_PATH, keys.get("PYTHONPATH")]))
        with mock.patch.dict(os.environ, keys):
            forkserver.ensure_running()
        probe = context.Process(target=_preloaded)  # the server skips a preload it cannot import
        probe.start()
        probe.join()
        assert probe.exitcode == 0, f"the fork server did not import all of {PRELOAD}: exit {probe.exitcode}"
        _context = context
    return _context


def _preloaded() -> None:
    """Runs in a forked child: exit 0 when the server imported every PRELOAD module, else 3."""
    os._exit(0 if all(name in sys.modules for name in PRELOAD) else 3)


def _child(kind: str, target: str, args: list[str], env: dict[str, str], cwd: str, out: str, err: str | None) -> None:
    """Runs in the forked child: become the process `python -m target args` (or `python target
    args`) would be, then exit as its interpreter would."""
    os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _redirect(out, err)
    sys.argv = [target, *args]
    if kind == "path":
        sys.path.insert(0, str(Path(target).resolve().parent))
    else:
        sys.path.insert(0, cwd)
    code = 0
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        code = _exit_status(e.code)
    except BaseException:  # what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter joins non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _exit_status(code: object) -> int:
    """What the interpreter exits with for SystemExit(code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _redirect(out: str, err: str | None) -> None:
    """stdin from /dev/null; stdout to `out` and stderr to `err` (or `out`), both appended and
    unbuffered, at the file-descriptor level (what C code writes goes there too)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    fd_out = os.open(out, flags, 0o644)
    fd_err = os.open(err, flags, 0o644) if err is not None else fd_out
    os.dup2(fd_out, 1)
    os.dup2(fd_err, 2)
    for fd in {fd_out, fd_err}:
        os.close(fd)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = _text(1, "strict")
    sys.stderr = sys.__stderr__ = _text(2, "backslashreplace")


def _text(fd: int, errors: str) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors=errors, write_through=True)
