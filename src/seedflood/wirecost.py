"""Exact wire bytes of a flooding run, without a model: the paper-setting projection of the bytes figure.

Owns `count` (the ByteCounter a run of N clients would fill) and `project` / `rows` (per directed
edge figures, as table rows for `seedflood bench --only bytes`). It drives one real
`flooding.Flood` per node in one process, in the client's exact schedule (client.py: originate K
messages, `hops` hops, apply step t − delay; then drain), encodes every outbox with the real codec
(`message.encode`, any frame version) and counts what the transport counts: `transport.HEADER` +
frame, once per directed edge and hop, at the step the client passes. So on any graph the counter
equals, row for row, the one `simulation.simulate` fills for a run with the same N, K, hops and
steps (tests/unit/test_wirecost.py checks it on the tiny model).

Why it is exact without a model: a frame's size depends only on which message ids it carries
(origin, step, k: the layout widths and the count) and never on a scalar's or a seed's value (v1
carries a fixed-width seed, v2 none), and which ids travel is decided by the flood alone. The
messages here carry seed 0 and scalar 1.0.

Assumes: the graph is connected (networkx graph with any hashable nodes, relabelled 0..n-1 in
sorted order, or a topology.Topology). Pure: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from seedflood import message
from seedflood import topology as topo
from seedflood.flooding import Flood, FloodError
from seedflood.message import Message
from seedflood.transport import HEADER, ByteCounter

Graph = nx.Graph | topo.Topology


def as_topology(graph: Graph) -> topo.Topology:
    """A topology.Topology of `graph` (a networkx graph's nodes become 0..n-1, in sorted order)."""
    if isinstance(graph, topo.Topology):
        return graph
    index = {v: i for i, v in enumerate(sorted(graph.nodes))}
    return topo.Topology("graph", len(index), tuple((index[a], index[b]) for a, b in graph.edges))


def schedule(top: topo.Topology, hops_per_step: int) -> tuple[int, int]:
    """(hops per step, delay) exactly as protocol.Protocol.of derives them (0 hops = the diameter)."""
    hops = hops_per_step or max(1, top.diameter)
    return hops, max(0, math.ceil(top.diameter / hops) - 1)


def count(
    graph: Graph,
    steps: int,
    *,
    hops_per_step: int = 1,
    perturbations: int = 1,
    version: int = message.VERSION,
    routed: bool = True,
) -> ByteCounter:
    """Bytes handed to the transport per (step, src, dst) by a run of `steps` steps, drain included.

    N is the graph's node count, K = `perturbations`; `hops_per_step` 0 means full flooding (the
    diameter). `routed`: forward along shortest paths only (topology.Topology.routes), as the
    runtime does; False: to every neighbour not known to have a message. Raises FloodError if a step is incomplete when due (cannot happen on a connected
    graph: the delay is derived from the diameter).
    """
    top = as_topology(graph)
    hops, delay = schedule(top, hops_per_step)
    n, k_max = top.n, perturbations
    floods = [Flood(i, top.neighbors(i), range(n), k_max, top.routes(i) if routed else None) for i in top.nodes]
    counter = ByteCounter()
    sizes: dict[tuple[tuple[int, int, int], ...], int] = {}  # ids in a frame -> bytes on the wire
    applied = -1

    def hop(t: int) -> None:
        outboxes = [f.outbox() for f in floods]
        for src, out in enumerate(outboxes):
            for dst, msgs in out.items():
                key = tuple(m.id for m in msgs)  # the frame's size is a function of its ids
                size = sizes.get(key)
                if size is None:
                    size = sizes[key] = HEADER + len(message.encode(msgs, version=version))
                counter.add(t, src, dst, size)
        for dst, f in enumerate(floods):  # every node receives after every node sent: one hop
            for src in f.peers:
                f.receive(src, outboxes[src][dst])

    def apply_through(upto: int) -> None:
        nonlocal applied
        while applied < upto:
            s = applied + 1
            for f in floods:
                if not f.is_complete(s):
                    raise FloodError(f"wirecost: step {s} incomplete at node {f.node} after its hops")
                f.pop_step(s)
            applied = s

    for t in range(steps):
        for f in floods:
            f.originate(Message(step=t, origin=f.node, k=k, seed=0, scalar=1.0) for k in range(k_max))
        for _ in range(hops):
            hop(t)
        apply_through(t - delay)
    while applied < steps - 1:  # client.drain: hop without originating until every step is applied
        t = applied + 1 + delay
        for _ in range(hops):
            hop(t)
        apply_through(min(t - delay, steps - 1))
    return counter


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
