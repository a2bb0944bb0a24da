"""Whether and how a run directory may be continued under a config.

Owns the decisions about an existing run directory, made before anything is written to it:
- the header a run's log carries (base model identity and hash, the trajectory fingerprint of
  `protocol.trajectory`, and the full config for the record);
- `resume_records`: the complete steps to resume from. A log written under other trajectory
  settings, a corrupt log (any record that fails the wire's validation, or corruption before
  the end), a log longer than `run.steps`, or an existing run while `checkpoint.resume` is off
  each raise `CheckpointError` with one line, and nothing on disk changes;
- `checkpoint_notes`: one line per checkpoint that a resume would skip because it is corrupt;
- `recorded` / `recorded_steps`: what replay, eval and check read back: the recorded config and
  every logged step, refusing a `config.yaml` edited away from the settings in the log header;
- `topology_of(cfg)`: the graph a config names (a file resolves against the config's directory);
- `summary_common`: the summary.json keys a launched and a simulated run write alike.
`seedflood world-size` (the launchers' preflight) and rank 0 of `seedflood train` both call it,
so a bad resume stops before any process starts.

Assumes: the log is the source of truth (a run is a pure function of base weights, settings and
log); checkpoints only shorten catch-up.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from seedflood import checkpoint as ckpt
from seedflood import config as config_mod
from seedflood import topology as topo
from seedflood import wirecost
from seedflood.config import Config
from seedflood.membership import Change, Roster
from seedflood.message import Message
from seedflood.protocol import Protocol
from seedflood.protocol import trajectory as trajectory_of
from seedflood.transport import ByteCounter

LOG = "log.bin"
Records = list[tuple[int, list[Message]]]


def topology_of(cfg: Config) -> topo.Topology:
    """The client graph of `cfg`, checked against `topology.nodes`."""
    base = Path(cfg.source).parent if cfg.source else None
    top = topo.build(cfg.topology, base_dir=base)
    topo.check_nodes(top, cfg.topology.nodes)
    return top


def log_header(cfg: Config, trajectory: dict[str, Any], base_identity: str, base_hash: str) -> dict[str, Any]:
    return {
        "base_identity": base_identity,
        "base_hash": base_hash,
        "trajectory": trajectory,
        "config": cfg.to_dict(),
    }


def resume_records(
    cfg: Config, protocol: Protocol, trajectory: dict[str, Any], base_hash: str | None = None
) -> Records:
    """The logged steps this run continues from ([] for a new run directory); see the module doc.

    `base_hash` None (the preflight, which loads no weights) skips the base model comparison.
    """
    run_dir = Path(cfg.run.out_dir)
    path = run_dir / LOG
    if not path.is_file():
        return []
    if not cfg.checkpoint.resume:
        raise ckpt.CheckpointError(
            f"{run_dir} already holds a run and checkpoint.resume is false: choose another run.out_dir or delete it"
        )
    old = ckpt.read_header(path)
    new = {"trajectory": trajectory, "base_hash": base_hash if base_hash is not None else old.get("base_hash")}
    if diff := ckpt.header_mismatch(old, new):
        raise ckpt.CheckpointError(
            f"{path} belongs to a different run: settings differ: {', '.join(diff)}; "
            "use a new run.out_dir or delete the directory"
        )
    _, records = ckpt.LogReader(path).read(check=protocol.check_step)
    if len(records) > protocol.steps:
        raise ckpt.CheckpointError(
            f"{path} already holds {len(records)} steps, more than run.steps={protocol.steps}: "
            f"set run.steps >= {len(records)} or use a new run.out_dir"
        )
    return records


def logged_changes(cfg: Config) -> dict[int, Change]:
    """The membership changes (step -> Change) of the run directory's log (churn runs)."""
    reader = ckpt.LogReader(Path(cfg.run.out_dir) / LOG)
    reader.read()
    return reader.changes


def checkpoint_notes(cfg: Config, logged: int) -> list[str]:
    """One line per corrupt checkpoint a resume after `logged` steps would skip."""
    run_dir = Path(cfg.run.out_dir)
    if not run_dir.is_dir():
        return []
    return ckpt.usable_checkpoint(run_dir, logged)[1]


def recorded(run_dir: Path) -> tuple[Config, Protocol]:
    """The config a run directory recorded (config.yaml) and the protocol it implies."""
    cfg = config_mod.load(ckpt.find_run_dir(run_dir) / "config.yaml")
    return cfg, Protocol.of(cfg, topology_of(cfg).diameter)


def recorded_steps(
    run_dir: Path, cfg: Config, protocol: Protocol, train_digest: str, base_hash: str | None = None
) -> Records:
    """Every logged step, each validated like a frame from the wire, once config.yaml is shown to
    describe the trajectory the log header recorded (an edited config.yaml names the keys).
    `base_hash` None skips the base model comparison (no weights loaded)."""
    path = run_dir / LOG
    header = ckpt.read_header(path)
    mine = {"trajectory": trajectory_of(cfg, protocol, train_digest), "base_hash": base_hash or header.get("base_hash")}
    if diff := ckpt.header_mismatch(header, mine):
        raise ckpt.CheckpointError(
            f"{run_dir}/config.yaml does not match the settings {LOG} was written with: {', '.join(diff)}"
        )
    return ckpt.LogReader(path).read(check=protocol.check_step)[1]


def summary_common(
    cfg: Config,
    top: topo.Topology,
    protocol: Protocol,
    counter: ByteCounter,
    final: dict[str, Any],
    zero_shot: dict[str, Any],
    start: int,
    started: float,
    roster: Roster | None = None,
) -> dict[str, Any]:
    """The summary.json keys a launched and a simulated SeedFlood run write alike: the run's shape,
    its bytes (per directed topology edge; `counter` as the transport counted them), the final
    and zero-shot scores, where its outputs are, and the run-directory contract that
    `seedflood compare` reads. Callers add the keys that differ (client hashes, flood stats,
    threads, memory, consensus). `started`: time.monotonic() at the run's start; `roster`: the
    evaluator's (who left, and every membership change, in a churn run)."""
    run_dir = Path(cfg.run.out_dir)
    cumulative = wirecost.cumulative_per_edge(counter, 2 * len(top.edges), protocol.steps)
    common = {
        "algorithm": "seedflood",
        "steps": protocol.steps,
        "clients": top.n,
        "topology": top.name,
        "diameter": top.diameter,
        "delay": protocol.delay,
        "param_hash": final["param_hash"],
        "bytes_per_edge": {f"{a}->{b}": v for (a, b), v in sorted(counter.per_edge_total().items()) if b >= 0},
        "bytes_per_edge_per_step": counter.mean_bytes_per_edge_per_step(),
        "bytes_total": counter.total(),
        "zero_shot": zero_shot or None,
        "final": final,
        "resumed_from_step": start,
        "left": sorted(set(top.nodes) - set(roster.members)) if roster else [],
        "membership_changes": [c.describe() for _, c in sorted(roster.changes.items())] if roster else [],
        "model_dir": str(ckpt.latest(run_dir) / "hf") if cfg.checkpoint.hf_model else None,
        "log": str(run_dir / LOG),
        # the run-directory contract every algorithm writes (seedflood compare reads these)
        "bytes_per_edge_run": cumulative[-1] if cumulative else 0.0,
        "bytes_per_edge_cumulative": cumulative,
        "wall_seconds": round(time.monotonic() - started, 2),
    }
    return common
