"""One client process of the overlap figure (bench/overlap.py launches 4 of them).

Owns: the figure's shared setting (NODES clients on a ring, `overrides(quick)`, `steps(quick)`),
`Delayed` (a Transport whose exchanges sleep first: a slow link, simulated), and `run_worker`: a
process that measures two forwards, agrees with the others on the sleep, then runs the same steps
with flood.overlap off and on over gloo and reports step, forward and hop times, the cores it kept
busy and its final state hash. `python -m seedflood.bench.overlap_worker JSON` runs one and
prints its report as one JSON line.

Assumes: the torchrun variables are set (RANK, WORLD_SIZE, MASTER_ADDR, ...); the clients only
(no evaluator): rank r is node r.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

NODES = 4


class Delayed:
    """A Transport whose every exchange first sleeps `latency_s` (a slow link, simulated; 0 = no
    sleep) and is timed (`times`, seconds per exchange); push and close pass through. The sleep
    releases the GIL, as a real network wait does."""

    def __init__(self, inner: Any, latency_s: float) -> None:
        self.inner = inner
        self.latency_s = latency_s
        self.node = inner.node
        self.peers = inner.peers
        self.counter = inner.counter
        self.times: list[float] = []

    @property
    def last_step(self) -> int:
        return self.inner.last_step

    def exchange(self, frames: Mapping[int, bytes], step: int) -> dict[int, bytes]:
        t0 = time.perf_counter()
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        out = self.inner.exchange(frames, step)
        self.times.append(time.perf_counter() - t0)
        return out

    def push(self, frame: bytes, step: int) -> None:
        self.inner.push(frame, step)

    def close(self, abort: bool = False) -> None:
        self.inner.close(abort)

    def __enter__(self) -> Delayed:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(abort=exc_type is not None)


def steps_of(quick: bool) -> int:
    """Steps each mode runs (the first 2 are warm-up, not timed)."""
    return 12 if quick else 30


def overrides(quick: bool) -> list[str]:
    """The config every worker and the in-memory reference load (flood.overlap is added per mode)."""
    steps = steps_of(quick)
    return [
        "model.name=tiny",
        "model.tiny={hidden_size: 128, intermediate_size: 256, num_hidden_layers: 2}",
        "task.name=synthetic",
        "task.train_examples=256",
        "task.dev_examples=0",
        "task.test_examples=8",
        "task.batch_size=16",
        "task.max_tokens=64",
        "run.threads=1",
        f"run.steps={steps}",
        "topology.kind=ring",
        f"topology.nodes={NODES}",
        "flood.hops_per_step=1",
        "transport.timeout_s=60",
        "zo.lr=1.0",
    ]


def _timed(fn: Callable[[int], float], times: list[float]) -> Callable[[int], float]:
    def wrapped(step: int) -> float:
        t0 = time.perf_counter()
        out = fn(step)
        times.append(time.perf_counter() - t0)
        return out

    return wrapped


def run_worker(opts: dict[str, Any]) -> dict[str, Any]:
    """This process's report; opts: {"quick": bool, "ratio": float, "latency_s": float | None}."""
    from seedflood.comm import runtime
    from seedflood.comm.gloo import GlooTransport
    from seedflood.core.config import runconfig as config
    from seedflood.core.flood.protocol import Protocol
    from seedflood.core.topology import resolve as topo
    from seedflood.core.zo.replay import state_hash
    from seedflood.ml.workload import Workload
    from seedflood.roles.client import Client

    world = runtime.World.from_env(os.environ)
    node = world.rank  # no evaluator in this figure: rank r is node r
    base = overrides(opts["quick"])
    out: dict[str, Any] = {"node": node, "modes": {}}
    with runtime.process_group(world, config.load(None, base).transport) as group:
        probe = Workload.build(config.load(None, base))
        fwd: list[float] = []
        loss = _timed(lambda s: probe.loss(node, s), fwd)
        for s in range(6):
            loss(s)
        two_fwd = 2 * statistics.median(fwd[1:])
        # every rank sleeps the same: rank 0's measurement, broadcast
        latency = group.broadcast(opts["ratio"] * two_fwd if opts["latency_s"] is None else opts["latency_s"])
        out["latency_s"] = latency
        for overlap in (False, True):
            cfg = config.load(None, [*base, f"flood.overlap={str(overlap).lower()}"])
            top = topo.build(cfg.topology)
            protocol = Protocol.of(cfg, top.diameter)
            w = Workload.build(cfg)
            fwd = []
            gloo = GlooTransport(node, top.neighbors(node), {n: n for n in top.nodes})
            with Delayed(gloo, latency) as transport:
                c = Client.in_topology(
                    top,
                    node,
                    protocol,
                    w.direction,
                    _timed(lambda s: w.loss(node, s), fwd),
                    transport,
                    cfg.transport.timeout_s,
                )
                steps: list[float] = []
                wall0, cpu0 = time.perf_counter(), time.process_time()
                for t in range(protocol.steps):
                    t0 = time.perf_counter()
                    c.step(t)
                    steps.append(time.perf_counter() - t0)
                busy = (time.process_time() - cpu0) / (time.perf_counter() - wall0)  # cores this process kept busy
                c.drain()
            warm = 2  # the first steps pay for lazy set-up (and overlap's first has no hops to hide)
            out["modes"]["on" if overlap else "off"] = {
                "delay": protocol.delay,
                "step_s": statistics.median(steps[warm:]),
                "fwd_s": statistics.median(fwd[2 * warm :]),
                "hop_s": statistics.median(transport.times[warm:]),
                "cores": busy,
                "hash": state_hash(w.model, w.direction),
            }
    return out


if __name__ == "__main__":
    print(json.dumps(run_worker(json.loads(sys.argv[1]))), flush=True)
