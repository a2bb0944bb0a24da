"""Helpers for tests that start real processes (gloo on 127.0.0.1).

Fixtures:
- `run_world(argv, nprocs, timeout_s, env=None, on_poll=None)`: start `nprocs` copies of `argv` with the
  torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT on a free port)
  set, wait for all of them, and return one `Proc` per rank in rank order. On timeout every
  process (and its children) is killed by its id and the outputs are returned with
  `timed_out=True`. A launch whose rendezvous port was taken in the meantime is retried on a
  new port. `on_poll(popens)` is called about every 20 ms while they run (fault injection:
  a test may kill or stop one of them when the run's own output shows a step was reached).
- `procs_ok(procs)`: assert every process exited 0, showing each one's output tail otherwise.
Workers report results as a JSON line on stdout (`Proc.last_json()`). A test module can be its
own worker: run `[sys.executable, __file__, ...]` and keep the worker under `__main__`.

Assumes: POSIX (process groups); the machine is small and shared, so each process gets one
thread (OMP_NUM_THREADS=1) and outputs go to files, never to pipes that could fill up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from seedflood.comm.runtime import free_port

SRC = str(Path(__file__).resolve().parents[2] / "src")


@dataclass
class Proc:
    rank: int
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float

    def last_json(self) -> object:
        """The last stdout line that parses as JSON (how workers report results)."""
        for line in reversed(self.stdout.splitlines()):
            try:
                return json.loads(line)
            except ValueError:
                continue
        raise AssertionError(f"rank {self.rank} printed no JSON line:\n{self.describe()}")

    def describe(self, tail: int = 2000) -> str:
        return (
            f"--- rank {self.rank}: exit {self.returncode}"
            f"{' (timed out)' if self.timed_out else ''} after {self.seconds:.1f} s\n"
            f"stdout: ...{self.stdout[-tail:]}\nstderr: ...{self.stderr[-tail:]}"
        )


def _kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)  # the session this helper started for that process
    except ProcessLookupError:
        pass


def run_world(
    argv: Sequence[str],
    nprocs: int,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    retries: int = 2,
    on_poll: Callable[[list[subprocess.Popen]], None] | None = None,
) -> list[Proc]:
    for attempt in range(retries + 1):
        procs = _launch(argv, nprocs, timeout_s, env, on_poll)
        taken = any("address already in use" in p.stderr.lower() for p in procs)
        if not taken or attempt == retries:
            return procs
    raise AssertionError("unreachable")


def _launch(
    argv: Sequence[str],
    nprocs: int,
    timeout_s: float,
    env: Mapping[str, str] | None,
    on_poll: Callable[[list[subprocess.Popen]], None] | None = None,
) -> list[Proc]:
    port = free_port()
    base = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(nprocs),
        "LOCAL_WORLD_SIZE": str(nprocs),  # all on this machine, as torchrun --nproc-per-node says
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])),
        **(env or {}),
    }
    with tempfile.TemporaryDirectory(prefix="seedflood-dist-") as tmp:
        running = []
        start = time.monotonic()
        for rank in range(nprocs):
            out, err = (open(Path(tmp) / f"{rank}.{s}", "w+") for s in ("out", "err"))
            p = subprocess.Popen(
                list(argv),
                env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            running.append((p, out, err))
        deadline = start + timeout_s
        ended: dict[int, float] = {}
        timed_out = False
        while len(ended) < nprocs:
            for rank, (p, _, _) in enumerate(running):
                if rank not in ended and p.poll() is not None:
                    ended[rank] = time.monotonic() - start
            if on_poll is not None:
                on_poll([p for p, _, _ in running])
            if time.monotonic() > deadline:
                timed_out = True
                for p, _, _ in running:
                    _kill(p)
                break
            time.sleep(0.02)
        results = []
        for rank, (p, out, err) in enumerate(running):
            code = p.wait()
            _kill(p)  # children a worker may have left behind
            out.seek(0)
            err.seek(0)
            results.append(
                Proc(
                    rank,
                    None if rank not in ended else code,
                    out.read(),
                    err.read(),
                    timed_out and rank not in ended,
                    ended.get(rank, timeout_s),
                )
            )
            out.close()
            err.close()
        return results


def procs_ok(procs: Sequence[Proc]) -> None:
    bad = [p for p in procs if p.returncode != 0]
    assert not bad, "\n".join(p.describe() for p in bad)


@pytest.fixture(name="run_world")
def run_world_fixture() -> Callable[..., list[Proc]]:
    return run_world


@pytest.fixture(name="procs_ok")
def procs_ok_fixture() -> Callable[[Sequence[Proc]], None]:
    return procs_ok
