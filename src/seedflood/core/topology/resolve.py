"""What a run does with its topology: build it from the config, parse it from the command line,
map its nodes to process ranks, and describe it.

Owns:
- `build(cfg)`: the builder named by `TopologyConfig.kind` (builders.py, or `file`: topofiles.py),
  checked to have one node per client (`check_nodes`); `topology_of(cfg)`: the graph a whole
  config names (a `file` resolves against the config file's directory);
- `parse_spec(text)`: the command-line form (`ring:16`, `torus:8x16`, `erdos_renyi:32:p=0.2:seed=3`,
  or a YAML path, or the name of a file in topologies/);
- the rank mapping of docs/design.md, Processes and the step loop: rank 0 is the evaluator, topology node i is rank i + 1;
- `describe(top)`: the text of `seedflood topology show`.
The graph itself is graph.Topology.

Assumes: pure Python; every problem raises `graph.TopologyError` with one line naming the
topology (or file) and what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from seedflood.core.config.configerror import ConfigError
from seedflood.core.config.systemsections import TopologyConfig
from seedflood.core.topology.builders import (
    complete,
    erdos_renyi,
    grid,
    random_regular,
    ring,
    star,
    torus,
    tree,
    watts_strogatz,
)
from seedflood.core.topology.graph import Topology, TopologyError, is_int
from seedflood.core.topology.topofiles import TOPOLOGY_DIR, load_yaml, resolve_file

if TYPE_CHECKING:
    from seedflood.core.config.runconfig import Config

EVALUATOR_RANK = 0

_N = TypeVar("_N", int, float)


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


def topology_of(cfg: Config) -> Topology:
    """The client graph of a run's config: `build` of its topology section, where a relative
    `file` is looked for first beside the config file (cfg.source), then as `resolve_file` says."""
    return build(cfg.topology, base_dir=Path(cfg.source).parent if cfg.source else None)


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


def _number(raw: str, tp: Callable[[str], _N]) -> _N | None:
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
        dims = size.split("x")
        rows, cols = (_number(dims[0], int), _number(dims[1], int)) if len(dims) == 2 else (None, None)
        if rows is None or cols is None:
            raise bad(f"size {size!r} is not RxC")
        values |= {"nodes": rows * cols, "rows": rows}
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


# ------------------------------------------------------------------------------- rank mapping


def rank_of(node: int) -> int:
    """Process rank of topology node `node` (rank 0 is the evaluator)."""
    if not is_int(node) or node < 0:
        raise TopologyError(f"node {node!r} is not a topology node (nodes are 0..N-1)")
    return int(node) + 1


def node_of(rank: int) -> int:
    """Topology node of client rank `rank` (ranks 1..N)."""
    if rank == EVALUATOR_RANK:
        raise TopologyError("rank 0 is the evaluator, not a topology node")
    if not is_int(rank) or rank < 0:
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
