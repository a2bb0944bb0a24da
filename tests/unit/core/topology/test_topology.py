"""Unit tests of the topology modules (core.graph, builders, topofiles, topology): builders, validation, YAML,
specs, rank mapping, describe."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seedflood.core.config.systemsections import TopologyConfig
from seedflood.core.topology import builders, topofiles
from seedflood.core.topology import resolve as T
from seedflood.core.topology.graph import Topology, TopologyError

FAST = settings(max_examples=25, deadline=None)
SIZES = range(1, 65)


def assert_well_formed(top: Topology) -> None:
    """Normalised edges, symmetric sorted adjacency, connected, diameter agrees with networkx."""
    assert all(i < j for i, j in top.edges)
    assert list(top.edges) == sorted(set(top.edges))
    for v in top.nodes:
        nbrs = top.neighbors(v)
        assert list(nbrs) == sorted(nbrs)
        assert all(v in top.neighbors(u) for u in nbrs)
    assert sum(top.degree(v) for v in top.nodes) == 2 * len(top.edges)
    g = top.to_networkx()
    assert nx.is_connected(g)
    assert top.diameter == nx.diameter(g)


# ------------------------------------------------------------------------------------ builders


@pytest.mark.parametrize("n", SIZES)
def test_ring(n: int) -> None:
    top = builders.ring(n)
    assert_well_formed(top)
    assert len(top.edges) == (n if n >= 3 else n - 1)
    assert top.diameter == n // 2
    assert top.name == f"ring{n}"


@pytest.mark.parametrize("n", SIZES)
def test_complete_star_tree(n: int) -> None:
    c, s, t = builders.complete(n), builders.star(n), builders.tree(n)
    for top in (c, s, t):
        assert_well_formed(top)
    assert len(c.edges) == n * (n - 1) // 2
    assert c.diameter == min(n - 1, 1)
    assert len(s.edges) == n - 1 and s.degree(0) == n - 1
    assert s.diameter == min(n - 1, 2)
    assert nx.is_tree(t.to_networkx())
    for i in t.nodes:
        assert {2 * i + 1, 2 * i + 2} & set(range(n)) <= set(t.neighbors(i))


def _row_major(g: nx.Graph, cols: int) -> set[tuple[int, int]]:
    """Edges of a networkx (r, c)-labelled mesh with node (r, c) numbered r*cols + c."""
    return {tuple(sorted((r * cols + c, s * cols + d))) for (r, c), (s, d) in g.edges}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 12, 16, 31])
def test_builders_equal_networkx_generators(n: int) -> None:
    # Same graphs and the same numbering as the generators they name (see each builder's docstring).
    def edges(g: nx.Graph) -> set[tuple[int, int]]:
        return {tuple(sorted(e)) for e in g.edges if e[0] != e[1]}

    assert set(builders.ring(n).edges) == edges(nx.cycle_graph(n))
    assert set(builders.complete(n).edges) == edges(nx.complete_graph(n))
    assert set(builders.star(n).edges) == edges(nx.star_graph(n - 1))
    assert set(builders.tree(n).edges) == edges(nx.full_rary_tree(2, n))
    for rows in (r for r in range(1, n + 1) if n % r == 0):
        cols = n // rows
        assert set(builders.grid(n, rows).edges) == _row_major(nx.grid_2d_graph(rows, cols), cols)
        assert set(builders.torus(n, rows).edges) == _row_major(nx.grid_2d_graph(rows, cols, periodic=True), cols)


@pytest.mark.parametrize(
    "make", [builders.ring, builders.grid, builders.torus, builders.complete, builders.star, builders.tree]
)
def test_builders_reject_empty(make) -> None:
    with pytest.raises(TopologyError, match=r"^topology \w+: needs at least 1 node, got 0$"):
        make(0)


@pytest.mark.parametrize("n, diameter", [(1, 0), (2, 1), (3, 2), (4, 3), (7, 4), (15, 6), (16, 7)])
def test_tree_diameter(n: int, diameter: int) -> None:
    assert builders.tree(n).diameter == diameter


@given(rows=st.integers(1, 9), cols=st.integers(1, 9))
@FAST
def test_grid(rows: int, cols: int) -> None:
    top = builders.grid(rows * cols, rows)
    assert_well_formed(top)
    assert len(top.edges) == rows * (cols - 1) + cols * (rows - 1)
    assert top.diameter == rows + cols - 2


@given(rows=st.integers(1, 9), cols=st.integers(1, 9))
@FAST
def test_torus(rows: int, cols: int) -> None:
    top = builders.torus(rows * cols, rows)
    assert_well_formed(top)  # in particular: no self loops (size 1) or duplicates (size 2)

    def ring_edges(size: int) -> int:
        return size if size > 2 else size - 1

    assert len(top.edges) == ring_edges(cols) * rows + ring_edges(rows) * cols
    assert top.diameter == rows // 2 + cols // 2


def test_named_sizes() -> None:
    assert builders.grid(16).name == "grid4x4" and builders.grid(16).diameter == 6
    assert builders.grid(12).name == "grid3x4"
    assert builders.grid(7).name == "grid1x7"  # a prime is a path: the only factorisation
    big = builders.torus(128, 8)
    assert (big.name, len(big.edges), big.diameter, big.max_degree) == ("torus8x16", 256, 12, 4)
    two = builders.torus(8, 2)  # 2×4: the row wrap would duplicate the vertical edges
    assert len(two.edges) == 12 and two.max_degree == 3


def test_grid_cannot_factor() -> None:
    with pytest.raises(TopologyError, match=r"topology grid: 10 nodes cannot be split into 3 rows"):
        builders.grid(10, 3)
    with pytest.raises(TopologyError, match="torus"):
        T.build(TopologyConfig(kind="torus", nodes=9, rows=2))


@given(n=st.integers(4, 40).map(lambda x: 2 * (x // 2)), seed=st.integers(0, 10_000))
@FAST
def test_random_regular(n: int, seed: int) -> None:
    top = builders.random_regular(n, 3, seed)
    assert_well_formed(top)
    assert {top.degree(v) for v in top.nodes} == {3}
    assert builders.random_regular(n, 3, seed) == top  # deterministic in the seed


@given(n=st.integers(1, 40), seed=st.integers(0, 10_000))
@FAST
def test_erdos_renyi_and_watts_strogatz(n: int, seed: int) -> None:
    er = builders.erdos_renyi(n, 0.3, seed)
    assert_well_formed(er)
    assert builders.erdos_renyi(n, 0.3, seed) == er
    if n > 4:  # k = 4 neighbours need at least 5 nodes (k = n is rejected below)
        ws = builders.watts_strogatz(n, 4, 0.2, seed)
        assert_well_formed(ws)
        assert builders.watts_strogatz(n, 4, 0.2, seed) == ws
        assert len(ws.edges) == 2 * n  # rewiring moves edges, never adds or drops them


def test_random_seed_matters() -> None:
    assert len({builders.random_regular(16, 3, s).edges for s in range(5)}) > 1
    assert len({builders.erdos_renyi(16, 0.3, s).edges for s in range(5)}) > 1


def test_erdos_renyi_resamples_until_connected() -> None:
    # p = 0.15 on 20 nodes is connected well under half the time: the retry path runs.
    tops = [builders.erdos_renyi(20, 0.15, s) for s in range(4)]
    assert all(nx.is_connected(t.to_networkx()) for t in tops)
    assert tops == [builders.erdos_renyi(20, 0.15, s) for s in range(4)]


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: builders.erdos_renyi(40, 0.01, 0), "no connected graph in 100 draws"),
        (lambda: builders.erdos_renyi(4, 0.0, 0), "p = 0 cannot connect"),
        (lambda: builders.random_regular(16, 16), r"degree must be in 0\.\.15"),
        (lambda: builders.random_regular(5, 3), "must be even"),
        (lambda: builders.random_regular(8, 1), "cannot connect 8 nodes"),
        (lambda: builders.random_regular(8, 3, -1), "seed must be an integer >= 0"),
        (lambda: builders.watts_strogatz(8, 3, 0.1), "k must be even"),
        (lambda: builders.watts_strogatz(8, 10, 0.1), "k must be even"),
        (lambda: builders.watts_strogatz(4, 4, 0.1), "below the node count"),
    ],
)
def test_random_builder_errors(make, match: str) -> None:
    with pytest.raises(TopologyError, match=match):
        make()


# ------------------------------------------------------------------------------------- build


@pytest.mark.parametrize(
    "cfg, name, edges, diameter",
    [
        (TopologyConfig(kind="ring", nodes=16), "ring16", 16, 8),
        (TopologyConfig(kind="grid", nodes=16), "grid4x4", 24, 6),
        (TopologyConfig(kind="torus", nodes=128, rows=8), "torus8x16", 256, 12),
        (TopologyConfig(kind="complete", nodes=8), "complete8", 28, 1),
        (TopologyConfig(kind="star", nodes=8), "star8", 7, 2),
        (TopologyConfig(kind="tree", nodes=15), "tree15", 14, 6),
        (TopologyConfig(kind="random_regular", nodes=16, degree=3), "random_regular16_d3_s0", 24, None),
        (TopologyConfig(kind="erdos_renyi", nodes=32, p=0.2, seed=3), "erdos_renyi32_p0.2_s3", None, None),
        (TopologyConfig(kind="watts_strogatz", nodes=32, p=0.1), "watts_strogatz32_k4_p0.1_s0", 64, None),
        (TopologyConfig(kind="file", nodes=16, file="ring16.yaml"), "ring16", 16, 8),
    ],
)
def test_build(cfg: TopologyConfig, name: str, edges: int | None, diameter: int | None) -> None:
    top = T.build(cfg)
    assert top.n == cfg.nodes and top.name == name
    assert edges is None or len(top.edges) == edges
    assert diameter is None or top.diameter == diameter


def test_build_file_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mine.yaml").write_text(topofiles.dump_yaml(replace(builders.star(5), name="mine")))
    cfg = TopologyConfig(kind="file", nodes=5, file="mine.yaml")
    assert T.build(cfg, base_dir=tmp_path).name == "mine"  # next to the config
    with pytest.raises(TopologyError, match="'mine.yaml' not found"):
        T.build(cfg)
    monkeypatch.chdir(tmp_path)
    assert T.build(cfg).name == "mine"  # falls back to the working directory
    assert T.build(replace(cfg, file=str(tmp_path / "mine.yaml"))).name == "mine"  # absolute


def test_build_file_node_count_mismatch() -> None:
    cfg = TopologyConfig(kind="file", nodes=8, file="ring16.yaml")
    with pytest.raises(TopologyError, match="topology ring16 has 16 nodes but the run has 8 clients"):
        T.build(cfg)


# -------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "n, edges, match",
    [
        (4, [(0, 1), (1, 2), (3, 3)], r"topology g: edge \(3, 3\) is a self loop"),
        (3, [(0, 1), (1, 2), (2, 1)], r"edge \(2, 1\) duplicates edge \(1, 2\)"),
        (3, [(0, 1), (0, 1), (1, 2)], r"edge \(0, 1\) duplicates edge \(0, 1\)"),
        (4, [(0, 1), (2, 3)], r"topology g: not connected \(2 components; node 0 cannot reach node 2\)"),
        (3, [(0, 1), (1, 3)], r"edge \(1, 3\) names node 3 outside 0\.\.2"),
        (3, [(0, -1)], r"names node -1 outside"),
        (3, [(0, 1.0)], "must be a pair of integer node ids"),
        (3, [(0, True)], "must be a pair of integer node ids"),
        (3, [(0, 1, 2)], "must be a pair of integer node ids"),
        (0, [], "needs at least 1 node"),
        (2, [], r"not connected \(2 components"),
    ],
)
def test_invalid_graphs(n: int, edges: list, match: str) -> None:
    with pytest.raises(TopologyError, match=match):
        Topology("g", n, tuple(edges))


def test_normalisation_and_accessors() -> None:
    top = Topology("t", 4, ((3, 2), (1, 0), (2, 1)))
    assert top.edges == ((0, 1), (1, 2), (2, 3))
    assert top == Topology("t", 4, ((0, 1), (1, 2), (2, 3)))
    assert top.neighbors(1) == (0, 2) and top.degree(0) == 1 and top.max_degree == 2
    assert [top.eccentricity(v) for v in top.nodes] == [3, 2, 2, 3]
    g = top.to_networkx()
    g.add_edge(0, 3)  # a copy: the topology is unchanged
    assert top.diameter == 3 and len(top.edges) == 3
    with pytest.raises(TopologyError, match=r"node 4 outside 0\.\.3"):
        top.neighbors(4)
    single = Topology("one", 1, ())
    assert single.diameter == 0 and single.neighbors(0) == () and single.max_degree == 0


# -------------------------------------------------------------------------------------- YAML

SHIPPED = {  # name: (nodes, edges, diameter)
    "ring16": (16, 16, 8),
    "ring8": (8, 8, 4),
    "grid4x4": (16, 24, 6),
    "torus8x16": (128, 256, 12),
    "torus4x8": (32, 64, 6),
    "complete8": (8, 28, 1),
    "star8": (8, 7, 2),
    "tree15": (15, 14, 6),
    "random_regular16_d3": (16, 24, None),
}


def test_shipped_files_are_all_known() -> None:
    assert {p.stem for p in topofiles.TOPOLOGY_DIR.glob("*.yaml")} == set(SHIPPED)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_files(name: str) -> None:
    path = topofiles.TOPOLOGY_DIR / f"{name}.yaml"
    top = topofiles.load_yaml(path)
    assert_well_formed(top)
    nodes, edges, diameter = SHIPPED[name]
    assert (top.name, top.n, len(top.edges)) == (name, nodes, edges)
    assert diameter is None or top.diameter == diameter
    assert topofiles.dump_yaml(top) == path.read_text()  # byte-exact: regenerating changes nothing


@pytest.mark.parametrize(
    "name, build",
    [
        ("ring16", lambda: builders.ring(16)),
        ("ring8", lambda: builders.ring(8)),
        ("grid4x4", lambda: builders.grid(16)),
        ("torus8x16", lambda: builders.torus(128, 8)),
        ("torus4x8", lambda: builders.torus(32, 4)),
        ("complete8", lambda: builders.complete(8)),
        ("star8", lambda: builders.star(8)),
        ("tree15", lambda: builders.tree(15)),
    ],
)
def test_shipped_files_match_builders(name: str, build) -> None:
    # The files pin node numbering: a builder change that renumbers nodes breaks them.
    path = topofiles.TOPOLOGY_DIR / f"{name}.yaml"
    assert topofiles.dump_yaml(build()) == path.read_text()


def test_shipped_random_regular_is_regular() -> None:
    top = topofiles.load_yaml(topofiles.TOPOLOGY_DIR / "random_regular16_d3.yaml")
    assert {top.degree(v) for v in top.nodes} == {3}


@given(n=st.integers(1, 30), seed=st.integers(0, 1000))
@FAST
def test_yaml_round_trip(n: int, seed: int) -> None:
    top = builders.erdos_renyi(n, 0.4, seed)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "g.yaml"
        path.write_text(topofiles.dump_yaml(top))
        assert topofiles.load_yaml(path) == top


@pytest.mark.parametrize(
    "text, match",
    [
        ("- 1\n- 2\n", r"topology bad.yaml: must be a mapping"),
        ("nodes: 3\n", r"topology bad.yaml: missing key 'edges'"),
        ("edges: [[0, 1]]\n", r"missing key 'nodes'"),
        ("nodes: 3\nedges: [[0, 1]]\nweights: 1\n", r"unknown key 'weights'"),
        ("nodes: three\nedges: []\n", r"nodes must be an integer >= 1, got 'three'"),
        ("nodes: 3\nedges: [[0, a], [1, 2]]\n", r"topology bad.yaml: edge \[0, 'a'\] must be a pair"),
        ("nodes: 3\nedges: [[0, 1.5], [1, 2]]\n", r"must be a pair of integer node ids"),
        ("nodes: 3\nedges: [[0, 1], [1, 7]]\n", r"bad.yaml: edge \(1, 7\) names node 7 outside 0\.\.2"),
        ("nodes: 3\nedges: [[0, 1], [2, 2]]\n", r"topology bad.yaml: edge \(2, 2\) is a self loop"),
        ("nodes: 4\nedges: [[0, 1], [2, 3]]\n", r"topology bad.yaml: not connected \(2 components"),
        ("nodes: 3\nedges: {0: 1}\n", r"edges must be a list"),
        ("name: 5\nnodes: 1\nedges: []\n", r"name must be a non-empty string"),
        ("nodes: [3\n", r"topology bad.yaml: not valid YAML at line 2, column 1: expected ',' or '\]'"),
        ("", r"topology bad.yaml: the file is empty"),
        ("# no edges yet\n", r"topology bad.yaml: the file is empty"),
    ],
)
def test_malformed_yaml(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(TopologyError, match=match) as info:
        topofiles.load_yaml(path)
    assert "\n" not in str(info.value)


def test_yaml_defaults(tmp_path: Path) -> None:
    path = tmp_path / "solo.yaml"
    path.write_text("nodes: 1\nedges:\n")
    top = topofiles.load_yaml(path)
    assert (top.name, top.n, top.edges) == ("solo", 1, ())
    with pytest.raises(TopologyError, match="cannot read"):
        topofiles.load_yaml(tmp_path / "missing.yaml")


# -------------------------------------------------------------------------------- parse_spec


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("ring:16", dict(kind="ring", nodes=16)),
        ("grid:4x4", dict(kind="grid", nodes=16, rows=4)),
        ("grid:12", dict(kind="grid", nodes=12, rows=0)),
        ("torus:8x16", dict(kind="torus", nodes=128, rows=8)),
        ("complete:8", dict(kind="complete", nodes=8)),
        ("star:8", dict(kind="star", nodes=8)),
        ("tree:15", dict(kind="tree", nodes=15)),
        ("random_regular:16:degree=3:seed=1", dict(kind="random_regular", nodes=16, degree=3, seed=1)),
        ("erdos_renyi:32:p=0.2:seed=3", dict(kind="erdos_renyi", nodes=32, p=0.2, seed=3)),
        ("watts_strogatz:32:k=4:p=0.1", dict(kind="watts_strogatz", nodes=32, k=4, p=0.1)),
    ],
)
def test_parse_spec(spec: str, expected: dict) -> None:
    cfg = T.parse_spec(spec)
    assert cfg == TopologyConfig(**expected)
    assert T.build(cfg).n == cfg.nodes


def test_parse_spec_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    by_name = T.parse_spec("ring16")
    assert (by_name.kind, by_name.nodes) == ("file", 16)
    assert T.build(by_name) == topofiles.load_yaml(topofiles.TOPOLOGY_DIR / "ring16.yaml")
    assert T.parse_spec("torus8x16.yaml").nodes == 128
    (tmp_path / "mine.yml").write_text(topofiles.dump_yaml(builders.star(5)))
    monkeypatch.chdir(tmp_path)
    cfg = T.parse_spec("mine.yml")
    assert cfg.nodes == 5 and Path(cfg.file).is_absolute()


@pytest.mark.parametrize(
    "spec, match",
    [
        ("", "unknown kind ''"),
        ("ring", r"size '' is not an integer"),
        ("hexagon:6", "unknown kind 'hexagon'"),
        ("ring:x", "size 'x' is not an integer"),
        ("ring:0", r"topology.nodes: must be >= 1"),
        ("grid:4x", "size '4x' is not RxC"),
        ("torus:2x3x4", "size '2x3x4' is not RxC"),
        ("ring:4:seed=1", "ring takes no options"),
        ("random_regular:16:deg=3", "must be key=value with key one of degree, seed"),
        ("random_regular:16:degree", "must be key=value"),
        ("erdos_renyi:8:p=high", "p='high' is not a number"),
        ("erdos_renyi:8:p=1.5", r"topology.p: must be in \[0, 1\]"),
        ("missing.yaml", "'missing.yaml' not found"),
    ],
)
def test_parse_spec_rejects(spec: str, match: str) -> None:
    with pytest.raises(TopologyError, match=match) as info:
        T.parse_spec(spec)
    if not spec.endswith(".yaml"):
        assert "accepted: ring:N, grid:RxC" in str(info.value)


# ------------------------------------------------------------------------------ rank mapping


@given(node=st.integers(0, 10_000))
@FAST
def test_rank_round_trip(node: int) -> None:
    assert T.rank_of(node) == node + 1
    assert T.node_of(T.rank_of(node)) == node


def test_rank_errors() -> None:
    assert T.world_size(builders.ring(16)) == 17
    with pytest.raises(TopologyError, match="rank 0 is the evaluator"):
        T.node_of(0)
    with pytest.raises(TopologyError):
        T.node_of(-1)
    with pytest.raises(TopologyError):
        T.rank_of(-1)


# ---------------------------------------------------------------------------------- describe


def test_describe_small() -> None:
    text = T.describe(builders.grid(16))
    for line in ("topology grid4x4", "nodes     16", "edges     24", "diameter  6"):
        assert line in text
    assert "min 2, mean 3.00, max 4" in text
    assert " 0 (rank  1): 1 4" in text and "15 (rank 16): 11 14" in text


def test_describe_truncates() -> None:
    text = T.describe(builders.complete(100))
    assert len(text.splitlines()) < 45
    assert "... (68 more nodes)" in text and "... (+83 more)" in text
    assert "99 (rank 100)" in text


def test_core_imports_stay_pure() -> None:
    # docs/architecture.md, Layers: the core never pulls in torch.distributed, transformers or datasets (nor torch).
    banned = "{'torch', 'transformers', 'datasets'}"
    code = f"import sys, seedflood.core.topology.resolve; print(sorted({banned} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_regular_topologies_do_not_import_networkx() -> None:
    # builders.py: the regular builders, connectivity, diameter and routes run without networkx (its
    # import is ~0.3 s of CPU per launched process); a random draw imports it (the control).
    code = (
        "import sys\n"
        "from seedflood.core.flood import lockstep\n"
        "from seedflood.core.topology import builders, resolve\n"
        "for top in (builders.ring(8), builders.grid(12), builders.torus(16), builders.complete(5),\n"
        "            builders.star(6), builders.tree(7), resolve.build(resolve.parse_spec('torus:2x4'))):\n"
        "    top.diameter, top.routes(0), lockstep.as_topology(top)\n"
        "before = 'networkx' in sys.modules\n"
        "builders.random_regular(8, 3)\n"
        "print(before, 'networkx' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


def test_duplicate_keys_in_an_edge_list_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("nodes: 3\nedges: [[0, 1], [1, 2]]\nnodes: 4\n")
    with pytest.raises(TopologyError, match=r"topology dup.yaml: line 3: duplicate key 'nodes'"):
        topofiles.load_yaml(path)


@pytest.mark.parametrize(
    "make, diameter",
    [
        (lambda: builders.ring(100_000), 50_000),
        (lambda: builders.torus(100_000), 250 // 2 + 400 // 2),
        (lambda: builders.grid(100_000), 250 + 400 - 2),
        (lambda: builders.tree(100_000), 32),
        (lambda: builders.star(100_000), 2),
    ],
    ids=["ring", "torus", "grid", "tree", "star"],
)
def test_the_diameter_of_a_large_graph_takes_no_all_pairs(make, diameter) -> None:
    """100000 nodes: a closed form or two BFS, not the hours of all-pairs shortest paths."""
    top = make()
    t = time.monotonic()
    assert top.diameter == diameter
    assert time.monotonic() - t < 5


def test_an_irregular_graph_too_large_to_settle_is_refused_in_one_line() -> None:
    top = builders.random_regular(100_000, 3, 0)
    with pytest.raises(TopologyError, match=r"^topology random_regular100000_d3_s0: its diameter did not settle"):
        _ = top.diameter


EXACT_COUNTS = {
    "ring": builders.ring,
    "grid": builders.grid,
    "grid-rows": lambda n: builders.grid(n, 1 if n % 2 else 2),
    "torus": builders.torus,
    "torus-rows": lambda n: builders.torus(n, 1 if n % 2 else 2),
    "complete": builders.complete,
    "star": builders.star,
    "tree": builders.tree,
    "random_regular": lambda n: builders.random_regular(n + n % 2, 3) if n > 3 else builders.ring(n),
    "watts_strogatz": lambda n: builders.watts_strogatz(n, 2, 0.3) if n > 2 else builders.ring(n),
}


@pytest.mark.parametrize("kind", EXACT_COUNTS)
def test_each_builder_counts_its_edges_in_closed_form_before_building(kind, monkeypatch) -> None:
    """The size bound (graph.MAX_EDGES) is checked on a count the builder computes before it
    generates anything: that count is the number of edges it then builds."""
    counted: list[int] = []
    monkeypatch.setattr(builders, "check_size", lambda where, nodes, edges, about=False: counted.append(edges))
    for n in [*range(1, 13), 16, 30, 36]:
        counted.clear()
        top = EXACT_COUNTS[kind](n)
        assert counted and counted[-1] == len(top.edges), (kind, n, counted, len(top.edges))


def _never_built(*args, **kwargs):
    raise AssertionError("a graph above graph.MAX_EDGES was generated before it was refused")


@pytest.mark.parametrize(
    "make, count",
    [
        (lambda: builders.complete(100_000), "4,999,950,000 edges"),
        (lambda: builders.complete(10_000), "49,995,000 edges"),
        (lambda: builders.complete(708), "250,278 edges"),  # complete707 (249,571 edges) is the largest
        (lambda: builders.ring(10**9), "1,000,000,000 edges"),
        (lambda: builders.grid(10**12), "at least 999,999,999,999 edges (1,000,000,000,000 nodes)"),
        (lambda: builders.torus(200_000), "400,000 edges"),  # torus400x500
        (lambda: builders.star(10**7), "9,999,999 edges"),
        (lambda: builders.tree(10**7), "9,999,999 edges"),
        (lambda: builders.random_regular(10**6, 3), "1,500,000 edges"),
        (lambda: builders.watts_strogatz(10**6, 4, 0.1), "2,000,000 edges"),
        (lambda: builders.erdos_renyi(10_000, 0.3), "about 14,998,500 edges"),
        (lambda: Topology("huge", 10**12, ()), "at least 999,999,999,999 edges (1,000,000,000,000 nodes)"),
    ],
    ids=[
        "complete100000",
        "complete10000",
        "complete708",
        "ring",
        "grid",
        "torus",
        "star",
        "tree",
        "rr",
        "ws",
        "er",
        "Topology",
    ],
)
def test_a_graph_above_the_size_bound_is_refused_in_one_line_before_it_is_built(make, count, monkeypatch) -> None:
    """complete100000 once grew past 12 GB and complete10000 ended in a MemoryError after
    41 s. Every size is refused at once, naming the count and the bound, with nothing generated."""
    for generator in ("cycle_graph", "path_graph", "grid_2d_graph", "complete_graph", "star_graph", "full_rary_tree"):
        monkeypatch.setattr(nx, generator, _never_built)
    for generator in ("random_regular_graph", "gnp_random_graph", "connected_watts_strogatz_graph", "Graph"):
        monkeypatch.setattr(nx, generator, _never_built)
    t = time.process_time()
    with pytest.raises(TopologyError) as e:
        make()
    assert time.process_time() - t < 1
    line = str(e.value)
    assert f": {count} is above the 250,000 a topology may have (graph.MAX_EDGES" in line, line
    assert "\n" not in line


def test_a_file_above_the_size_bound_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("nodes: 1000000\nedges: []\n")
    with pytest.raises(TopologyError, match=r"^topology big.yaml: at least 999,999 edges \(1,000,000 nodes\) is above"):
        topofiles.load_yaml(path)


@given(n=st.integers(3, 40), seed=st.integers(0, 10**6), kind=st.sampled_from(["rr", "er", "ws"]))
@FAST
def test_bounded_diameter_and_routes_equal_all_pairs(n: int, seed: int, kind: str) -> None:
    """Eccentricity bounding and per-node routes agree with networkx's all-pairs answers."""
    try:
        top = {
            "rr": lambda: builders.random_regular(n + n % 2, 3, seed),
            "er": lambda: builders.erdos_renyi(n, 0.2, seed),
            "ws": lambda: builders.watts_strogatz(n, 2, 0.3, seed),
        }[kind]()
    except TopologyError:
        return  # no connected draw: nothing to compare
    g = top.to_networkx()
    assert top.diameter == nx.diameter(g)
    d = dict(nx.all_pairs_shortest_path_length(g))
    for i in (0, top.n // 2):
        assert top.routes(i) == {o: tuple(p for p in top.neighbors(i) if d[o][p] == d[o][i] + 1) for o in top.nodes}
    assert top.distances == tuple(tuple(d[a][b] for b in top.nodes) for a in top.nodes)
