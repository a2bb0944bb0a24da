"""Typed configuration: the whole config of a run, loaded from YAML plus `--set` overrides.

Owns: `Config` (one section dataclass per component; each component receives only its own
section), `SECTIONS` (section name -> dataclass), building a Config from a nested mapping
(`from_dict`), `section.field=value` overrides, `load`/`dump` of the YAML a run records, the
`flat` "section.key" view, and `check_run` (what a command-line run needs beyond the schema).
Any unknown key, wrong type, non-finite number, duplicate YAML key or out-of-range value raises
`ConfigError` with one line naming the key and what is allowed.

The sections themselves (keys, documentation, range rules) live in seedflood.core.config.trainsections
and seedflood.core.config.systemsections; type checking by pydantic in seedflood.core.config.validation; YAML
reading (1.2 floats, duplicate keys) in seedflood.core.config.yamlread.

Assumes nothing about the environment: pure Python + yaml + pydantic (no torch, no network).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from seedflood.core.config.configerror import ConfigError, require
from seedflood.core.config.systemsections import (
    AlgorithmConfig,
    CheckpointConfig,
    ChurnConfig,
    EvalConfig,
    FloodConfig,
    SimConfig,
    TopologyConfig,
    TransportConfig,
    TrustConfig,
)
from seedflood.core.config.trainsections import ModelConfig, RunConfig, SubspaceConfig, TaskConfig, ZOConfig
from seedflood.core.config.validation import build_section
from seedflood.core.config.yamlread import DuplicateKey, parse_yaml, read_yaml, where


@dataclass
class Config:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    run: RunConfig = field(default_factory=RunConfig)
    zo: ZOConfig = field(default_factory=ZOConfig)
    subspace: SubspaceConfig = field(default_factory=SubspaceConfig)
    flood: FloodConfig = field(default_factory=FloodConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    churn: ChurnConfig = field(default_factory=ChurnConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    trust: TrustConfig = field(default_factory=TrustConfig)
    source: str = field(default="", compare=False)
    """Path of the YAML this came from ('' if built in code); not a user key."""

    def __post_init__(self) -> None:
        require(
            self.eval.attach < self.topology.nodes,
            "eval.attach",
            f"must name a node in 0..{self.topology.nodes - 1}, got {self.eval.attach}",
        )
        require(
            not self.churn.max_nodes or self.churn.max_nodes >= self.topology.nodes,
            "churn.max_nodes",
            f"must be 0 or at least topology.nodes ({self.topology.nodes}), got {self.churn.max_nodes}",
        )
        ids = max(self.topology.nodes, self.churn.max_nodes)
        require(
            all(n < ids for n in self.run.slow_nodes),
            "run.slow_nodes",
            f"must name nodes in 0..{ids - 1}, got {self.run.slow_nodes}",
        )
        require(
            all(n < ids for n in self.run.node_delay_s),
            "run.node_delay_s",
            f"must name nodes in 0..{ids - 1}, got {sorted(self.run.node_delay_s)}",
        )
        n = self.topology.nodes
        require(
            all(node < n for node in self.zo.stride),
            "zo.stride",
            f"must name nodes of the topology, 0..{n - 1}, got {sorted(self.zo.stride)}",
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("source")
        return d


SECTIONS: dict[str, type] = {name: tp for name, tp in typing.get_type_hints(Config).items() if name != "source"}
"""Section name -> its dataclass, in Config's field order (the annotations, resolved)."""

REMOVED: dict[str, tuple[str, Any]] = {
    "transport.backend": ("gloo is the only transport", "gloo"),
}
"""Keys that were settings once and are no longer read -> (why, the one value they could hold).
A config that still sets one is refused in one line saying to delete it, rather than with
"unknown key", so the fix is plain. A run directory's recorded config.yaml (`recorded=True`) was
written by an older SeedFlood and cannot be edited into agreement with its log, so there a removed
key holding the one value it could hold is dropped (it changed nothing); any other value is refused."""


def check_run(cfg: Config) -> None:
    """What a run started from the command line (train, simulate, world-size) needs beyond the
    schema: at least two clients, since one client has no one to flood to or gossip with (mezo
    is the one-client baseline and sets its own topology). Not a TopologyConfig rule: one-node
    workloads are built in code (the MeZO baseline, benchmarks, tests)."""
    if cfg.topology.nodes < 2 and cfg.algorithm.name != "mezo":
        raise ConfigError(f"topology.nodes: a decentralized run needs at least 2 clients, got {cfg.topology.nodes}")


def flat(d: Mapping[str, Any]) -> dict[str, Any]:
    """{section: {key: value}} -> {"section.key": value}, the names `--set` takes.

    One level only: a mapping-valued field (model.tiny, task.data_files) stays one value, and a
    top-level entry that is not a mapping keeps its own name.
    """
    out: dict[str, Any] = {}
    for name, section in d.items():
        if isinstance(section, Mapping):
            for key, value in section.items():
                out[f"{name}.{key}"] = value
        else:
            out[str(name)] = section
    return out


def from_dict(data: Mapping[str, Any], source: str = "", recorded: bool = False) -> Config:
    """Build and validate a Config from a nested mapping (the YAML document); `recorded`: see REMOVED."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"config must be a mapping of sections, got {type(data).__name__}")
    for name in data:
        if name not in SECTIONS:
            raise ConfigError(f"unknown section '{name}' (allowed: {', '.join(SECTIONS)})")
    data = {name: dict(v) if isinstance(v, Mapping) else v for name, v in data.items()}
    for name, section in data.items():
        for key in list(section) if isinstance(section, dict) else ():
            if (removed := REMOVED.get(f"{name}.{key}")) is not None:
                why, only = removed
                if recorded and section[key] == only:
                    del section[key]
                    continue
                raise ConfigError(f"{name}.{key}: no longer a setting ({why}); delete it from the config")
    sections = {name: build_section(name, cls, data.get(name)) for name, cls in SECTIONS.items()}
    return Config(**sections, source=source)


def parse_override(text: str) -> tuple[str, str, Any]:
    """'section.field=value' -> (section, field, YAML-parsed value)."""
    key, sep, raw = text.partition("=")
    if not sep or "." not in key:
        raise ConfigError(f"override {text!r} must look like section.field=value")
    key = key.strip()
    section, _, name = key.partition(".")
    try:
        value = parse_yaml(raw, key) if raw.strip() else ""
    except DuplicateKey as e:
        raise ConfigError(f"{key}: value {raw!r} has duplicate key '{e.key}'") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{key}: value {raw!r} is not valid YAML{where(e, raw)}") from None
    return section, name, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `section.field=value` applied (validated later)."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    for text in overrides:
        section, name, value = parse_override(text)
        if section not in SECTIONS:
            raise ConfigError(f"unknown section '{section}' in {text!r} (allowed: {', '.join(SECTIONS)})")
        current = out.get(section)
        if current is None:
            current = out[section] = {}
        if not isinstance(current, dict):
            raise ConfigError(f"{section}: must be a mapping of keys, got {current!r}")
        current[name] = value
    return out


def load(path: str | Path | None = None, overrides: list[str] | None = None, recorded: bool = False) -> Config:
    """Load a YAML config (or the defaults when path is None) and apply overrides; `recorded`: a
    run directory's config.yaml (see REMOVED)."""
    data: dict[str, Any] = {}
    source = ""
    if path is not None:
        p = Path(path)
        loaded = read_yaml(p)  # an empty file is refused there: it is a mistake, never "all defaults"
        if not isinstance(loaded, Mapping):
            got = "an empty document" if loaded is None else type(loaded).__name__
            raise ConfigError(f"{p}: must be a mapping of sections, got {got}")
        data = dict(loaded)
        source = str(p.resolve())
    data = apply_overrides(data, overrides or [])
    return from_dict(data, source=source, recorded=recorded)


def dump(cfg: Config | dict[str, Any]) -> str:
    """The config (or its `to_dict()`) as YAML (what a run records next to its log)."""
    return yaml.safe_dump(cfg if isinstance(cfg, dict) else cfg.to_dict(), sort_keys=False)
