"""Whether and how a run directory may be continued, and what its log says when read back.

Owns the decisions about an existing run directory, made before anything is written to it:
- `resume_records`: the complete steps to resume from. A log written under other trajectory
  settings, a corrupt log (any record that fails the wire's validation, or corruption before
  the end), a log longer than `run.steps`, or an existing run while `checkpoint.resume` is off
  each raise `CheckpointError` with one line, and nothing on disk changes;
- `logged_changes`: the membership changes the log holds (churn runs);
- `checkpoint_notes`: one line per checkpoint that a resume would skip because it is corrupt;
- `recorded` / `recorded_steps` / `recorded_log`: what replay, eval and check read back: the
  recorded config and every logged step (and the bytes of a torn tail after them, which those
  commands report: torntail.py), refusing a `config.yaml` edited away from the settings in the
  log header.
`seedflood world-size` (the launchers' preflight) and rank 0 of `seedflood train` both call
`resume_records`, so a bad resume stops before any process starts.

May import: seedflood.core; rundir's checkpoints, layout, logfile, logheader.

Assumes: the log is the source of truth (a run is a pure function of base weights, settings and
log); checkpoints only shorten catch-up.
"""

from __future__ import annotations

from typing import Any

from seedflood.core.config import runconfig as config_mod
from seedflood.core.config.runconfig import Config
from seedflood.core.flood.columns import StepColumns
from seedflood.core.flood.protocol import Protocol
from seedflood.core.membership.roster import Change
from seedflood.core.topology.resolve import topology_of
from seedflood.rundir import checkpoints as ckpt
from seedflood.rundir.layout import CONFIG, LOG, CheckpointError, RunDir
from seedflood.rundir.logfile import LogReader
from seedflood.rundir.logheader import header_mismatch, read_header


def resume_records(
    run: RunDir, protocol: Protocol, trajectory: dict[str, Any], base_hash: str | None, *, resume: bool
) -> StepColumns:
    """The logged steps this run continues from ([] for a new run directory); see the module doc.

    `base_hash` None (the preflight, which loads no weights) skips the base model comparison;
    `resume`: checkpoint.resume (False: an existing run is refused, not continued).
    """
    path = run.log
    if not path.is_file():
        return StepColumns.empty()
    if not resume:
        raise CheckpointError(
            f"{run.root} already holds a run and checkpoint.resume is false: choose another run.out_dir or delete it"
        )
    old = read_header(path)
    new = {"trajectory": trajectory, "base_hash": base_hash if base_hash is not None else old.get("base_hash")}
    if diff := header_mismatch(old, new):
        raise CheckpointError(
            f"{path} belongs to a different run: settings differ: {', '.join(diff)}; "
            "use a new run.out_dir or delete the directory"
        )
    _, records = LogReader(path).read_columns(check=protocol)
    if len(records) > protocol.steps:
        raise CheckpointError(
            f"{path} already holds {len(records)} steps, more than run.steps={protocol.steps}: "
            f"set run.steps >= {len(records)} or use a new run.out_dir"
        )
    return records


def logged_changes(run: RunDir) -> dict[int, Change]:
    """The membership changes (step -> Change) of the run directory's log (churn runs)."""
    reader = LogReader(run.log)
    reader.read()
    return reader.changes


def checkpoint_notes(run: RunDir, logged: int) -> list[str]:
    """One line per corrupt checkpoint a resume after `logged` steps would skip."""
    if not run.root.is_dir():
        return []
    return ckpt.usable_checkpoint(run.root, logged)[1]


def recorded(run: RunDir) -> tuple[Config, Protocol]:
    """The config a run directory recorded (config.yaml) and the protocol it implies."""
    cfg = config_mod.load(run.config, recorded=True)
    return cfg, Protocol.of(cfg, topology_of(cfg).diameter)


def recorded_steps(
    run: RunDir, protocol: Protocol, trajectory: dict[str, Any], base_hash: str | None = None
) -> StepColumns:
    """Every logged step, each validated like a frame from the wire, once config.yaml is shown to
    describe the `trajectory` the log header recorded (an edited config.yaml names the keys).
    `base_hash` None skips the base model comparison (no weights loaded)."""
    return recorded_log(run, protocol, trajectory, base_hash)[0]


def recorded_log(
    run: RunDir, protocol: Protocol, trajectory: dict[str, Any], base_hash: str | None = None
) -> tuple[StepColumns, int]:
    """`recorded_steps`, and the bytes of a torn tail past the last whole record (0: none)."""
    header = read_header(run.log)
    mine = {"trajectory": trajectory, "base_hash": base_hash or header.get("base_hash")}
    if diff := header_mismatch(header, mine):
        raise CheckpointError(
            f"{run.root}/{CONFIG} does not match the settings {LOG} was written with: {', '.join(diff)}"
        )
    reader = LogReader(run.log)
    records = reader.read_columns(check=protocol)[1]
    return records, reader.torn
