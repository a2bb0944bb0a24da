"""Where every origin's message travels in a lockstep flood, as arrays: the graph's side of
`lockarrays.ArrayLockstep`.

Owns `FloodTables`: the directed edges in the order a hop counts them (source ascending, then
its sorted neighbours), all-pairs BFS distances, and per relative hop r (hops since a message
was originated) the (origin, edge) pairs that carry the origin's messages at that hop. The rule
is flooding.Flood's, read off the distances (the graph is connected and every node originates at
once, so which copies travel is fixed by them):
- routed (graph.Topology.routes): node u forwards origin o's message, first held after
  dist(o, u) hops, to each neighbour w with dist(o, w) = dist(o, u) + 1, at hop r = dist(o, u);
- full flooding: to each neighbour that did not send it to u, i.e. dist(o, w) >= dist(o, u)
  (the neighbours at the same distance receive it at the same hop and echo it back, a duplicate).
A pair is `first` where it is the copy that is new at its receiver: the edge from the receiver's
smallest parent (a client receives from its neighbours in ascending order).

Assumes: a connected graph.Topology; memory O(n² + pairs): `cells` says what a build would
touch, so the caller (lockarrays.make) can decline a graph too large for arrays. Pure: numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seedflood.core.topology.graph import Topology

_CHUNK_CELLS = 1 << 22  # origin × edge cells compared at once while building


@dataclass(frozen=True, eq=False)
class HopPairs:
    """The pairs of one relative hop, sorted by (edge, origin)."""

    edge: np.ndarray  # (P,) int32 directed-edge index
    origin: np.ndarray  # (P,) int32
    starts: np.ndarray  # (U,) int64: where each present edge's run of pairs begins
    edges: np.ndarray  # (U,) int64: those edges
    first: np.ndarray  # (P,) bool: the copy that is new at its receiver
    senders: np.ndarray  # (n,) bool: origins that send at this hop


@dataclass(frozen=True, eq=False)
class FloodTables:
    """Edges, distances and per-hop pairs of one graph (see the module doc)."""

    n: int
    src: np.ndarray  # (E,) int64
    dst: np.ndarray  # (E,) int64
    dist: np.ndarray  # (n, n) int32, dist[o, u]
    hops: tuple[HopPairs, ...]  # index r: the pairs sent at a message's (r+1)-th hop
    routed: bool

    @staticmethod
    def cells(top: Topology) -> int:
        """Origin × directed-edge cells a build compares (a bound on the pairs it keeps)."""
        return top.n * 2 * len(top.edges)

    @classmethod
    def of(cls, top: Topology, routed: bool) -> FloodTables:
        n = top.n
        src = np.fromiter((u for u in top.nodes for _ in top.neighbors(u)), dtype=np.int64)
        dst = np.fromiter((w for u in top.nodes for w in top.neighbors(u)), dtype=np.int64)
        dist = np.array([top.bfs(o) for o in top.nodes], dtype=np.int32).reshape(n, n)
        n_edges = len(src)
        rs, es, os_, firsts = [], [], [], []
        chunk = max(1, _CHUNK_CELLS // max(1, n_edges))
        for lo in range(0, n, chunk):
            d = dist[lo : lo + chunk]
            du, dw = d[:, src], d[:, dst]
            fwd = dw == du + 1
            sel = fwd if routed else dw >= du
            o, e = np.nonzero(sel)  # origin-major, edges ascending: a receiver's parents in order
            is_fwd = fwd[o, e]
            first = np.zeros(len(o), dtype=bool)
            key = (o[is_fwd].astype(np.int64) * n + dst[e[is_fwd]]) if len(o) else np.zeros(0, np.int64)
            _, at = np.unique(key, return_index=True)  # the first (smallest-parent) copy per (origin, receiver)
            first[np.flatnonzero(is_fwd)[at]] = True
            rs.append(du[o, e])
            es.append(e.astype(np.int32))
            os_.append((o + lo).astype(np.int32))
            firsts.append(first)
        r = np.concatenate(rs) if rs else np.zeros(0, np.int32)
        e = np.concatenate(es) if es else np.zeros(0, np.int32)
        o = np.concatenate(os_) if os_ else np.zeros(0, np.int32)
        first = np.concatenate(firsts) if firsts else np.zeros(0, bool)
        order = np.lexsort((o, e, r))
        r, e, o, first = r[order], e[order], o[order], first[order]
        bounds = np.searchsorted(r, np.arange(int(r.max()) + 2 if len(r) else 1))
        hops = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            he, ho = e[a:b], o[a:b]
            starts = np.flatnonzero(np.r_[True, he[1:] != he[:-1]]) if len(he) else np.zeros(0, np.int64)
            senders = np.zeros(n, dtype=bool)
            senders[ho] = True
            hops.append(HopPairs(he, ho, starts, he[starts].astype(np.int64), first[a:b], senders))
        return cls(n, src, dst, dist, tuple(hops), routed)
