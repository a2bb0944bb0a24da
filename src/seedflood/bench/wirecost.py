"""Exact wire bytes of a flooding run, without a model (`seedflood bench --only bytes`).

Owns `count` (the ByteCounter a run of N clients would fill, by driving `core.lockstep.Lockstep`
with placeholder messages) and `measure` / `project` / `rows` (per directed edge figures, as
table rows). So on any graph the counter equals, row for row, the one `simulation.simulate`
fills for a run with the same N, K, hops and steps (tests/unit/bench/test_wirecost.py checks it).

Why `count` is exact without a model: a frame's size depends only on which message ids it
carries (origin, step, k: the layout widths and the count) and never on a scalar's or a seed's
value (v1 carries a fixed-width seed, v2 none), and which ids travel is decided by the flood
alone. The messages there carry seed 0 and scalar 1.0. The hops and delay come from
`protocol.schedule`, the one place that formula is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from seedflood.core.flood import lockarrays
from seedflood.core.flood.lockstep import Graph, as_topology
from seedflood.core.flood.protocol import schedule as protocol_schedule
from seedflood.core.flood.transport import ByteCounter
from seedflood.core.topology.graph import Topology
from seedflood.core.wire import message
from seedflood.core.wire.message import Message


def schedule(top: Topology, hops_per_step: int) -> tuple[int, int]:
    """(hops per step, delay) of a strict run without overlap (0 hops = the diameter)."""
    hops = hops_per_step or max(1, top.diameter)
    return hops, protocol_schedule(top.diameter, hops)[1]


def count(
    graph: Graph,
    steps: int,
    *,
    hops_per_step: int = 1,
    perturbations: int = 1,
    version: int = message.VERSION,
    routed: bool = True,
    overlap: bool = False,
) -> ByteCounter:
    """Bytes handed to the transport per (step, src, dst) by a run of `steps` steps, drain included.

    N is the graph's node count, K = `perturbations`; `hops_per_step` 0 means full flooding (the
    diameter). `routed`: forward along shortest paths only (graph.Topology.routes), as the
    runtime does; False: to every neighbour not known to have a message. `overlap`: the
    schedule of flood.overlap (one more step of delay, a shorter drain). Raises FloodError if a
    step is incomplete when due (cannot happen on a connected graph: the delay is derived from
    the diameter).
    """
    top = as_topology(graph)
    hops, delay = schedule(top, hops_per_step)
    k_max = perturbations
    lock = lockarrays.make(top, k_max, hops, delay + int(overlap), overlap=overlap, routed=routed, version=version)

    def placeholders(t: int) -> dict[int, list[Message]]:
        return {i: [Message(step=t, origin=i, k=k, seed=0, scalar=1.0) for k in range(k_max)] for i in top.nodes}

    lock.run(steps, placeholders, lambda s, msgs: None)
    return lock.counter


@dataclass(frozen=True)
class WireCost:
    """Per directed edge figures of one setting (the evaluator's stream is not an edge)."""

    version: int
    hops: int
    delay: int
    nodes: int
    perturbations: int
    steps: int
    edges: int
    """Directed edges."""
    per_step_steady: float
    """Mean over edges of the bytes of one step in the middle of the run."""
    per_step_mean: float
    """per_run / steps (start-up and drain included)."""
    per_run: float
    """Mean over edges of the bytes of the whole run."""
    per_run_max: int
    """The busiest edge's bytes of the whole run."""


def measure(
    graph: Graph, steps: int, *, hops_per_step: int = 1, perturbations: int = 1, version: int = message.VERSION
) -> WireCost:
    """`count`, summarised per directed edge."""
    top = as_topology(graph)
    hops, delay = schedule(top, hops_per_step)
    c = count(top, steps, hops_per_step=hops_per_step, perturbations=perturbations, version=version)
    edges = c.per_edge_total()
    per_step = c.per_step_total(include_evaluator=False)
    n_edges = 2 * len(top.edges)
    per_run = sum(edges.values()) / n_edges
    return WireCost(
        version=version,
        hops=hops,
        delay=delay,
        nodes=top.n,
        perturbations=perturbations,
        steps=steps,
        edges=n_edges,
        per_step_steady=per_step.get(steps // 2, 0) / n_edges,
        per_step_mean=per_run / steps if steps else 0.0,
        per_run=per_run,
        per_run_max=max(edges.values(), default=0),
    )


def project(
    graph: Graph,
    steps: int,
    *,
    perturbations: int = 1,
    hops: Sequence[int] = (0, 1),
    versions: Sequence[int] = (message.VERSION_1, message.VERSION_2),
) -> list[WireCost]:
    """Every (frame version, hops per step) combination; hops 0 = full flooding (the diameter)."""
    return [
        measure(graph, steps, hops_per_step=h, perturbations=perturbations, version=v) for v in versions for h in hops
    ]


HEADERS = ("frame", "hops/step", "delay", "B/edge/step steady", "B/edge/step mean", "B/edge/run", "max edge/run")


def rows(results: Sequence[WireCost]) -> list[list[str]]:
    """One table row per result, in the order of HEADERS."""
    return [
        [
            f"v{r.version}",
            f"{r.hops}" + (" (full)" if r.delay == 0 else ""),
            str(r.delay),
            f"{r.per_step_steady:.1f}",
            f"{r.per_step_mean:.1f}",
            f"{r.per_run:,.0f}",
            f"{r.per_run_max:,}",
        ]
        for r in results
    ]
