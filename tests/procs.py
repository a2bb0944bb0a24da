"""The one process harness of the tests that start real processes (tests/dist, tests/e2e).

Owns: starting named processes (each in a session of its own, outputs in files, never pipes that
could fill), restarting one under the same name, signalling one, waiting on progress, collecting
exit codes and output tails, and killing every process group it started on the way out (`close`,
also when a test fails). Also the environment every started process gets (this checkout's `src`
first on PYTHONPATH, one intra-op thread, unbuffered output, the hub offline) and the
torchrun-style world variables.

Waits are bounded by progress, never by a wall-clock deadline a loaded machine can miss: a wait
fails once its progress key (by default the sizes of every output file and every watched file, such
as a run's log.bin, which grows by one record per step) has not changed for `stall_s` seconds.
The outer bound is pytest-timeout's, set generously per test.

Assumes: POSIX (sessions, process groups); names are plain file names.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import forked

REPO = Path(__file__).resolve().parents[1]
SRC = str(REPO / "src")
TESTS = str(REPO / "tests")
STALL_S = 180.0  # seconds without any progress before a wait fails (start-up included)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now (another process may still take it before it binds)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment of a started process: `base` (os.environ) with this checkout's sources
    first on PYTHONPATH and tests/ next (a test module run as a worker imports these helpers),
    one thread, unbuffered output, the hub offline, then `extra`."""
    out = dict(os.environ if base is None else base)
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, TESTS, out.get("PYTHONPATH")]))
    out.setdefault("HF_HUB_OFFLINE", "1")
    out.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    out.update(extra)
    return out


harness_env = env  # the name `run` reaches it by (its `env` argument shadows the function)


def world_env(rank: int, world: int, port: int, addr: str = "127.0.0.1") -> dict[str, str]:
    """What torchrun sets for one rank of a world on this machine (--nproc-per-node=world)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
    }


def size(path: Path) -> int:
    """Bytes in the file `path` (in the files directly in it, for a directory), -1 while it does
    not exist: a progress key."""
    try:
        if path.is_dir():
            return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        return path.stat().st_size
    except OSError:
        return -1


def run(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path = REPO, timeout: float = 600.0
) -> subprocess.CompletedProcess[str]:
    """Run `argv` to its end with `env` (default `env()`): its exit status, stdout and stderr, as
    subprocess.run(capture_output=True, text=True) gives them. Forked when forked.py can
    (`python -m seedflood replay ...`), else a plain subprocess."""
    env = dict(env) if env is not None else harness_env()
    if forked.command(argv) is None:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    with tempfile.TemporaryDirectory(prefix="run-") as tmp:
        out, err = Path(tmp, "out"), Path(tmp, "err")
        child = forked.spawn(argv, env=env, cwd=cwd, out=out, err=err)
        if child.wait(timeout) is None:
            _killpg(child.pid, signal.SIGKILL)
            child.wait()
            raise subprocess.TimeoutExpired(list(argv), timeout)
        read = [f.read_text(errors="replace") if f.is_file() else "" for f in (out, err)]
        return subprocess.CompletedProcess(list(argv), child.returncode, *read)


class Stalled(AssertionError):
    """A wait saw no progress for its stall bound."""


@dataclass
class Proc:
    """One named process across its incarnations; outputs append to one pair of files."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    out: Path  # stdout (and stderr when merged)
    err: Path | None  # None: merged into `out`
    popen: subprocess.Popen | forked.Forked | None = None
    codes: list[int] = field(default_factory=list)  # every incarnation's exit status, in order
    started: float = 0.0  # time.monotonic() of the current incarnation's start
    ended: float | None = None  # time.monotonic() when the current incarnation was seen to exit

    @property
    def rank(self) -> int:
        """The rank of a `World` member (named by its rank)."""
        return int(self.name)

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} never started"
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """The current incarnation's exit status (negative: killed by that signal); None while it runs."""
        return None if self.popen is None else self.popen.poll()

    @property
    def stdout(self) -> str:
        return self.out.read_text(errors="replace") if self.out.is_file() else ""

    @property
    def stderr(self) -> str:
        return self.err.read_text(errors="replace") if self.err is not None and self.err.is_file() else ""

    @property
    def seconds(self) -> float:
        """From the current incarnation's start to its exit (or to now)."""
        return (self.ended if self.ended is not None else time.monotonic()) - self.started

    def last_json(self) -> object:
        """The last stdout line that parses as JSON (how workers report results)."""
        for line in reversed(self.stdout.splitlines()):
            try:
                return json.loads(line)
            except ValueError:
                continue
        raise AssertionError(f"{self.name} printed no JSON line:\n{self.describe()}")

    def describe(self, tail: int = 2000) -> str:
        code = self.returncode
        state = "running" if self.popen is not None and code is None else f"exit {code}"
        text = f"--- {self.name}: {state} (exits so far {self.codes}) after {self.seconds:.1f} s\n"
        if self.err is None:
            return text + f"output: ...{quiet(self.stdout)[-tail:]}"
        return text + f"stdout: ...{quiet(self.stdout)[-tail:]}\nstderr: ...{quiet(self.stderr)[-tail:]}"


def quiet(text: str) -> str:
    """Output without progress-bar redraws and gloo's connection-retry noise (for messages)."""
    lines = text.replace("\r", "\n").splitlines()
    return "\n".join(x for x in lines if x and "debug_logger" not in x and "it/s]" not in x and "step/s" not in x)


class Procs:
    """The processes of one test, by name. Use as a context manager (or call `close`): every
    process group still running is ended on the way out, whatever happened."""

    def __init__(self, tmp: Path, *, term_grace_s: float = 0.0) -> None:
        self.tmp = Path(tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, Proc] = {}
        self.watched: list[Path] = []
        # 0: SIGKILL at once. > 0: SIGTERM first, so a launcher (torchrun, srun) can end its own
        # workers, then SIGKILL after this many seconds.
        self.term_grace_s = term_grace_s

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, name: str) -> Proc:
        return self.procs[name]

    def __iter__(self):
        return iter(self.procs.values())

    # -- starting ------------------------------------------------------------------------------

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path = REPO,
        merge: bool = False,
        log: Path | None = None,
    ) -> Proc:
        """Start `argv` as `name` in a session of its own; stdout (and stderr unless `merge`)
        append to <tmp>/<name>.out / .err, or both to `log`."""
        out = log or self.tmp / f"{name}.out"
        err = None if merge or log is not None else self.tmp / f"{name}.err"
        p = Proc(name, list(argv), dict(env), Path(cwd), out, err)
        self.procs[name] = p
        self._spawn(p)
        return p

    def _spawn(self, p: Proc) -> None:
        if forked.command(p.argv) is not None:  # python -m MODULE / python SCRIPT: fork it (forked.py)
            p.popen = forked.spawn(p.argv, env=p.env, cwd=p.cwd, out=p.out, err=p.err)
        else:
            with open(p.out, "ab") as out, open(p.err, "ab") if p.err else open(os.devnull, "wb") as err:
                p.popen = subprocess.Popen(
                    p.argv,
                    env=p.env,
                    cwd=p.cwd,
                    stdout=out,
                    stderr=err if p.err else subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        p.started, p.ended = time.monotonic(), None

    def again(self, name: str) -> Proc:
        """Start `name` again with the same command and environment (it must have exited)."""
        p = self.procs[name]
        assert p.popen is not None and p.popen.poll() is not None, f"{name} is still running"
        self.poll()
        self._spawn(p)
        return p

    def restart(self, name: str, sig: int = signal.SIGKILL, pause_s: float = 1.0) -> Proc:
        """End `name` with `sig`, wait for it, and start it again after `pause_s`."""
        self.signal(name, sig)
        self.procs[name].popen.wait()  # type: ignore[union-attr]
        time.sleep(pause_s)
        return self.again(name)

    # -- acting and looking ---------------------------------------------------------------------

    def signal(self, name: str, sig: int) -> float:
        """Send `sig` to the process (not its group); returns the wall time it was sent. A
        process already gone (it exited, or was killed and reaped, before the harness polled its
        status) is left alone: there is nothing to signal, and its exit status tells the test."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.procs[name].pid, sig)
        return time.time()

    def kill(self, name: str) -> int:
        """SIGKILL `name`'s whole process group and reap it; returns its exit status."""
        p = self.procs[name]
        _killpg(p.pid, signal.SIGKILL)
        code = p.popen.wait()  # type: ignore[union-attr]
        self.poll()
        return code

    def watch(self, *paths: Path) -> None:
        """Count growth of these files as progress too (a run's log.bin, its metrics)."""
        self.watched += [Path(x) for x in paths]

    def poll(self) -> None:
        """Record the exits seen since the last call."""
        for p in self.procs.values():
            if p.popen is not None and p.ended is None and p.popen.poll() is not None:
                p.ended = time.monotonic()
                p.codes.append(p.popen.returncode)

    def running(self, name: str) -> bool:
        p = self.procs[name]
        return p.popen is not None and p.popen.poll() is None

    def exited(self, name: str) -> bool:
        return not self.running(name)

    def codes(self, names: Iterable[str] | None = None) -> list[int | None]:
        """The current incarnation's exit status of each (None: still running)."""
        return [self.procs[n].returncode for n in (self.procs if names is None else names)]

    def activity(self) -> tuple[int, ...]:
        """The default progress key: every output's and every watched file's size."""
        files = [f for p in self.procs.values() for f in (p.out, p.err) if f is not None]
        return tuple(size(f) for f in [*files, *self.watched])

    def describe(self, names: Iterable[str] | None = None, tail: int = 2000) -> str:
        return "\n".join(self.procs[n].describe(tail) for n in (self.procs if names is None else names))

    # -- waiting --------------------------------------------------------------------------------

    def wait_for(
        self,
        cond: Callable[[], object],
        why: str,
        *,
        alive: Iterable[str] = (),
        progress: Callable[[], Hashable] | None = None,
        stall_s: float = STALL_S,
        on_poll: Callable[[], None] | None = None,
        poll_s: float = 0.02,
    ) -> None:
        """Until `cond()` holds. Fails (Stalled) when `progress()` (default `activity()`) has not
        changed for `stall_s` seconds, and at once when a process named in `alive` has exited."""
        key = progress or self.activity
        alive = list(alive)
        last, since = key(), time.monotonic()
        while not cond():
            self.poll()
            if on_poll is not None:
                on_poll()
            dead = [n for n in alive if self.exited(n)]
            if dead:
                raise AssertionError(f"{dead} exited while waiting for {why}\n{self.describe()}")
            now, seen = time.monotonic(), key()
            if seen != last:
                last, since = seen, now
            elif now - since > stall_s:
                raise Stalled(f"no progress for {stall_s:.0f} s while waiting for {why}\n{self.describe()}")
            time.sleep(poll_s)
        self.poll()

    def wait(
        self,
        names: Iterable[str] | None = None,
        *,
        fail_fast: bool = False,
        **kw: object,
    ) -> list[int]:
        """Until every named process (all by default) has exited; their exit statuses.
        `fail_fast`: the first non-zero exit ends the rest (as a launcher would). Keyword
        arguments as `wait_for` (progress, stall_s, on_poll)."""
        names = list(self.procs if names is None else names)

        def done() -> bool:
            codes = self.codes(names)
            if fail_fast and any(c not in (None, 0) for c in codes):
                self.close()
                return True
            return all(c is not None for c in codes)

        self.wait_for(done, f"{names} to exit", **kw)  # type: ignore[arg-type]
        return [int(c) for c in self.codes(names)]  # type: ignore[arg-type]

    # -- ending ---------------------------------------------------------------------------------

    def close(self) -> None:
        """End every process group still running (SIGTERM and a grace first if asked), reap
        all, and SIGKILL the groups of the exited ones too (children a worker left behind)."""
        live = [p for p in self.procs.values() if p.popen is not None and p.popen.poll() is None]
        if self.term_grace_s > 0:
            for p in live:
                _killpg(p.pid, signal.SIGTERM)
            deadline = time.monotonic() + self.term_grace_s
            while any(p.popen.poll() is None for p in live) and time.monotonic() < deadline:  # type: ignore[union-attr]
                time.sleep(0.05)
        for p in self.procs.values():
            if p.popen is not None:
                _killpg(p.pid, signal.SIGKILL)
                p.popen.wait()
        self.poll()


class World(Procs):
    """The ranks of one torchrun-style world on this machine, named "0".."size-1" (rank 0 the
    evaluator): the same `argv` per rank, the world variables on a free MASTER_PORT."""

    def __init__(
        self,
        tmp: Path,
        argv: Sequence[str],
        size: int,
        *,
        env_extra: Mapping[str, str] | None = None,
        merge: bool = False,
        **kw: float,
    ) -> None:
        super().__init__(tmp, **kw)
        self.argv, self.size, self.merge = list(argv), size, merge
        self.port = free_port()
        self.base = env(**(env_extra or {}))

    def start_rank(self, rank: int) -> Proc:
        """Start (or, once it exited, start again: a new incarnation) the process of `rank`."""
        name = str(rank)
        if name in self.procs:
            return self.again(name)
        return self.start(name, self.argv, env={**self.base, **world_env(rank, self.size, self.port)}, merge=self.merge)

    def start_all(self, later: Iterable[int] = ()) -> World:
        """Start every rank but those in `later` (left for the test to start)."""
        for r in range(self.size):
            if r not in set(later):
                self.start_rank(r)
        return self

    def rank(self, r: int) -> Proc:
        return self.procs[str(r)]

    def ranks(self) -> list[Proc]:
        return [self.procs[str(r)] for r in range(self.size) if str(r) in self.procs]

    def output(self) -> str:
        """Everything every rank printed so far (all incarnations), in rank order."""
        return "".join(p.stdout + p.stderr for p in self.ranks())


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the session this harness started for that process
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)  # a forked child not yet in its own session (forked.py)
        except (ProcessLookupError, PermissionError):
            pass


def sets(*overrides: str) -> list[str]:
    """`--set` arguments for `overrides`, in order (later ones win)."""
    return [a for text in overrides for a in ("--set", text)]
