"""The graph builders: ring, grid, torus, complete, star, tree, random_regular, erdos_renyi,
watts_strogatz, each a `graph.Topology` named after what it built (e.g. `ring16`, `torus8x16`).

Owns the builders and their limits (MAX_TRIES draws for a connected random graph; erdos_renyi
refuses more than MAX_GNP_NODES nodes; every builder counts its edges in closed form and refuses
more than graph.MAX_EDGES before it generates anything, so `complete:100000` is one line at once,
not a MemoryError). `topology.build` picks one by `TopologyConfig.kind`.

Assumes: builders make the graphs of the networkx generators they name, relabelled to 0..n-1 in
the order each builder documents (grid and torus: row-major); the shipped edge-list files pin that
numbering. The regular ones (ring, grid, torus, complete, star, tree) list their edges in pure
Python, so a run on them never imports networkx (about 0.3 s of CPU per launched process); the
random ones call networkx's generators, imported when one is drawn, take an explicit integer seed
and are deterministic for a given networkx version; a graph that must stay fixed across versions
belongs in an edge-list file (topofiles.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from seedflood.core.topology.graph import Edge, Topology, check_size, fail, is_int, known_diameter

if TYPE_CHECKING:
    import networkx as nx

MAX_TRIES = 100
"""Resamples a random builder makes before giving up on drawing a connected graph."""


MAX_GNP_NODES = 10_000
"""erdos_renyi: networkx's gnp_random_graph draws each of the n(n-1)/2 node pairs in Python
(20000 nodes took 23 s here); above this many nodes the builder refuses."""


def _check_size(name: str, n: int, edges: int = 0) -> None:
    """n >= 1, and the graph's `edges` (its closed form; n - 1 at least) within graph.MAX_EDGES."""
    # The generators below would quietly build an empty graph (or raise their own error) for n < 1.
    if not is_int(n) or n < 1:
        raise fail(name, f"needs at least 1 node, got {n!r}")
    check_size(name, n, edges)


def _ring_edges(n: int) -> Iterable[Edge]:
    """nx.cycle_graph's edges (i, i + 1 mod n) for n > 2; nx.path_graph's below."""
    return ((i, (i + 1) % n) for i in range(n if n > 2 else n - 1))


def ring(n: int) -> Topology:
    """nx.cycle_graph: node i is joined to i ± 1 mod n. A cycle needs 3 nodes: below that the ring
    is the path (one node; two nodes and one edge), with no self loop or doubled edge."""
    _check_size(f"ring{n}", n, n if n > 2 else n - 1)
    return Topology(f"ring{n}", n, tuple(_ring_edges(n)))


def _mesh(rows: int, cols: int, periodic: bool) -> tuple[Edge, ...]:
    """nx.grid_2d_graph's edges relabelled row-major: node (r, c) becomes r*cols + c (the sorted
    order of the (r, c) labels). With periodic, each dimension closes into a cycle, except
    dimensions of size 1 (a self loop) or 2 (the wrap edge already exists), as networkx does."""
    down = [(r * cols + c, (r + 1) * cols + c) for r in range(rows - 1) for c in range(cols)]
    right = [(r * cols + c, r * cols + c + 1) for r in range(rows) for c in range(cols - 1)]
    wrap_rows = [(c, (rows - 1) * cols + c) for c in range(cols)] if periodic and rows > 2 else []
    wrap_cols = [(r * cols, r * cols + cols - 1) for r in range(rows)] if periodic and cols > 2 else []
    return (*down, *right, *wrap_rows, *wrap_cols)


def _mesh_edges(rows: int, cols: int, periodic: bool) -> int:
    """The edges `_mesh` makes: each of the `cols` columns is a path of rows - 1 edges (a cycle
    of rows when periodic and rows > 2), and each of the `rows` rows likewise."""

    def line(size: int) -> int:
        return size if periodic and size > 2 else size - 1

    return cols * line(rows) + rows * line(cols)


def _factor(kind: str, n: int, rows: int) -> tuple[int, int]:
    """rows×cols = n; rows = 0 picks the most square factorisation (rows <= cols)."""
    _check_size(kind, n)  # n - 1 edges at least: a huge n is refused before the search for factors
    if rows == 0:
        rows = max(d for d in range(1, int(n**0.5) + 1) if n % d == 0)
    if rows < 1 or n % rows:
        raise fail(kind, f"{n} nodes cannot be split into {rows} rows")
    return rows, n // rows


def grid(n: int, rows: int = 0) -> Topology:
    """nx.grid_2d_graph, rows×cols, node r*cols + c."""
    rows, cols = _factor("grid", n, rows)
    check_size(f"grid{rows}x{cols}", n, _mesh_edges(rows, cols, periodic=False))
    top = Topology(f"grid{rows}x{cols}", n, _mesh(rows, cols, periodic=False))
    return known_diameter(top, rows + cols - 2)


def torus(n: int, rows: int = 0) -> Topology:
    """nx.grid_2d_graph(periodic=True), rows×cols, node r*cols + c."""
    rows, cols = _factor("torus", n, rows)
    check_size(f"torus{rows}x{cols}", n, _mesh_edges(rows, cols, periodic=True))
    top = Topology(f"torus{rows}x{cols}", n, _mesh(rows, cols, periodic=True))
    return known_diameter(top, rows // 2 + cols // 2)  # a ring of size s has diameter s // 2


def complete(n: int) -> Topology:
    """nx.complete_graph."""
    _check_size(f"complete{n}", n, n * (n - 1) // 2)
    return Topology(f"complete{n}", n, tuple((i, j) for i in range(n) for j in range(i + 1, n)))


def star(n: int) -> Topology:
    """nx.star_graph(n - 1): node 0 is the centre, 1..n-1 the leaves."""
    _check_size(f"star{n}", n, n - 1)
    return Topology(f"star{n}", n, tuple((0, leaf) for leaf in range(1, n)))


def tree(n: int) -> Topology:
    """nx.full_rary_tree(2, n): a binary tree in heap order, node i's children are 2i+1 and 2i+2."""
    _check_size(f"tree{n}", n, n - 1)
    return Topology(f"tree{n}", n, tuple(((child - 1) // 2, child) for child in range(1, n)))


def _attempt_seed(seed: int, attempt: int) -> int:
    # Attempt 0 uses the seed itself (so a connected draw equals networkx's own graph for it);
    # later attempts use independent seeds derived from (seed, attempt).
    if attempt == 0:
        return seed
    return int(np.random.SeedSequence([seed, attempt]).generate_state(1, np.uint32)[0])


def _check_seed(name: str, seed: int) -> None:
    if not is_int(seed) or seed < 0:
        raise fail(name, f"seed must be an integer >= 0, got {seed!r}")


def _connected_draw(name: str, n: int, draw: Callable[[int], nx.Graph], seed: int) -> Topology:
    """Redraw with derived seeds until the graph is connected; give up after MAX_TRIES."""
    _check_seed(name, seed)
    import networkx as nx  # here only: see the module doc

    for attempt in range(MAX_TRIES):
        g = draw(_attempt_seed(seed, attempt))
        if nx.is_connected(g):
            return Topology(name, n, tuple(g.edges))
    raise fail(name, f"no connected graph in {MAX_TRIES} draws; raise the density or change the seed")


def random_regular(n: int, degree: int, seed: int = 0) -> Topology:
    name = f"random_regular{n}_d{degree}_s{seed}"
    if not 0 <= degree < n:
        raise fail(name, f"degree must be in 0..{n - 1} (nodes - 1), got {degree}")
    if n * degree % 2:
        raise fail(name, f"nodes * degree must be even, got {n} * {degree}")
    if n > 2 and degree < 2:
        raise fail(name, f"degree {degree} cannot connect {n} nodes; use degree >= 2")
    check_size(name, n, n * degree // 2)
    import networkx as nx  # here only: see the module doc

    return _connected_draw(name, n, lambda s: nx.random_regular_graph(degree, n, seed=s), seed)


def erdos_renyi(n: int, p: float, seed: int = 0) -> Topology:
    name = f"erdos_renyi{n}_p{p:g}_s{seed}"
    if not 0.0 <= p <= 1.0:
        raise fail(name, f"p must be in [0, 1], got {p}")
    if n > 1 and p == 0.0:
        raise fail(name, f"p = 0 cannot connect {n} nodes")
    if n > MAX_GNP_NODES:
        raise fail(
            name,
            f"{n} nodes is above the {MAX_GNP_NODES} an erdos_renyi draw may have (builders.MAX_GNP_NODES: it "
            "draws every node pair); use random_regular or an edge-list file",
        )
    check_size(name, n, round(p * n * (n - 1) / 2), about=True)  # the expected count: p per node pair
    import networkx as nx  # here only: see the module doc

    return _connected_draw(name, n, lambda s: nx.gnp_random_graph(n, p, seed=s), seed)


def watts_strogatz(n: int, k: int, p: float, seed: int = 0) -> Topology:
    """Ring lattice with k/2 neighbours on each side, each edge rewired with probability p."""
    name = f"watts_strogatz{n}_k{k}_p{p:g}_s{seed}"
    if k < 2 or k % 2 or k >= n:
        raise fail(name, f"k must be even and in 2..{n - 1} (below the node count), got {k}")
    if not 0.0 <= p <= 1.0:
        raise fail(name, f"p must be in [0, 1], got {p}")
    _check_seed(name, seed)
    check_size(name, n, n * k // 2)  # the ring lattice's n·k/2 edges; rewiring moves edges, never adds one
    import networkx as nx  # here only: see the module doc

    try:
        g = nx.connected_watts_strogatz_graph(n, k, p, tries=MAX_TRIES, seed=seed)
    except nx.NetworkXError:
        raise fail(name, f"no connected graph in {MAX_TRIES} draws; lower p or raise k") from None
    return Topology(name, n, tuple(g.edges))
