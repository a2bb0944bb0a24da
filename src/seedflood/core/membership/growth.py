"""Open membership: the edges of a brand-new node id, a pure function of the committed history.

Owns `Growth` (docs/churn-design.md, A new id joins): the starting topology (its adjacency and
its N founders, ids 0..N-1) and the rule that gives a new id j >= N its edges. A sponsor admits j
at step e (its JOIN note names e); j's edges are then the `links` members with the fewest links
in the graph committed through step b = e - `lag`, founders before new ids, then fewest links,
then lowest id. `lag` is chosen so that every sponsor has committed b when it sponsors (it has
applied step t - 1 - delay before step t, and e = t + delay + 1), so the sponsor, the newcomer
(whose catch-up holds b) and every member that has committed b compute the same edges; once a
committed step admits j, its edges are part of the graph every later rule reads (`graph`).
A JOIN committed without j adds no edge. A new id already in the graph (it joined, left, and is
started again) keeps its edges.

Bound: a new id links to founders while at least `links` of them are members, so while every
founder is a member and the founders' graph has diameter D, every new id is one hop from it and
the graph's diameter is at most D + 2 (new id - founder - ... - founder - new id).

Graph repair (`repair`, churn.repair; docs/churn-design.md, Graph repair): a committed step that
leaves members out also adds the edges `repair.repair` gives the graph committed through that
step (its joins included) and the members after it: every member then has at least
min(links, members - 1) links, the members' graph is connected and its diameter is at most
`bound`, the starting topology's D (the diameter the run's delay was computed for). Every client
that commits the step computes the same edges; they are part of the graph every later rule reads.

A vote's spread (`spread`): the hops a vote needs to cross the widest connected part of the
members' committed graph with the edges of the newcomers a client holds a JOIN note for; joins
may widen the graph beyond D, so a voter waits that long in a ballot's view before leaving it
(docs/churn-design.md, Liveness). Timing only: it changes no vote's content.

Assumes: pure Python (the core); `changes` are committed changes (step -> Change), as
`membership.Roster.changes` holds them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from seedflood.core.membership import repair as repairs
from seedflood.core.membership.roster import Change

Adjacency = dict[int, frozenset[int]]
Added = tuple[int, int | None, tuple[repairs.Edge, ...]]
"""(committed step, the new id it admitted or None for graph repair, the edges that added)."""


def members_after(founders: int, changes: Mapping[int, Change], step: int) -> frozenset[int]:
    """The members after committed step `step` (the founders before step 0)."""
    members = set(range(founders))
    for s in sorted(s for s in changes if s <= step):
        members = (members - set(changes[s].leave)) | {o for o, _ in changes[s].join}
    return frozenset(members)


@dataclass(frozen=True)
class Growth:
    """The starting topology and the rule that links a new id (module docstring)."""

    base: Mapping[int, Sequence[int]]
    """The starting topology's adjacency: founder -> its neighbours."""
    links: int
    """k: how many members a new id links to (the topology's minimum degree, at least 2)."""
    lag: int
    """b = e - lag: the committed step whose graph and roster decide the edges of a join at e."""
    repair: bool = False
    """churn.repair: a committed step that leaves members out adds `repair.repair`'s edges."""

    @classmethod
    def of(cls, base: Mapping[int, Sequence[int]], delay: int, repair: bool = False) -> Growth:
        """The rule for a run of this topology and delay (lag = 2·(delay + 1): see the module
        docstring)."""
        k = max(2, min((len(ps) for ps in base.values()), default=2))
        return cls({n: tuple(sorted(ps)) for n, ps in base.items()}, k, 2 * (delay + 1), repair)

    @cached_property
    def bound(self) -> int:
        """D: the starting topology's diameter (at least 1), which graph repair keeps the members'
        graph within."""
        return max(1, repairs.diameter(self.base, self.base) or 0)

    @property
    def founders(self) -> int:
        return len(self.base)

    def new(self, node: int) -> bool:
        """`node` is not one of the starting topology's."""
        return node >= self.founders

    def attach(self, graph: Adjacency, members: Collection[int], node: int) -> tuple[int, ...]:
        """The members `node` links to: founders first, then fewest links, then lowest id."""
        order = sorted((m for m in members if m != node), key=lambda m: (self.new(m), len(graph.get(m, ())), m))
        return tuple(sorted(order[: self.links]))

    def graph(self, changes: Mapping[int, Change], through: int) -> Adjacency:
        """The graph after committed step `through`: the starting topology plus the edges of
        every new id a committed change through `through` admitted and, with `repair`, those
        repair added, in step order."""
        return self._adjacency(self._added(changes, through))

    def repaired(self, changes: Mapping[int, Change], step: int) -> tuple[repairs.Edge, ...]:
        """The edges graph repair adds at committed step `step` (none unless `repair` is on and
        that step's change leaves someone out). Needs every change through `step`."""
        if not self.repair or step not in changes or not changes[step].leave:
            return ()
        return next(e for s, j, e in reversed(self._added(changes, step)) if s == step and j is None)

    def _added(self, changes: Mapping[int, Change], through: int) -> list[Added]:
        """What each committed step through `through` added, in step order: a join's (step, new
        id, its edges), then, with `repair`, a leave's (step, None, the edges repair added)."""
        added: list[Added] = []
        joined: set[int] = set()
        for e in sorted(s for s in changes if s <= through):
            for j, _ in changes[e].join:
                if not self.new(j) or j in joined:
                    continue  # a founder or a new id that joined before keeps its edges
                joined.add(j)
                b = e - self.lag
                before = self._adjacency([a for a in added if a[0] <= b])
                edges = self.attach(before, members_after(self.founders, changes, b), j)
                added.append((e, j, tuple((j, q) for q in edges)))
            if self.repair and changes[e].leave:
                graph, members = self._adjacency(added), members_after(self.founders, changes, e)
                added.append((e, None, tuple(repairs.repair(graph, members, self.links, self.bound, self.new))))
        return added

    def edges(self, node: int, step: int, changes: Mapping[int, Change]) -> tuple[int, ...]:
        """The neighbours new id `node` has once a committed step `step` admits it. Needs every
        change through step - lag (a client that has committed that far holds them)."""
        b = step - self.lag
        graph = self.graph(changes, b)
        if node in graph:
            return tuple(sorted(graph[node]))
        return self.attach(graph, members_after(self.founders, changes, b), node)

    def spread(self, changes: Mapping[int, Change], through: int, pending: Mapping[int, int]) -> int:
        """The largest diameter (hops) of a connected part of the graph committed through step
        `through`, over its members and the newcomers in `pending` (new id -> the JOIN step its
        note names) with the edges the rule gives them; a newcomer whose edges this client cannot
        compute yet (its JOIN step is more than `lag` past `through`) is left out."""
        graph = {n: set(ps) for n, ps in self.graph(changes, through).items()}
        nodes = set(members_after(self.founders, changes, through))
        for j, e in sorted(pending.items()):
            if j in nodes or e - self.lag > through:
                continue
            nodes.add(j)
            for q in self.edges(j, e, changes):
                graph.setdefault(j, set()).add(q)
                graph.setdefault(q, set()).add(j)
        far = 0
        for n in sorted(nodes):  # BFS from every node, within `nodes`: the graphs are tiny
            seen, frontier, d = {n}, [n], 0
            while frontier:
                frontier = [q for x in frontier for q in sorted(graph.get(x, ())) if q in nodes and q not in seen]
                seen.update(frontier)
                d += bool(frontier)
            far = max(far, d)
        return far

    def _adjacency(self, added: Sequence[Added]) -> Adjacency:
        adj = {n: set(ps) for n, ps in self.base.items()}
        for _, j, edges in added:
            if j is not None:
                adj.setdefault(j, set())  # a new id is in the graph once admitted, even alone
            for a, b in edges:
                adj.setdefault(a, set()).add(b)
                adj.setdefault(b, set()).add(a)
        return {n: frozenset(ps) for n, ps in adj.items()}
