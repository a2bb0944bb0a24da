"""The client graph: who floods messages to whom.

Owns:
- `Topology`: an immutable, validated undirected graph on nodes 0..n-1 (connected, no self loops,
  no duplicate edges) with O(1) neighbour lookup, degrees, eccentricities and the diameter (the
  number of hops a flood needs to reach everyone);
- `build(cfg)`: the builders named by `TopologyConfig.kind` (ring, grid, torus, complete, star,
  tree, random_regular, erdos_renyi, watts_strogatz, file);
- `parse_spec(text)`: the command-line form (`ring:16`, `torus:8x16`, `erdos_renyi:32:p=0.2:seed=3`,
  or a YAML path);
- the edge-list YAML format (`load_yaml`, `dump_yaml`) of the named graphs in the repository's
  top-level `topologies/` directory, shipped in the wheel as package data (`TOPOLOGY_DIR` finds
  them in either place);
- the rank mapping of docs/design.md §2: rank 0 is the evaluator, topology node i is rank i + 1;
- `describe(top)`: the text of `seedflood topology show`.

Assumes: pure Python + numpy + networkx + yaml. Builders are networkx generators relabelled to
0..n-1 in the order each builder documents (grid and torus: row-major); the shipped edge-list
files pin that numbering. Random builders take an explicit integer seed and are deterministic for
a given networkx version; a graph that must stay fixed across versions belongs in an edge-list
file. Every problem raises `TopologyError` with one line naming the
topology (or file) and what is wrong.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable
from dataclasses import InitVar, dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import yaml

from seedflood.core.config import ConfigError, TopologyConfig, read_yaml


def _shipped_dir() -> Path:
    """The named graphs: package data `seedflood/topologies/` in an installed wheel (setup.cfg maps
    the package `seedflood.topologies` to the top-level `topologies/` directory), else the source
    checkout's `topologies/` (an editable install imports seedflood from `src/`, which has no copy)."""
    packaged = resources.files("seedflood") / "topologies"
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[3] / "topologies"


TOPOLOGY_DIR = _shipped_dir()

EVALUATOR_RANK = 0
MAX_TRIES = 100
"""Resamples a random builder makes before giving up on drawing a connected graph."""


class TopologyError(ValueError):
    """A bad topology, spec or edge-list file; the message is one line naming the problem."""


def _fail(where: str, problem: str) -> TopologyError:
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
    _graph: nx.Graph = field(init=False, repr=False, compare=False)
    _adj: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self, where: str | None) -> None:
        label = where or self.name
        if not _is_int(self.n) or self.n < 1:
            raise _fail(label, f"needs at least 1 node, got {self.n!r}")
        edges = _normalise_edges(label, self.n, self.edges)
        graph = nx.Graph()
        graph.add_nodes_from(range(self.n))
        graph.add_edges_from(edges)
        if not nx.is_connected(graph):
            reach = nx.node_connected_component(graph, 0)
            far = next(v for v in range(self.n) if v not in reach)
            parts = nx.number_connected_components(graph)
            raise _fail(label, f"not connected ({parts} components; node 0 cannot reach node {far})")
        # Frozen: the normalised edges and derived tables are set once, here.
        object.__setattr__(self, "n", int(self.n))
        object.__setattr__(self, "edges", edges)
        object.__setattr__(self, "_graph", graph)
        object.__setattr__(self, "_adj", tuple(tuple(sorted(graph.adj[v])) for v in range(self.n)))

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
        d = 0
        while frontier.size:
            d += 1
            starts, counts = indptr[frontier], indptr[frontier + 1] - indptr[frontier]
            total = int(counts.sum())
            if not total:
                break
            offsets = np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(total)
            found = indices[offsets]
            found = np.unique(found[dist[found] < 0])
            dist[found] = d
            frontier = found
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
        """A fresh copy the caller may mutate."""
        return self._graph.copy()

    def _node(self, i: int) -> int:
        if not _is_int(i) or not 0 <= i < self.n:
            raise _fail(self.name, f"node {i!r} outside 0..{self.n - 1}")
        return int(i)


MAX_BFS_VISITS = 100_000_000
"""Edge visits the diameter of an irregular graph may take (at most about 7 s here) before the
graph is refused: its eccentricity bounds did not meet. Measured: random_regular 5000 nodes
settles in 1.8 s; random_regular and watts_strogatz (p=0.1) of 100000 nodes, whose
eccentricities are all alike, are refused after about 5 s; rings, grids, tori, trees, stars and
complete graphs of any size take a closed form or two BFS."""
MAX_GNP_NODES = 10_000
"""erdos_renyi: networkx's gnp_random_graph draws each of the n(n-1)/2 node pairs in Python
(20000 nodes took 23 s here); above this many nodes the builder refuses."""


def _known_diameter(top: Topology, diameter: int) -> Topology:
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
            raise _fail(
                top.name,
                f"its diameter did not settle within {MAX_BFS_VISITS:,} edge visits (topology.MAX_BFS_VISITS; "
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


def _is_int(x: Any) -> bool:
    # bool is an int to Python but never a node id; numpy integers are welcome.
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _normalise_edges(where: str, n: int, edges: Iterable[Any]) -> tuple[Edge, ...]:
    """Check every edge and return them as sorted (i < j) pairs, sorted, without duplicates."""
    seen: dict[Edge, Any] = {}
    for e in edges:
        if not isinstance(e, (tuple, list)) or len(e) != 2 or not all(map(_is_int, e)):
            raise _fail(where, f"edge {e!r} must be a pair of integer node ids")
        i, j = int(e[0]), int(e[1])
        for v in (i, j):
            if not 0 <= v < n:
                raise _fail(where, f"edge ({i}, {j}) names node {v} outside 0..{n - 1}")
        if i == j:
            raise _fail(where, f"edge ({i}, {j}) is a self loop")
        key = (min(i, j), max(i, j))
        if key in seen:
            raise _fail(where, f"edge ({i}, {j}) duplicates edge {seen[key]}")
        seen[key] = (i, j)
    return tuple(sorted(seen))


# ----------------------------------------------------------------------------------- builders


def _check_size(name: str, n: int) -> None:
    # The generators below would quietly build an empty graph (or raise their own error) for n < 1.
    if not _is_int(n) or n < 1:
        raise _fail(name, f"needs at least 1 node, got {n!r}")


def _from_networkx(name: str, n: int, g: nx.Graph) -> Topology:
    """A generator's graph as a Topology; its nodes must already be the integers 0..n-1."""
    return Topology(name, n, tuple(g.edges))


def ring(n: int) -> Topology:
    """nx.cycle_graph: node i is joined to i ± 1 mod n. A cycle needs 3 nodes: below that the ring
    is the path (one node; two nodes and one edge), with no self loop or doubled edge."""
    _check_size(f"ring{n}", n)
    return _from_networkx(f"ring{n}", n, nx.cycle_graph(n) if n > 2 else nx.path_graph(n))


def _mesh(rows: int, cols: int, periodic: bool) -> nx.Graph:
    """nx.grid_2d_graph relabelled row-major: node (r, c) becomes r*cols + c (the sorted order of
    the (r, c) labels). With periodic, each dimension closes into a cycle, except dimensions of size
    1 (a self loop) or 2 (the wrap edge already exists): networkx skips those itself."""
    g = nx.grid_2d_graph(rows, cols, periodic=periodic)
    return nx.convert_node_labels_to_integers(g, ordering="sorted")


def _factor(kind: str, n: int, rows: int) -> tuple[int, int]:
    """rows×cols = n; rows = 0 picks the most square factorisation (rows <= cols)."""
    _check_size(kind, n)
    if rows == 0:
        rows = max(d for d in range(1, int(n**0.5) + 1) if n % d == 0)
    if rows < 1 or n % rows:
        raise _fail(kind, f"{n} nodes cannot be split into {rows} rows")
    return rows, n // rows


def grid(n: int, rows: int = 0) -> Topology:
    """nx.grid_2d_graph, rows×cols, node r*cols + c."""
    rows, cols = _factor("grid", n, rows)
    top = _from_networkx(f"grid{rows}x{cols}", n, _mesh(rows, cols, periodic=False))
    return _known_diameter(top, rows + cols - 2)


def torus(n: int, rows: int = 0) -> Topology:
    """nx.grid_2d_graph(periodic=True), rows×cols, node r*cols + c."""
    rows, cols = _factor("torus", n, rows)
    top = _from_networkx(f"torus{rows}x{cols}", n, _mesh(rows, cols, periodic=True))
    return _known_diameter(top, rows // 2 + cols // 2)  # a ring of size s has diameter s // 2


def complete(n: int) -> Topology:
    """nx.complete_graph."""
    _check_size(f"complete{n}", n)
    return _from_networkx(f"complete{n}", n, nx.complete_graph(n))


def star(n: int) -> Topology:
    """nx.star_graph(n - 1): node 0 is the centre, 1..n-1 the leaves."""
    _check_size(f"star{n}", n)
    return _from_networkx(f"star{n}", n, nx.star_graph(n - 1))


def tree(n: int) -> Topology:
    """nx.full_rary_tree(2, n): a binary tree in heap order, node i's children are 2i+1 and 2i+2."""
    _check_size(f"tree{n}", n)
    return _from_networkx(f"tree{n}", n, nx.full_rary_tree(2, n))


def _attempt_seed(seed: int, attempt: int) -> int:
    # Attempt 0 uses the seed itself (so a connected draw equals networkx's own graph for it);
    # later attempts use independent seeds derived from (seed, attempt).
    if attempt == 0:
        return seed
    return int(np.random.SeedSequence([seed, attempt]).generate_state(1, np.uint32)[0])


def _check_seed(name: str, seed: int) -> None:
    if not _is_int(seed) or seed < 0:
        raise _fail(name, f"seed must be an integer >= 0, got {seed!r}")


def _connected_draw(name: str, n: int, draw: Callable[[int], nx.Graph], seed: int) -> Topology:
    """Redraw with derived seeds until the graph is connected; give up after MAX_TRIES."""
    _check_seed(name, seed)
    for attempt in range(MAX_TRIES):
        g = draw(_attempt_seed(seed, attempt))
        if nx.is_connected(g):
            return Topology(name, n, tuple(g.edges))
    raise _fail(name, f"no connected graph in {MAX_TRIES} draws; raise the density or change the seed")


def random_regular(n: int, degree: int, seed: int = 0) -> Topology:
    name = f"random_regular{n}_d{degree}_s{seed}"
    if not 0 <= degree < n:
        raise _fail(name, f"degree must be in 0..{n - 1} (nodes - 1), got {degree}")
    if n * degree % 2:
        raise _fail(name, f"nodes * degree must be even, got {n} * {degree}")
    if n > 2 and degree < 2:
        raise _fail(name, f"degree {degree} cannot connect {n} nodes; use degree >= 2")
    return _connected_draw(name, n, lambda s: nx.random_regular_graph(degree, n, seed=s), seed)


def erdos_renyi(n: int, p: float, seed: int = 0) -> Topology:
    name = f"erdos_renyi{n}_p{p:g}_s{seed}"
    if not 0.0 <= p <= 1.0:
        raise _fail(name, f"p must be in [0, 1], got {p}")
    if n > 1 and p == 0.0:
        raise _fail(name, f"p = 0 cannot connect {n} nodes")
    if n > MAX_GNP_NODES:
        raise _fail(
            name,
            f"{n} nodes is above the {MAX_GNP_NODES} an erdos_renyi draw may have (topology.MAX_GNP_NODES: it "
            "draws every node pair); use random_regular or an edge-list file",
        )
    return _connected_draw(name, n, lambda s: nx.gnp_random_graph(n, p, seed=s), seed)


def watts_strogatz(n: int, k: int, p: float, seed: int = 0) -> Topology:
    """Ring lattice with k/2 neighbours on each side, each edge rewired with probability p."""
    name = f"watts_strogatz{n}_k{k}_p{p:g}_s{seed}"
    if k < 2 or k % 2 or k >= n:
        raise _fail(name, f"k must be even and in 2..{n - 1} (below the node count), got {k}")
    if not 0.0 <= p <= 1.0:
        raise _fail(name, f"p must be in [0, 1], got {p}")
    _check_seed(name, seed)
    try:
        g = nx.connected_watts_strogatz_graph(n, k, p, tries=MAX_TRIES, seed=seed)
    except nx.NetworkXError:
        raise _fail(name, f"no connected graph in {MAX_TRIES} draws; lower p or raise k") from None
    return Topology(name, n, tuple(g.edges))


def resolve_file(file: str | Path, base_dir: Path | None = None) -> Path:
    """Find an edge-list file: absolute, else relative to base_dir, topologies/, then cwd."""
    path = Path(file).expanduser()
    if path.is_absolute():
        candidates = [path]
    else:
        candidates = [d / path for d in (base_dir, TOPOLOGY_DIR, Path.cwd()) if d is not None]
    for c in candidates:
        if c.is_file():
            return c
    looked = ", ".join(map(str, candidates))
    raise TopologyError(f"topology file {str(file)!r} not found (looked in: {looked})")


def build(cfg: TopologyConfig, base_dir: Path | None = None) -> Topology:
    """The graph `cfg` names, checked to have exactly cfg.nodes nodes."""
    n = cfg.nodes
    builders: dict[str, Callable[[], Topology]] = {
        "ring": lambda: ring(n),
        "grid": lambda: grid(n, cfg.rows),
        "torus": lambda: torus(n, cfg.rows),
        "complete": lambda: complete(n),
        "star": lambda: star(n),
        "tree": lambda: tree(n),
        "random_regular": lambda: random_regular(n, cfg.degree, cfg.seed),
        "erdos_renyi": lambda: erdos_renyi(n, cfg.p, cfg.seed),
        "watts_strogatz": lambda: watts_strogatz(n, cfg.k, cfg.p, cfg.seed),
        "file": lambda: load_yaml(resolve_file(cfg.file, base_dir)),
    }
    if cfg.kind not in builders:
        raise TopologyError(f"topology kind {cfg.kind!r} unknown (allowed: {', '.join(builders)})")
    top = builders[cfg.kind]()
    check_nodes(top, n)
    return top


def check_nodes(top: Topology, clients: int) -> None:
    """The graph must have one node per client."""
    if top.n != clients:
        raise TopologyError(f"topology {top.name} has {top.n} nodes but the run has {clients} clients")


# ----------------------------------------------------------------------------- command line

SPEC_FORMS = (
    "ring:N, grid:RxC, torus:RxC, complete:N, star:N, tree:N, random_regular:N:degree=D[:seed=S], "
    "erdos_renyi:N:p=P[:seed=S], watts_strogatz:N:k=K:p=P[:seed=S], a path to an edge-list .yaml, "
    "or the name of a file in topologies/ (e.g. ring16)"
)
_SPEC_OPTIONS: dict[str, tuple[str, ...]] = {
    "ring": (),
    "grid": (),
    "torus": (),
    "complete": (),
    "star": (),
    "tree": (),
    "random_regular": ("degree", "seed"),
    "erdos_renyi": ("p", "seed"),
    "watts_strogatz": ("k", "p", "seed"),
}


def _number(raw: str, tp: type[int] | type[float]) -> int | float | None:
    try:
        return tp(raw)
    except ValueError:
        return None


def parse_spec(text: str, base_dir: Path | None = None) -> TopologyConfig:
    """Parse a command-line topology spec (see SPEC_FORMS).

    A file is resolved like `build` does and read once, so that the returned config carries the
    file's node count and an absolute path.
    """
    text = text.strip()
    if ":" not in text and (TOPOLOGY_DIR / f"{text}.yaml").is_file():
        text = str(TOPOLOGY_DIR / f"{text}.yaml")
    if text.endswith((".yaml", ".yml")):
        path = resolve_file(text, base_dir).resolve()
        return TopologyConfig(kind="file", nodes=load_yaml(path).n, file=str(path))

    def bad(problem: str) -> TopologyError:
        return TopologyError(f"topology spec {text!r}: {problem}; accepted: {SPEC_FORMS}")

    kind, _, rest = text.partition(":")
    size, *options = rest.split(":")
    if kind not in _SPEC_OPTIONS:
        raise bad(f"unknown kind {kind!r}")
    values: dict[str, Any] = {"kind": kind}
    if kind in ("grid", "torus") and "x" in size:
        dims = [_number(d, int) for d in size.split("x")]
        if len(dims) != 2 or None in dims:
            raise bad(f"size {size!r} is not RxC")
        values |= {"nodes": dims[0] * dims[1], "rows": dims[0]}
    elif (nodes := _number(size, int)) is not None:
        values["nodes"] = nodes
    else:
        raise bad(f"size {size!r} is not an integer")
    for opt in options:
        key, eq, raw = opt.partition("=")
        allowed = _SPEC_OPTIONS[kind]
        if not allowed:
            raise bad(f"{kind} takes no options, got {opt!r}")
        if not eq or key not in allowed:
            raise bad(f"option {opt!r} must be key=value with key one of {', '.join(allowed)}")
        # p is a probability; degree, k and seed are integers (as TopologyConfig declares them).
        if (value := _number(raw, float if key == "p" else int)) is None:
            raise bad(f"{key}={raw!r} is not a number")
        values[key] = value
    try:
        return TopologyConfig(**values)
    except ConfigError as e:
        raise bad(str(e)) from None


# ------------------------------------------------------------------------------ edge-list YAML

_YAML_KEYS = ("name", "nodes", "edges")


def load_yaml(path: str | Path) -> Topology:
    """Read an edge-list file: `name` (optional, default the file stem), `nodes`, `edges`."""
    path = Path(path)
    where = path.name
    if not path.is_file():
        raise _fail(where, f"cannot read {path} (no such file)")
    try:  # the config's YAML reader: duplicate keys refused, YAML 1.2 floats, one line
        data = read_yaml(path, "file")
    except ConfigError as e:
        raise _fail(where, str(e).removeprefix(f"{path}: ")) from None
    if not isinstance(data, dict):
        raise _fail(where, "must be a mapping with keys nodes and edges (and optionally name)")
    unknown = sorted(set(map(str, data)) - set(_YAML_KEYS))
    if unknown:
        raise _fail(where, f"unknown key {unknown[0]!r} (allowed: {', '.join(_YAML_KEYS)})")
    for key in ("nodes", "edges"):
        if key not in data:
            raise _fail(where, f"missing key {key!r}")
    name, nodes, edges = data.get("name", path.stem), data["nodes"], data["edges"]
    if not isinstance(name, str) or not name:
        raise _fail(where, f"name must be a non-empty string, got {name!r}")
    if not _is_int(nodes) or nodes < 1:
        raise _fail(where, f"nodes must be an integer >= 1, got {nodes!r}")
    if edges is None:  # `edges:` with nothing after it: a single node
        edges = []
    if not isinstance(edges, list):
        raise _fail(where, f"edges must be a list of [i, j] pairs, got {type(edges).__name__}")
    return Topology(name, nodes, tuple(edges), where=where)


def dump_yaml(top: Topology) -> str:
    """The edge-list YAML of `top`; `load_yaml` reads it back to an equal Topology."""
    header = f"# {top.n} nodes, {len(top.edges)} edges, diameter {top.diameter}\n"
    doc = {"name": top.name, "nodes": top.n, "edges": [list(e) for e in top.edges]}
    # default_flow_style=None writes each edge inline as [i, j], one per line.
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


# ------------------------------------------------------------------------------- rank mapping


def rank_of(node: int) -> int:
    """Process rank of topology node `node` (rank 0 is the evaluator)."""
    if not _is_int(node) or node < 0:
        raise TopologyError(f"node {node!r} is not a topology node (nodes are 0..N-1)")
    return int(node) + 1


def node_of(rank: int) -> int:
    """Topology node of client rank `rank` (ranks 1..N)."""
    if rank == EVALUATOR_RANK:
        raise TopologyError("rank 0 is the evaluator, not a topology node")
    if not _is_int(rank) or rank < 0:
        raise TopologyError(f"rank {rank!r} is not a process rank")
    return int(rank) - 1


def world_size(top: Topology) -> int:
    """Processes a run needs: the evaluator plus one client per node."""
    return top.n + 1


# ---------------------------------------------------------------------------------- describe

_SHOW_NODES = 32  # adjacency lines shown in full; bigger graphs show head and tail
_SHOW_NEIGHBOURS = 16


def _adjacency_line(top: Topology, v: int) -> str:
    nbrs = top.neighbors(v)
    shown = " ".join(map(str, nbrs[:_SHOW_NEIGHBOURS]))
    if len(nbrs) > _SHOW_NEIGHBOURS:
        shown += f" ... (+{len(nbrs) - _SHOW_NEIGHBOURS} more)"
    width = len(str(top.n))
    return f"  {v:>{width}} (rank {rank_of(v):>{width}}): {shown}"


def describe(top: Topology) -> str:
    """Multi-line summary for `seedflood topology show`."""
    degrees = [top.degree(v) for v in top.nodes]
    lines = [
        f"topology {top.name}",
        f"  nodes     {top.n} (ranks 1..{top.n}; rank 0 is the evaluator, world size {world_size(top)})",
        f"  edges     {len(top.edges)}",
        f"  degree    min {min(degrees)}, mean {sum(degrees) / top.n:.2f}, max {max(degrees)}",
        f"  diameter  {top.diameter} (hops for a full flood)",
        "adjacency:",
    ]
    if top.n <= _SHOW_NODES:
        lines += [_adjacency_line(top, v) for v in top.nodes]
    else:  # the head, a marker, and the last 4 nodes (where rings and meshes wrap around)
        lines += [_adjacency_line(top, v) for v in range(_SHOW_NODES - 4)]
        lines.append(f"  ... ({top.n - _SHOW_NODES} more nodes)")
        lines += [_adjacency_line(top, v) for v in range(top.n - 4, top.n)]
    return "\n".join(lines)
