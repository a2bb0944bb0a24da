"""Edge-list topology files: the named graphs and the YAML format they are written in.

Owns the edge-list YAML format (`load_yaml`, `dump_yaml`: `name`, `nodes`, `edges`), where a file
named in a config or on the command line is looked for (`resolve_file`), and `TOPOLOGY_DIR`: the
named graphs of the repository's top-level `topologies/` directory, shipped in the wheel as
package data (found in either place).

Assumes: YAML is read with the config's reader (duplicate keys refused, YAML 1.2 floats).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml

from seedflood.core.config.configerror import ConfigError
from seedflood.core.config.yamlread import read_yaml
from seedflood.core.topology.graph import Topology, TopologyError, fail, is_int


def _shipped_dir() -> Path:
    """The named graphs: package data `seedflood/topologies/` in an installed wheel (setup.cfg maps
    the package `seedflood.topologies` to the top-level `topologies/` directory), else the source
    checkout's `topologies/` (an editable install imports seedflood from `src/`, which has no copy)."""
    packaged = resources.files("seedflood") / "topologies"
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[4] / "topologies"


TOPOLOGY_DIR = _shipped_dir()


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


_YAML_KEYS = ("name", "nodes", "edges")


def load_yaml(path: str | Path) -> Topology:
    """Read an edge-list file: `name` (optional, default the file stem), `nodes`, `edges`."""
    path = Path(path)
    where = path.name
    if not path.is_file():
        raise fail(where, f"cannot read {path} (no such file)")
    try:  # the config's YAML reader: duplicate keys refused, YAML 1.2 floats, one line
        data = read_yaml(path, "file")
    except ConfigError as e:
        raise fail(where, str(e).removeprefix(f"{path}: ")) from None
    if not isinstance(data, dict):
        raise fail(where, "must be a mapping with keys nodes and edges (and optionally name)")
    unknown = sorted(set(map(str, data)) - set(_YAML_KEYS))
    if unknown:
        raise fail(where, f"unknown key {unknown[0]!r} (allowed: {', '.join(_YAML_KEYS)})")
    for key in ("nodes", "edges"):
        if key not in data:
            raise fail(where, f"missing key {key!r}")
    name, nodes, edges = data.get("name", path.stem), data["nodes"], data["edges"]
    if not isinstance(name, str) or not name:
        raise fail(where, f"name must be a non-empty string, got {name!r}")
    if not is_int(nodes) or nodes < 1:
        raise fail(where, f"nodes must be an integer >= 1, got {nodes!r}")
    if edges is None:  # `edges:` with nothing after it: a single node
        edges = []
    if not isinstance(edges, list):
        raise fail(where, f"edges must be a list of [i, j] pairs, got {type(edges).__name__}")
    return Topology(name, nodes, tuple(edges), where=where)


def dump_yaml(top: Topology) -> str:
    """The edge-list YAML of `top`; `load_yaml` reads it back to an equal Topology."""
    header = f"# {top.n} nodes, {len(top.edges)} edges, diameter {top.diameter}\n"
    doc = {"name": top.name, "nodes": top.n, "edges": [list(e) for e in top.edges]}
    # default_flow_style=None writes each edge inline as [i, j], one per line.
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)
