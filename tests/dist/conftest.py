"""Fixtures for tests that start a world of real processes (gloo on 127.0.0.1), on tests/procs.py.

- `run_world(argv, nprocs, stall_s=..., env=None, on_poll=None, progress=None)`: start `nprocs`
  copies of `argv` as ranks 0..nprocs-1 with the torchrun variables set (MASTER_PORT a free
  port), wait for all of them and return one `procs.Proc` per rank in rank order; every process
  (and its children) is killed on the way out. The wait is bounded by progress (the outputs'
  and any watched file's growth, see procs.Procs.wait_for), not by a wall-clock deadline: a
  world that shows no progress for `stall_s` seconds fails the test with every rank's tail. A
  launch whose rendezvous port was taken meanwhile is retried on a new port. `on_poll(group)`
  runs about every 20 ms while they run (fault injection: a test may signal one of them when
  the run's own log shows a step was reached).
- `procs_ok(procs)`: assert every process exited 0, showing each one's output tail otherwise.
Workers report results as a JSON line on stdout (`Proc.last_json()`). A test module can be its
own worker: run `[sys.executable, __file__, ...]` and keep the worker under `__main__`.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path

import pytest

import procs as harness
from procs import Proc


def run_world(
    tmp: Path,
    argv: Sequence[str],
    nprocs: int,
    stall_s: float = harness.STALL_S,
    env: Mapping[str, str] | None = None,
    retries: int = 2,
    on_poll: Callable[[harness.World], None] | None = None,
    watch: Sequence[Path] = (),
    progress: Callable[[], Hashable] | None = None,
) -> list[Proc]:
    for attempt in range(retries + 1):
        ranks = _launch(tmp_dir(tmp), argv, nprocs, stall_s, env, on_poll, watch, progress)
        taken = any("address already in use" in p.stderr.lower() for p in ranks)
        if not taken or attempt == retries:
            return ranks
    raise AssertionError("unreachable")


def tmp_dir(parent: Path) -> Path:
    """A fresh directory for one launch's outputs (<rank>.out, <rank>.err)."""
    return Path(tempfile.mkdtemp(prefix="world-", dir=parent))


def _launch(
    tmp: Path,
    argv: Sequence[str],
    nprocs: int,
    stall_s: float,
    env: Mapping[str, str] | None,
    on_poll: Callable[[harness.World], None] | None,
    watch: Sequence[Path],
    progress: Callable[[], Hashable] | None,
) -> list[Proc]:
    with harness.World(tmp, argv, nprocs, env_extra=env) as group:
        group.watch(*watch)
        group.start_all()
        poll = None if on_poll is None else (lambda: on_poll(group))
        group.wait(progress=progress, stall_s=stall_s, on_poll=poll)
    return group.ranks()


def procs_ok(ranks: Sequence[Proc]) -> None:
    bad = [p for p in ranks if p.returncode != 0]
    assert not bad, "\n".join(p.describe() for p in bad)


@pytest.fixture(name="run_world", scope="session")
def run_world_fixture(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[Proc]]:
    """`run_world` with the outputs under pytest's temporary directory (kept for a look)."""
    return functools.partial(run_world, tmp_path_factory.mktemp("worlds"))


@pytest.fixture(name="procs_ok", scope="session")
def procs_ok_fixture() -> Callable[[Sequence[Proc]], None]:
    return procs_ok
