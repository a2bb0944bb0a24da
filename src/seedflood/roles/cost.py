"""What a launched client's steps cost it, for its final report (summary.json `cost`).

Owns `Cost`: the process's CPU (user + system, every thread: time.process_time) from the start
of its steps to their end (the run and its drain, not the imports, model load or rendezvous),
the part of it spent in its forwards (the thread CPU of each loss call: run.threads = 1 runs a
forward on the calling thread; a slow client's paced sleep costs none), and the most messages
its flood held right after each step's hops, before that step is applied (as bench/scaling.py
counts it in `seedflood simulate`), in the thread that ran them.

Assumes: one client per process (process CPU is the client's and its transport threads').
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol


class _Flood(Protocol):
    @property
    def held_count(self) -> int: ...


class _Client(Protocol):
    @property
    def flood(self) -> _Flood: ...

    def hops(self, t: int) -> None: ...


class Cost:
    def __init__(self) -> None:
        self.forwards_s = 0.0
        self.held_peak = 0
        self._cpu0: float | None = None
        self.run_cpu_s: float | None = None

    def loss(self, loss: Callable[[int], float]) -> Callable[[int], float]:
        """`loss`, its thread CPU added to the forwards."""

        def timed(step: int) -> float:
            c0 = time.thread_time()
            try:
                return loss(step)
            finally:
                self.forwards_s += time.thread_time() - c0

        return timed

    def watch(self, client: _Client) -> None:
        """Sample `client`'s held count after each of its steps' hops."""
        hops, flood = client.hops, client.flood

        def sampled(t: int) -> None:
            hops(t)
            with contextlib.suppress(RuntimeError):  # a store another thread changed meanwhile: no sample
                self.held_peak = max(self.held_peak, flood.held_count)

        client.hops = sampled  # type: ignore[method-assign]

    def start(self) -> None:
        self._cpu0 = time.process_time()

    def stop(self) -> None:
        if self._cpu0 is not None:
            self.run_cpu_s = time.process_time() - self._cpu0

    def report(self) -> dict[str, Any]:
        return {
            "run_cpu_s": self.run_cpu_s,
            "forwards_s": self.forwards_s,
            "held_peak": self.held_peak,
            "process_cpu_s": time.process_time(),
        }
