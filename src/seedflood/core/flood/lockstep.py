"""The lockstep flood: every node's real `Flood` in one process, hopping in the client's schedule.

Owns:
- `Lockstep`: one real `flooding.Flood` per node, driven in the client's exact schedule
  (`schedule.StepSchedule`, the one roles/strict.py runs: originate K messages, `hops` hops,
  apply step t − delay; with overlap, apply before originating; then drain). A hop is every node's outbox, then every node receives.
  Every outbox is encoded with the real codec (`message.encode`) and counted as the transport
  counts it: `transport.HEADER` + frame, once per directed edge and hop, at the step the client
  passes. With `wire` (the run's `Protocol.wire_limits`) every frame is also decoded against the
  receiver's limits and the decoded messages are delivered, exactly as a client takes them off
  the wire; without it (the byte projection) the messages are delivered as they are and frame
  sizes are cached by the ids they carry. A step is handed out only when every node holds the
  same complete set (else `FloodError`). `roles.sharedmodel` drives it with real estimates and
  one model; `bench.wirecost.count` with placeholder messages.
- `cumulative_per_edge`: the run-directory contract's `bytes_per_edge_cumulative`.
- `as_topology`: a networkx graph as a `graph.Topology`.

Assumes: the graph is connected (networkx graph with any hashable nodes, relabelled 0..n-1 in
sorted order, or a graph.Topology). Pure: no torch; networkx only for type checking (a caller
that passes a networkx graph has imported it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias, TypeGuard

from seedflood.core.flood.flooding import Flood, FloodError, Item, MessageId, NoteId
from seedflood.core.flood.schedule import StepSchedule
from seedflood.core.flood.transport import EVALUATOR, HEADER, ByteCounter
from seedflood.core.topology.graph import Topology
from seedflood.core.wire import message
from seedflood.core.wire.message import Limits, Message

if TYPE_CHECKING:
    import networkx as nx

Graph: TypeAlias = "nx.Graph | Topology"
Estimate = Callable[[int], Mapping[int, Sequence[Message]]]
"""step t -> node -> that node's K messages of step t (what each client originates)."""
Apply = Callable[[int, list[Message]], None]
"""Called once per step, in order, with the complete step every node holds."""


def as_topology(graph: Graph) -> Topology:
    """A graph.Topology of `graph` (a networkx graph's nodes become 0..n-1, in sorted order)."""
    if isinstance(graph, Topology):
        return graph
    index = {v: i for i, v in enumerate(sorted(graph.nodes))}
    return Topology("graph", len(index), tuple((index[a], index[b]) for a, b in graph.edges))


class Driver:
    """The client's step schedule over a lockstep flood (`run`, `drain`, `run_hops`): what
    `Lockstep` (a Flood per node) and `lockarrays.ArrayLockstep` (arrays) share. A subclass
    owns `originate`, `hop`, `apply_through`, and sets `hops`, `delay`, `overlap`, `applied`."""

    hops: int
    delay: int
    overlap: bool
    applied: int

    def originate(self, node: int, msgs: Sequence[Message]) -> None:
        raise NotImplementedError

    def hop(self, t: int) -> None:
        raise NotImplementedError

    def apply_through(self, upto: int, apply: Apply) -> None:
        raise NotImplementedError

    # -- the schedule --------------------------------------------------------------------------------
    def run(
        self,
        steps: int,
        estimate: Estimate,
        apply: Apply,
        *,
        start: int = 0,
        stop: int | None = None,
        after_step: Callable[[int], None] | None = None,
    ) -> None:
        """Local steps start..stop-1 of a run of `steps` (default: to the end, then drain), each:
        estimate(t), then as client.Client.step (plain: originate, hops, apply t − delay;
        overlap: apply t − delay, originate, hops: the hops the client runs on a thread during
        step t+1's estimates run here before them, which changes nothing: estimates never touch
        the flood). `after_step(t)` after each local step."""
        stop = steps if stop is None else stop
        sched = StepSchedule(steps, self.delay, self.overlap)
        for t in range(start, stop):
            own = estimate(t)
            if sched.apply_first:
                self.apply_through(sched.applies_through(t), apply)
            for node, msgs in own.items():
                self.originate(node, msgs)
            self.run_hops(t)
            if not sched.apply_first:
                self.apply_through(sched.applies_through(t), apply)
            if after_step is not None:
                after_step(t)
        if stop == steps:
            self.drain(steps, apply, hops_in_flight=self.overlap and stop > start)

    def drain(self, steps: int, apply: Apply, hops_in_flight: bool = False) -> None:
        """client.Client.drain: after the last step, hop without originating until every step is
        applied. The lag is delay − overlap (drain estimates nothing, so overlap's extra step is
        not paid); `hops_in_flight`: the last step's hops ran with overlap (the client joins
        them first and applies what they completed)."""
        sched = StepSchedule(steps, self.delay, self.overlap)
        if hops_in_flight:
            self.apply_through(sched.drained_through(sched.last), apply)
        t = sched.last  # the hops of every local step through the last have run
        while self.applied < sched.last:
            t = sched.drain_hop(self.applied, t)
            self.run_hops(t)
            self.apply_through(sched.drained_through(t), apply)

    def run_hops(self, t: int) -> None:
        for _ in range(self.hops):
            self.hop(t)


class Lockstep(Driver):
    """Every node's real Flood, hopping in lockstep in one process (see the module doc)."""

    def __init__(
        self,
        top: Topology,
        perturbations: int,
        hops: int,
        delay: int,
        *,
        overlap: bool = False,
        routed: bool = True,
        wire: Callable[[int], Limits] | None = None,
        version: int = message.VERSION,
        counter: ByteCounter | None = None,
        due: Callable[[int, int], bool] | None = None,
    ) -> None:
        """`hops`, `delay`, `overlap` as in protocol.Protocol (delay includes overlap's extra
        step). `routed`: forward along shortest paths only (graph.Topology.routes), as the
        runtime does; False: to every neighbour not known to have a message. `wire(t)`: the
        limits a client decodes the frames of step t's hops against (None: no decoding).
        `due`: which origins originate at which step (protocol.Protocol.due; None: all, always)."""
        self.top = top
        self.hops, self.delay, self.overlap = hops, delay, overlap
        self.wire = wire
        self.version = version
        self.counter = counter if counter is not None else ByteCounter()
        self.floods = [
            Flood(i, top.neighbors(i), range(top.n), perturbations, top.routes(i) if routed else None, due=due)
            for i in top.nodes
        ]
        self.applied = -1
        """Every step <= this was handed out (at every node)."""
        self._sizes: dict[tuple[MessageId | NoteId, ...], int] = {}  # ids in a frame -> bytes (no `wire`)

    # -- resume ------------------------------------------------------------------------------------
    def restore(self, records: Sequence[tuple[int, Sequence[Message]]]) -> int:
        """Stand where every client of a run resumed from these L logged steps stands (as
        client.Client.resume): steps < L − delay applied, the rest held complete by everyone and
        never sent. Returns that cut, L − delay (at least 0): the caller applies records[:cut]."""
        if self.applied >= 0:
            raise FloodError("lockstep: restore must come before the first step")
        cut = max(0, len(records) - self.delay)
        for f in self.floods:
            f.applied_through = cut - 1
            for _, msgs in records[cut:]:
                f.restore(msgs)
        self.applied = cut - 1
        return cut

    def hop(self, t: int) -> None:
        """One hop of local step t: every node's outbox goes out (counted), then every node
        receives from each neighbour in neighbour order (as client.Client.hop)."""
        outboxes = [f.outbox() for f in self.floods]
        delivered: list[dict[int, Sequence[Item]]] = []
        limits = self.wire(t) if self.wire is not None else None
        for src, out in enumerate(outboxes):
            got: dict[int, Sequence[Item]] = {}
            for dst, items in out.items():
                if limits is None:
                    key = tuple(m.id for m in items)  # the frame's size is a function of its ids
                    size = self._sizes.get(key)
                    if size is None:  # (a note's id is never a message's: a frame with one is new here)
                        frame = message.encode(_frame(items, src, dst), version=self.version)
                        size = self._sizes[key] = HEADER + len(frame)
                    got[dst] = items
                else:
                    frame = message.encode(_frame(items, src, dst), version=self.version)
                    size = HEADER + len(frame)
                    try:
                        got[dst] = message.decode(frame, limits)
                    except message.FrameError as e:
                        raise message.FrameError(f"node {dst}: bad frame from node {src} at step {t}: {e}") from None
                self.counter.add(t, src, dst, size)
            delivered.append(got)
        for dst, f in enumerate(self.floods):  # every node receives after every node sent: one hop
            for src in f.peers:
                f.receive(src, delivered[src][dst])

    def originate(self, node: int, msgs: Sequence[Message]) -> None:
        self.floods[node].originate(msgs)

    def apply_through(self, upto: int, apply: Apply) -> None:
        """Hand out every step <= upto once, in order; each must be complete at every node, with
        the same messages everywhere (else the topology, hops or flood are wrong)."""
        while self.applied < upto:
            s = self.applied + 1
            held = []
            for f in self.floods:
                if not f.is_complete(s):
                    raise FloodError(
                        f"lockstep: step {s} incomplete at node {f.node} after its hops (missing {f.missing(s)[:4]})"
                    )
                held.append(f.pop_step(s))
            for f, msgs in zip(self.floods[1:], held[1:]):
                if msgs != held[0]:
                    raise FloodError(f"lockstep: node {f.node} holds other messages of step {s} than node 0")
            self.applied = s
            apply(s, held[0])


def _frame(items: list[Item], src: int, dst: int) -> list[Message]:
    """`items` of an outbox as the messages the codec frames: a lockstep flood originates
    messages only (no churn, no votes, no tolerated conflicts whose COPY notes would flood), so
    a note among them is a FloodError."""
    if not _messages_only(items):
        raise FloodError(f"lockstep: node {src} has a note to send node {dst} (no churn here)")
    return items


def _messages_only(items: list[Item]) -> TypeGuard[list[Message]]:
    return all(isinstance(m, Message) for m in items)


def cumulative_per_edge(counter: ByteCounter, directed_edges: int, steps: int) -> list[float]:
    """Mean over `directed_edges` of the cumulative bytes after each step 0..steps-1 (the
    run-directory contract's `bytes_per_edge_cumulative`). Bytes counted at local steps beyond
    the last (the drain) are in the last entry; the evaluator's channel is not an edge."""
    per_step = [0] * steps
    for s, _, dst, n in counter.rows():
        if dst != EVALUATOR and steps:
            per_step[min(max(s, 0), steps - 1)] += n
    out, total = [], 0
    for n in per_step:
        total += n
        out.append(total / directed_edges if directed_edges else 0.0)
    return out
