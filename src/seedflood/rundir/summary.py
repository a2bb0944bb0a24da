"""summary.json: the figures of a finished run, one typed value for every algorithm.

Owns `RunSummary`: the keys every algorithm writes (the run-directory contract that `seedflood
compare`, `sweep-summary` and the CLI read), then SeedFlood's own (`FloodFigures`, with what its
clients reported: `ClientReports`) or another algorithm's (`details`, written as given).
`to_dict` is exactly the JSON object summary.json holds; `write` puts it there.
`seedflood_summary` derives a SeedFlood run's figures alike for a launched run (train) and a
simulated one (sharedmodel).

May import: seedflood.core; rundir's atomic, checkpoints, layout.

Assumes: every value is JSON as it stands; summary.json is written with sorted keys, so the order
of the fields is not part of the format.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from seedflood.core.flood import lockstep
from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.transport import ByteCounter
from seedflood.core.membership.roster import Roster
from seedflood.core.topology.graph import Topology
from seedflood.rundir import checkpoints as ckpt
from seedflood.rundir.atomic import atomic_write_text
from seedflood.rundir.layout import RunDir


def _flat(value: Any) -> dict[str, Any]:
    """A dataclass's fields as summary.json keys (shallow: the values are the run's own objects)."""
    return {f.name: getattr(value, f.name) for f in fields(value)}


@dataclass(frozen=True)
class ClientReports:
    """What a SeedFlood run's clients said at the end: one entry per topology node, None for a
    node that sent no report (it left, stopped, or the store was gone)."""

    client_hashes: list[str | None]  # each client's final state hash
    consensus: bool | None  # every reported hash equals the evaluator's; None: nobody reported
    client_step_hashes: list[list[str] | None] | None  # per-step hashes (run.hash_steps), else None
    flood: list[dict[str, Any] | None]  # each client's flood statistics
    threads: list[Any]  # each client's torch thread counts
    memory: dict[str, Any]  # RSS/PSS/USS (bytes): "evaluator", "clients" (+ "process": a simulation's)
    cost: list[dict[str, Any] | None] | None = None  # launched: each client's roles/cost.py report


@dataclass(frozen=True)
class FloodFigures:
    """SeedFlood's own keys of summary.json."""

    diameter: int  # of the topology (hops)
    delay: int  # steps between a step's estimates and their apply
    param_hash: str  # the evaluator's final state
    bytes_per_edge: dict[str, int]  # run totals per directed topology edge, "a->b"
    bytes_per_edge_per_step: float  # mean over the topology edges and steps seen (bytes)
    resumed_from_step: int  # the checkpoint the state was restored from (0: the base weights)
    resumed_log_steps: int  # the logged steps the run continued after (0: a new run)
    left: list[int]  # nodes that are no members at the end (churn)
    membership_changes: list[str]  # every change of the roster, described
    model_dir: str | None  # the newest checkpoint's hf/ (checkpoint.hf_model), else None
    log: str  # the run's log.bin
    reports: ClientReports  # written as its own keys (client_hashes, consensus, ...)
    simulated: str | None = None  # "shared-model"; launched runs' summaries have no such key

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in _flat(self).items() if k not in ("reports", "simulated")}
        out.update({k: v for k, v in _flat(self.reports).items() if not (k == "cost" and v is None)})
        if self.simulated is not None:
            out["simulated"] = self.simulated
        return out


@dataclass(frozen=True)
class RunSummary:
    """A finished run's summary.json. The first fields are the contract every algorithm writes;
    `seedflood` holds SeedFlood's own keys, `details` another algorithm's (a baseline's)."""

    algorithm: str
    steps: int
    clients: int
    topology: str  # the graph's name (a baseline's: topology.kind, or "single")
    final: dict[str, Any]  # the final metrics line (metrics.jsonl's `final: true` record)
    zero_shot: dict[str, Any] | None  # the step-0 line; None when not scored (a resumed run)
    bytes_total: int  # every byte the transports counted, frame headers included
    bytes_per_edge_run: float  # bytes per directed topology edge over the run
    bytes_per_edge_cumulative: list[float]  # the same after each step (one entry per step)
    wall_seconds: float  # the run's wall time (s)
    consensus_distance: float | None  # mean distance of the clients from their average (None: unknown)
    bit_identical: bool | None  # every client holds the same bits (None: unknown or not applicable)
    seedflood: FloodFigures | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Exactly the JSON object summary.json holds."""
        out = {k: v for k, v in _flat(self).items() if k not in ("seedflood", "details")}
        if self.seedflood is not None:
            out.update(self.seedflood.to_dict())
        out.update(self.details)
        return out

    def write(self, run: RunDir) -> None:
        atomic_write_text(run.summary, json.dumps(self.to_dict(), indent=1, sort_keys=True))


def seedflood_summary(
    run: RunDir,
    top: Topology,
    protocol: Protocol,
    counter: ByteCounter,
    final: dict[str, Any],
    zero_shot: dict[str, Any],
    reports: ClientReports,
    *,
    hf_model: bool,
    resumed_from: int,
    logged: int,
    started: float,
    roster: Roster | None = None,
    simulated: str | None = None,
) -> RunSummary:
    """A SeedFlood run's summary: its shape, its bytes (per directed topology edge; `counter` as
    the transport counted them), the final and zero-shot scores, where its outputs are, and what
    its clients reported (`reports`). `hf_model`: checkpoint.hf_model (the newest checkpoint
    holds a model directory); `resumed_from`: the step of the checkpoint the state was restored
    from (0: none, the base weights); `logged`: the logged steps it continued after (replayed
    from that checkpoint; 0: a new run); `started`: time.monotonic() at the run's start (s);
    `roster`: the evaluator's (who left, and every membership change, in a churn run);
    `simulated`: how a run that was not launched ran (sharedmodel: "shared-model")."""
    cumulative = lockstep.cumulative_per_edge(counter, 2 * len(top.edges), protocol.steps)
    saved = ckpt.latest(run.root) if hf_model else None  # the final checkpoint (the evaluator's finish)
    figures = FloodFigures(
        diameter=top.diameter,
        delay=protocol.delay,
        param_hash=final["param_hash"],
        bytes_per_edge={f"{a}->{b}": v for (a, b), v in sorted(counter.per_edge_total().items()) if b >= 0},
        bytes_per_edge_per_step=counter.mean_bytes_per_edge_per_step(),
        resumed_from_step=resumed_from,  # the checkpoint restored, not the log's length
        resumed_log_steps=logged,
        left=sorted(set(top.nodes) - set(roster.members)) if roster else [],
        membership_changes=[c.describe() for _, c in sorted(roster.changes.items())] if roster else [],
        model_dir=str(saved / "hf") if saved is not None else None,
        log=str(run.log),
        reports=reports,
        simulated=simulated,
    )
    return RunSummary(
        algorithm="seedflood",
        steps=protocol.steps,
        clients=top.n,
        topology=top.name,
        final=final,
        zero_shot=zero_shot or None,
        bytes_total=counter.total(),
        bytes_per_edge_run=cumulative[-1] if cumulative else 0.0,
        bytes_per_edge_cumulative=cumulative,
        wall_seconds=round(time.monotonic() - started, 2),
        consensus_distance=0.0 if reports.consensus else None,  # bit-identical clients: no distance
        bit_identical=reports.consensus,
        seedflood=figures,
    )
