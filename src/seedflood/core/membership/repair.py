"""Graph repair: the edges a committed step that leaves members out adds between the members that
remain, a pure function of the committed graph and roster (docs/churn-design.md, Graph repair).

Owns `repair` and the graph measures it needs (`parts`, `diameter`). The rule works on the graph
of the members only (an edge to a non-member carries nothing) and adds edges in three passes,
each taking candidates in one fixed order, so every client that holds the same graph and roster
adds the same edges:
1. links: each member with fewer than t = min(k, members − 1) links, fewest links first, then
   founders before new ids, then lowest id, links to the members it has no edge to, founders
   first, then fewest links, then lowest id (`growth.Growth.attach`'s order), until it has t;
2. one part: while the members' graph has more than one part, the part with the second-lowest
   id links its first member in the order of pass 1 to the first of the part with the lowest id;
3. diameter: while the members' graph has a diameter over `bound`, the farthest pair (the lowest
   ids first) links.
So afterwards every member has at least min(k, members − 1) links, the members' graph is
connected and its diameter is at most `bound` (a bound >= 1: pass 3 ends at the latest at the
complete graph, diameter 1). Where nothing is under-linked, split or too wide, it adds nothing.

Assumes: pure Python (the core); node ids are ints, `new(n)` tells a brand-new id from a founder.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Mapping

Adjacency = Mapping[int, Collection[int]]
Edge = tuple[int, int]  # its two ends (`repair` names the lower id first)


def _distances(adj: Mapping[int, set[int]], source: int) -> dict[int, int]:
    """Hops from `source` to every node it reaches (BFS)."""
    seen = {source: 0}
    todo = deque([source])
    while todo:
        n = todo.popleft()
        for q in adj[n]:
            if q not in seen:
                seen[q] = seen[n] + 1
                todo.append(q)
    return seen


def _induced(graph: Adjacency, members: Collection[int]) -> dict[int, set[int]]:
    live = set(members)
    return {m: {q for q in graph.get(m, ()) if q in live and q != m} for m in live}


def parts(graph: Adjacency, members: Collection[int]) -> list[frozenset[int]]:
    """The connected parts of the members' graph, ordered by their lowest id."""
    adj = _induced(graph, members)
    out: list[frozenset[int]] = []
    for m in sorted(adj):
        if not any(m in p for p in out):
            out.append(frozenset(_distances(adj, m)))
    return out


def diameter(graph: Adjacency, members: Collection[int]) -> int | None:
    """The members' graph's diameter in hops (0 for one member or none), None when it is split."""
    adj = _induced(graph, members)
    far = 0
    for m in adj:
        d = _distances(adj, m)
        if len(d) < len(adj):
            return None
        far = max(far, *d.values())
    return far


def repair(graph: Adjacency, members: Collection[int], k: int, bound: int, new: Callable[[int], bool]) -> list[Edge]:
    """The edges (low, high) to add among `members` (module docstring), in the order added."""
    if bound < 1:
        raise ValueError(f"the diameter bound must be at least 1, got {bound}")
    adj = _induced(graph, members)
    added: list[Edge] = []

    def link(a: int, b: int) -> None:
        adj[a].add(b)
        adj[b].add(a)
        added.append((min(a, b), max(a, b)))

    def first(nodes: Collection[int]) -> int:  # pass 1's order of the members to repair
        return min(nodes, key=lambda n: (len(adj[n]), new(n), n))

    want = min(k, len(adj) - 1)
    for m in sorted(adj, key=lambda n: (len(adj[n]), new(n), n)):
        while len(adj[m]) < want:
            link(m, min((q for q in adj if q != m and q not in adj[m]), key=lambda q: (new(q), len(adj[q]), q)))
    while len(split := parts(adj, adj)) > 1:
        link(first(split[1]), first(split[0]))
    while (d := diameter(adj, adj)) is not None and d > bound:
        dist = {m: _distances(adj, m) for m in sorted(adj)}
        a, b = min((a, b) for a in dist for b, h in dist[a].items() if a < b and h == d)
        link(a, b)
    return added
