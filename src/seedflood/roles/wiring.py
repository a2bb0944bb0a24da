"""A launched process's mode, strict or churn, behind one interface.

Owns `Wiring`: everything a strict and a churn launched process do differently, chosen once by
`train.run` from `Protocol.churn` (`strictwiring.StrictWiring`, `churnwiring.ChurnWiring`) —
the collective group, rank 0's log to resume from, a client's transport, its step strategy, how
it starts (resume or rejoin) and what it keeps of the run itself, the evaluator's settings and
inbox, and how the clients' final reports are collected. Also what both modes share: `Process`
(what every part of a process is built from), `client_key` (where a client's final report is
posted), `OwnRecord` and `NO_RECORD` (a client's own record of the run: none in a strict run).

May import: seedflood.core, comm (the group and transport types), ml (the workload), rundir,
roles' client, host, evaluator and identities.

Assumes: one process, one Wiring, made once the workload is built (a churn client's transport
waits for every other client to have loaded its model); one thread uses it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from seedflood.comm.runtime import Group, World
from seedflood.core.config.runconfig import Config
from seedflood.core.flood import protocol as proto
from seedflood.core.flood.protocol import Protocol as RunProtocol
from seedflood.core.flood.transport import ByteCounter, Inbox, Transport
from seedflood.core.membership.roster import Change
from seedflood.core.topology.graph import Topology
from seedflood.ml.workload import Workload
from seedflood.roles.client import Client
from seedflood.roles.evaluator import Settings
from seedflood.roles.identities import roster_record
from seedflood.roles.strategy import Strategy
from seedflood.rundir import build
from seedflood.rundir.logfile import Records
from seedflood.rundir.logheader import log_header


@dataclass(frozen=True)
class Process:
    """What every part of a launched process is built from: the config, its topology and
    protocol, and the workload (model, data, direction family) this process loaded."""

    cfg: Config
    top: Topology
    protocol: RunProtocol
    workload: Workload

    @functools.cached_property
    def trajectory(self) -> dict[str, Any]:
        """Every setting that changes the bits of the run's steps (`protocol.trajectory`)."""
        return proto.trajectory(self.cfg, self.protocol, self.workload.train_digest())

    @functools.cached_property
    def build(self) -> dict[str, Any]:
        """This process's build (rundir/build.py), measured once its threads are set (Workload.build)."""
        return build.current(self.cfg.model.device, self.cfg.model.dtype)

    @functools.cached_property
    def header(self) -> dict[str, Any]:
        """The header every copy of the run's log carries: the evaluator's and each churn client's own."""
        w = self.workload
        header = log_header(self.cfg, self.trajectory, w.loaded.identity, w.loaded.base_hash)
        if (roster := roster_record(self.cfg)) is not None:
            header["trust"] = roster  # informational, as "config" is: resume compares the trajectory
        return header


def client_key(node: int) -> str:
    """The name a client's final (or stop) report is posted under in the run's store."""
    return f"client-{node}"


class ProcessTransport(Transport, Protocol):
    """A transport a launched client owns: its `with` block closes it (aborting on an error)."""

    def __enter__(self) -> ProcessTransport: ...

    def __exit__(self, exc_type: object, *_: object) -> None: ...


class OwnRecord(Protocol):
    """What a client keeps of the run itself, beside the evaluator's log (a churn client's own
    copy of the agreed log and its report, docs/churn-design.md, Client logs)."""

    def stopped(self, report: dict[str, Any]) -> None:
        """The client stopped by the churn rules: keep every step it decided, and why it stopped."""
        ...

    def close(self) -> None:
        """Training is over (or failed): flush and release what is open."""
        ...

    def finished(self, report: dict[str, Any]) -> None:
        """After `close`: the client's final report, beside its record."""
        ...


class _NoRecord:
    """A client that keeps nothing of the run itself (a strict run, or eval.client_logs off)."""

    def stopped(self, report: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass

    def finished(self, report: dict[str, Any]) -> None:
        pass


NO_RECORD: OwnRecord = _NoRecord()

G = TypeVar("G", bound=Group)
T = TypeVar("T", bound=ProcessTransport)


class Wiring(Protocol[G, T]):
    """A launched process's mode: `G` is its collective group, `T` a client's transport. Called
    by train.py in this order: `group`, (rank 0) `completed`, `started`; then a client
    `transport`, `strategy`, `start`, `own_record`, or the evaluator `settings`, `inbox`,
    `final_reports`."""

    certified: bool
    """Its steps are committed by votes, so a signed run's evaluator needs a certificate of each
    (churn; identities.verifier_of)."""

    def group(self, world: World) -> AbstractContextManager[G]:
        """The run's collective side (start-up broadcast, final reports), torn down on exit."""
        ...

    def completed(self, records: Records) -> Records:
        """Rank 0: what the run continues from, given the steps its own log holds."""
        ...

    def started(self, group: G) -> None:
        """Every rank, once the start-up broadcast is done."""
        ...

    def transport(self, node: int, group: G, counter: ByteCounter, changes: Mapping[int, Change]) -> T:
        """Client `node`'s transport, counting into `counter`; `changes`: the logged roster changes."""
        ...

    def strategy(self, node: int, transport: T) -> Strategy:
        """How client `node` applies steps (`Client`'s strategy)."""
        ...

    def start(self, client: Client, transport: T, records: Records, changes: Mapping[int, Change]) -> None:
        """Bring a new client to where the run goes on (from the logged steps, or by a rejoin)
        and add the listeners its mode needs."""
        ...

    def own_record(self, client: Client) -> OwnRecord:
        """What the client keeps of the run itself from now on (it listens to the client)."""
        ...

    def settings(self) -> Settings:
        """What the evaluator reads of the run."""
        ...

    def inbox(self, group: G, start: int, wall: float) -> Inbox:
        """The evaluator's stream, from step `start` on; `wall`: this process's start (time.time())."""
        ...

    def final_reports(self, group: G, members: Sequence[int]) -> dict[str, Any]:
        """The final reports of `members` (client_key -> report), however many came."""
        ...
