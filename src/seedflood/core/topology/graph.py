"""The client graph as a value: who floods messages to whom.

Owns `Topology`: an immutable, validated undirected graph on nodes 0..n-1 (connected, no self
loops, no duplicate edges, at most MAX_EDGES edges) with O(1) neighbour lookup, degrees,
eccentricities, BFS distances, per-origin routes and the diameter (the number of hops a flood
needs to reach everyone; exact, by closed form, double sweep or eccentricity bounding within
MAX_BFS_VISITS); `TopologyError` and the helpers the builders and the file reader share (`fail`,
`is_int`, `known_diameter`, `check_size`: the size bound, checked before anything is built).

Assumes: pure Python + numpy (networkx only inside `to_networkx`: importing it costs a launched
process about 0.3 s of CPU, and no run needs it). Every problem raises `TopologyError` with one
line naming the topology (or file) and what is wrong.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import InitVar, dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import networkx as nx


class TopologyError(ValueError):
    """A bad topology, spec or edge-list file; the message is one line naming the problem."""


def fail(where: str, problem: str) -> TopologyError:
    return TopologyError(f"topology {where}: {problem}")


Edge = tuple[int, int]


@dataclass(frozen=True)
class Topology:
    """A connected undirected graph on nodes 0..n-1; edges are normalised to sorted (i < j) pairs.

    `where` only labels error messages (e.g. the file the graph came from); it is not stored.
    """

    name: str
    n: int
    edges: tuple[Edge, ...]
    where: InitVar[str | None] = None
    _adj: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self, where: str | None) -> None:
        label = where or self.name
        if not is_int(self.n) or self.n < 1:
            raise fail(label, f"needs at least 1 node, got {self.n!r}")
        check_size(label, self.n, len(self.edges))  # before anything below holds n nodes or the edges twice
        edges = _normalise_edges(label, self.n, self.edges)
        adj: list[list[int]] = [[] for _ in range(self.n)]
        for i, j in edges:
            adj[i].append(j)
            adj[j].append(i)
        reach = _component(adj, 0)
        if len(reach) < self.n:
            far = next(v for v in range(self.n) if v not in reach)
            raise fail(label, f"not connected ({_count_components(adj)} components; node 0 cannot reach node {far})")
        # Frozen: the normalised edges and derived tables are set once, here.
        object.__setattr__(self, "n", int(self.n))
        object.__setattr__(self, "edges", edges)
        object.__setattr__(self, "_adj", tuple(tuple(sorted(a)) for a in adj))

    def neighbors(self, i: int) -> tuple[int, ...]:
        """Sorted neighbours of node i."""
        return self._adj[self._node(i)]

    def degree(self, i: int) -> int:
        return len(self._adj[self._node(i)])

    @property
    def nodes(self) -> range:
        return range(self.n)

    @property
    def max_degree(self) -> int:
        return max(map(len, self._adj))

    @property
    def min_degree(self) -> int:
        return min(map(len, self._adj))

    @cached_property
    def eccentricities(self) -> tuple[int, ...]:
        """Hops from each node to the node farthest from it (one BFS per node: O(n·m); the
        diameter does not need it)."""
        return tuple(max(self.bfs(v)) for v in range(self.n))

    def eccentricity(self, i: int) -> int:
        return self.eccentricities[self._node(i)]

    @cached_property
    def diameter(self) -> int:
        """Hops a flood needs to reach every node from any origin (0 for a single node).

        Exact without all pairs (which took hours at 100000 nodes): a closed form for the graphs
        the builders make (ring, grid, torus, complete, star), a double sweep for a tree, and
        otherwise eccentricity bounding (Takes & Kosters 2011), which settles random and
        small-world graphs in a few BFS; a graph it cannot settle within MAX_BFS_VISITS edge
        visits is refused (TopologyError naming the limit) rather than left computing."""
        return _diameter(self)

    @cached_property
    def distances(self) -> tuple[tuple[int, ...], ...]:
        """distances[a][b]: hops on a shortest path between nodes a and b (O(n²) memory: for
        the in-process baselines; `routes` does not use it)."""
        return tuple(tuple(self.bfs(a)) for a in range(self.n))

    def bfs(self, source: int) -> list[int]:
        """Hops from `source` to every node (index = node)."""
        return self._bfs(self._node(source)).tolist()

    @cached_property
    def _csr(self) -> tuple[np.ndarray, np.ndarray]:
        """The adjacency as CSR arrays (indptr, indices), for the vectorised BFS."""
        indptr = np.zeros(self.n + 1, dtype=np.int64)
        indptr[1:] = np.cumsum([len(a) for a in self._adj])
        indices = np.fromiter((w for a in self._adj for w in a), dtype=np.int64, count=int(indptr[-1]))
        return indptr, indices

    def _bfs(self, source: int) -> np.ndarray:
        """Hops from `source` to every node, one numpy pass per BFS level."""
        indptr, indices = self._csr
        dist = np.full(self.n, -1, dtype=np.int64)
        dist[source] = 0
        frontier = np.array([source], dtype=np.int64)
        seen = np.zeros(self.n, dtype=bool)  # this level's new nodes, deduplicated by scatter: no sort
        d = 0
        while frontier.size:
            d += 1
            starts, counts = indptr[frontier], indptr[frontier + 1] - indptr[frontier]
            total = int(counts.sum())
            if not total:
                break
            offsets = np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(total)
            found = indices[offsets]
            seen[found[dist[found] < 0]] = True
            frontier = np.flatnonzero(seen)  # sorted, each node once: what np.unique gave, O(n) a level
            seen[frontier] = False
            dist[frontier] = d
        return dist

    def routes(self, i: int) -> dict[int, tuple[int, ...]]:
        """Per origin o: the neighbours p of node i one hop further from o (dist(o, p) =
        dist(o, i) + 1). Forwarding o's messages only to them still delivers every message to
        every node at hop dist(o, node), the hop full flooding delivers it, so completeness and
        the bits are unchanged; what is saved is the copies sent back towards o or sideways
        (on a complete graph every message then crosses N - 1 edges instead of N(N - 1)).
        Distances are symmetric, so one BFS from i and one from each neighbour suffice:
        O(degree · m), not all pairs."""
        mine = self.bfs(i)
        theirs = {p: self.bfs(p) for p in self.neighbors(i)}
        return {o: tuple(p for p in self.neighbors(i) if theirs[p][o] == mine[o] + 1) for o in self.nodes}

    def to_networkx(self) -> nx.Graph:
        """A fresh networkx graph of this topology (nodes 0..n-1) the caller may mutate."""
        import networkx as nx  # here only: see the module doc

        graph = nx.Graph()
        graph.add_nodes_from(range(self.n))
        graph.add_edges_from(self.edges)
        return graph

    def _node(self, i: int) -> int:
        if not is_int(i) or not 0 <= i < self.n:
            raise fail(self.name, f"node {i!r} outside 0..{self.n - 1}")
        return int(i)


MAX_EDGES = 250_000
"""Edges a topology may have; a bigger graph is refused in one line before it is built (`check_size`;
the builders count their edges in closed form first). In a launched run every edge is a gloo
connection between two client processes (a 2-rank group and a heartbeat thread at each end in a
churn run), and a Topology holds its edges in Python (several hundred bytes each). The bound keeps
every preflight within seconds: at it, on 2 busy cores, complete707 (249,571 edges) built in 2 s
of CPU, ring250000 in 5 s, and random_regular at 166,666 nodes drew and built in 11 s, then was
refused after MAX_BFS_VISITS in 9 s more. Before it, complete10000 (49,995,000 edges) ended in a
MemoryError after 41 s and complete100000 grew past 12 GB."""


def check_size(where: str, nodes: int, edges: int, about: bool = False) -> None:
    """Refuse a graph of more than MAX_EDGES edges: `edges` counted, or in closed form by a
    builder before it draws anything (`about`: an expected count, erdos_renyi's). A connected
    graph on `nodes` nodes has at least nodes - 1 edges, so a huge node count is refused too."""
    least = max(edges, nodes - 1)
    if least <= MAX_EDGES:
        return
    count = (
        f"{'about ' if about else ''}{edges:,} edges"
        if edges == least
        else f"at least {least:,} edges ({nodes:,} nodes)"
    )
    raise fail(
        where,
        f"{count} is above the {MAX_EDGES:,} a topology may have (graph.MAX_EDGES: each edge is a gloo connection "
        "between two clients, and a larger graph takes more than seconds to build and check); use fewer nodes "
        "or a sparser kind",
    )


MAX_BFS_VISITS = 100_000_000
"""Edge visits the diameter of an irregular graph may take (at most about 7 s here) before the
graph is refused: its eccentricity bounds did not meet. Measured: random_regular 5000 nodes
settles in 1.8 s; random_regular and watts_strogatz (p=0.1) of 100000 nodes, whose
eccentricities are all alike, are refused after about 5 s; rings, grids, tori, trees, stars and
complete graphs of any size take a closed form or two BFS."""


def known_diameter(top: Topology, diameter: int) -> Topology:
    """`top` with its diameter set by a builder that knows it in closed form."""
    top.__dict__["diameter"] = diameter  # the cached_property's slot
    return top


def _diameter(top: Topology) -> int:
    n, m = top.n, len(top.edges)
    if n == 1:
        return 0
    if m == n * (n - 1) // 2:
        return 1
    if m == n - 1:  # connected with n - 1 edges: a tree; a double sweep is exact on trees
        far = int(np.argmax(top._bfs(0)))
        return int(top._bfs(far).max())
    if m == n and top.max_degree == 2:  # connected, every degree 2: a cycle
        return n // 2
    return _bounded_diameter(top)


def _bounded_diameter(top: Topology) -> int:
    """Exact diameter by eccentricity bounding (the algorithm of networkx's
    `diameter(usebounds=True)`, vectorised): a BFS from v gives ecc(v) and bounds every w's
    eccentricity within [max(d(v,w), ecc(v) − d(v,w)), ecc(v) + d(v,w)]; a node whose bounds
    met, or whose upper bound cannot beat the best lower bound, drops out. Sources alternate
    between the largest upper and the smallest lower bound. Raises TopologyError when it needs
    more than MAX_BFS_VISITS edge visits."""
    n = top.n
    lower = np.zeros(n, dtype=np.int64)
    upper = np.full(n, n, dtype=np.int64)
    live = np.ones(n, dtype=bool)
    diameter, visits, per_bfs, high = 0, 0, 2 * len(top.edges) + n, True
    while live.any():
        if visits + per_bfs > MAX_BFS_VISITS:
            raise fail(
                top.name,
                f"its diameter did not settle within {MAX_BFS_VISITS:,} edge visits (graph.MAX_BFS_VISITS; "
                f"{n} nodes, {len(top.edges)} edges): a graph this large and irregular is not supported",
            )
        v = int(np.argmax(np.where(live, upper, -1)) if high else np.argmin(np.where(live, lower, n + 1)))
        high = not high
        dist = top._bfs(v)
        visits += per_bfs
        ecc = int(dist.max())
        np.maximum(lower, np.maximum(dist, ecc - dist), out=lower)
        np.minimum(upper, ecc + dist, out=upper)
        lower[v] = upper[v] = ecc
        diameter = max(diameter, int(lower[live].max()))  # an eccentricity's lower bound bounds it
        live &= (upper > diameter) & (lower < upper)
    return diameter


def _component(adj: list[list[int]], source: int) -> set[int]:
    """The nodes `source` reaches (an iterative depth-first walk over adjacency lists)."""
    seen, todo = {source}, [source]
    while todo:
        for w in adj[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def _count_components(adj: list[list[int]]) -> int:
    """Connected components of the graph (only for the error message of one that is not)."""
    seen: set[int] = set()
    parts = 0
    for v in range(len(adj)):
        if v not in seen:
            seen |= _component(adj, v)
            parts += 1
    return parts


def is_int(x: Any) -> bool:
    # bool is an int to Python but never a node id; numpy integers are welcome.
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _normalise_edges(where: str, n: int, edges: Iterable[Any]) -> tuple[Edge, ...]:
    """Check every edge and return them as sorted (i < j) pairs, sorted, without duplicates."""
    seen: dict[Edge, Any] = {}
    for e in edges:
        if not isinstance(e, (tuple, list)) or len(e) != 2 or not all(map(is_int, e)):
            raise fail(where, f"edge {e!r} must be a pair of integer node ids")
        i, j = int(e[0]), int(e[1])
        for v in (i, j):
            if not 0 <= v < n:
                raise fail(where, f"edge ({i}, {j}) names node {v} outside 0..{n - 1}")
        if i == j:
            raise fail(where, f"edge ({i}, {j}) is a self loop")
        key = (min(i, j), max(i, j))
        if key in seen:
            raise fail(where, f"edge ({i}, {j}) duplicates edge {seen[key]}")
        seen[key] = (i, j)
    return tuple(sorted(seen))
