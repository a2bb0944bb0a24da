"""A strict launched process (`churn.settle` = 0): one static gloo world, every step complete after its hops.

Owns `StrictWiring` (a `wiring.Wiring`): the gloo process group (`runtime.process_group`: the
start-up broadcast over gloo, final reports through its store), a client's point-to-point
`gloo.GlooTransport` over that group (the configured attach node also pushes to the
evaluator's rank), the strict step strategy, resume from the broadcast log, and the evaluator's
`gloo.EvaluatorInbox` from the attach node's rank. Any failure ends the run: a peer that dies
fails its neighbours' next hop, and the evaluator gives up on a stream silent for
transport.timeout_s.

May import: seedflood.core, comm (gloo, runtime), rundir, roles' client, evaluator, strict and wiring.

Assumes: every process of the run is up within transport.startup_timeout_s (the process group's
rendezvous), and none restarts (a static world cannot take a process back).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from seedflood.comm import runtime
from seedflood.comm.gloo import EvaluatorInbox, GlooTransport
from seedflood.core.flood import protocol as proto
from seedflood.core.flood.stepstream import encode_step
from seedflood.core.flood.transport import ByteCounter, Inbox
from seedflood.core.membership.roster import Change
from seedflood.roles.client import Client
from seedflood.roles.evaluator import Settings
from seedflood.roles.strategy import Strategy
from seedflood.roles.strict import STRICT
from seedflood.roles.wiring import NO_RECORD, OwnRecord, Process, client_key
from seedflood.rundir.logfile import Records


class StrictWiring:
    """A strict launched process (`wiring.Wiring[runtime.Group, GlooTransport]`)."""

    certified = False  # a step is complete, not voted: its messages' signatures prove it

    def __init__(self, process: Process) -> None:
        self.p = process

    def group(self, world: runtime.World) -> AbstractContextManager[runtime.Group]:
        return runtime.process_group(world, self.p.cfg.transport)

    def completed(self, records: Records) -> Records:
        return records  # the evaluator's log is the only log

    def started(self, group: runtime.Group) -> None:
        pass  # the process group keeps its own timeout

    def transport(
        self, node: int, group: runtime.Group, counter: ByteCounter, changes: Mapping[int, Change]
    ) -> GlooTransport:
        """Point-to-point on the process group; the configured attach node also reaches rank 0."""
        cfg = self.p.cfg
        rank = proto.EVALUATOR_RANK if node == cfg.eval.attach else None
        return GlooTransport(node, self.p.top.neighbors(node), proto.rank_of, counter, evaluator_rank=rank)

    def strategy(self, node: int, transport: GlooTransport) -> Strategy:
        return STRICT

    def start(self, client: Client, transport: GlooTransport, records: Records, changes: Mapping[int, Change]) -> None:
        """Resume from the logged steps (O(messages) for subcge, no checkpoint needed); the attach
        node pushes every step it applies to the evaluator (signed: with its messages' signatures)."""
        client.resume(records, changes)
        if client.node == self.p.cfg.eval.attach:
            # signed: each message with its origin's signature (a strict step needs no certificate)
            sealed = b"" if client.flood.signing is not None else None
            client.listeners.append(lambda s, msgs: transport.push(encode_step(msgs, None, sealed), s))

    def own_record(self, client: Client) -> OwnRecord:
        return NO_RECORD  # every step reaches the evaluator, or the run fails

    def settings(self) -> Settings:
        """The run's settings; its clients keep no logs of their own (`RunDir.clients` None), so a
        stream that ends short is an error, not something to complete from them."""
        settings = Settings.of(self.p.cfg)
        return dataclasses.replace(settings, run=dataclasses.replace(settings.run, clients=None))

    def inbox(self, group: runtime.Group, start: int, wall: float) -> Inbox:
        attach = self.p.cfg.eval.attach
        return EvaluatorInbox(proto.rank_of(attach), attach)

    def final_reports(self, group: runtime.Group, members: Sequence[int]) -> dict[str, Any]:
        """Every member's report, waiting at most the group's timeout (WorldError naming who did
        not report)."""
        return group.collect([client_key(n) for n in members])
