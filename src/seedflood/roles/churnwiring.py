"""A churn launched process (`churn.settle` > 0): no process group, so clients may die, stall and rejoin.

Owns `ChurnWiring` (a `wiring.Wiring`), docs/churn-design.md, Per-edge transport and the store:
- the store alone as the collective side (`runtime.store_group`: start-up broadcast, final
  reports), and a client's `links.EdgeTransport` (one gloo group per edge), connected once every
  client is up (`rendezvous.await_start`, within transport.startup_timeout_s) or, for a restart
  or a latecomer, by the neighbour that sponsors its rejoin (`churnstart.sponsored_catch_up`),
  and for a brand-new node id (SEEDFLOOD_NODE, churn.max_nodes) by the member the join rule
  picks, once it knocked through the store (`EdgeSet.knock`; docs/churn-design.md, A new id
  joins);
- the churn step strategy (`churnstart.ChurnStrategy`): the client streams every step it
  decides to the evaluator whenever it is the roster's attach node; with churn.repair its
  transport grows graph repair's edges, which heal (docs/churn-design.md, Graph repair); with
  churn.max_nodes, the join rule's edges of each new id;
- each client's own copy of the agreed log and its report (`clientlog.ClientLog`,
  eval.client_logs), so no agreed step depends on the evaluator's timing: rank 0 completes its
  log from the longest client log on its disk before it resumes, and reads there the final
  reports the store does not hold;
- SIGTERM to a client: a graceful leave (`Churn.leave`, docs/churn-design.md, Graceful leave; a
  second SIGTERM is Python's default again: it dies); a strict client keeps the default;
- the evaluator's `attach.AttachInbox` (it follows whichever client is the attach node now) and
  the final reports of the clients that are members at the end (a client that stopped posted
  why, so an evaluator left without an attach node knows when nobody is left to stream).

- with churn.log_server, a restart's or new id's prefix from a `seedflood serve-log`, fetched and
  checked before it registers or knocks (`logserver.fetched`), so its sponsor sends only the
  steps after it.

May import: seedflood.core, comm (attach, bounded, links, rendezvous, runtime), rundir, roles'
churnstart, client, evaluator, logserver and wiring.

Assumes: every process gets the same config and the same store (SEEDFLOOD_STORE, or rank 0's);
a restarted process is a new incarnation of its node (rendezvous.register).
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from seedflood.comm import runtime
from seedflood.comm.attach import AttachInbox
from seedflood.comm.bounded import StoreGone
from seedflood.comm.links import EdgeTransport
from seedflood.comm.rendezvous import STARTED_KEY, await_start, incarnation_of
from seedflood.core.churn import prefix
from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.transport import EVALUATOR, ByteCounter, Inbox
from seedflood.core.membership.growth import Growth
from seedflood.core.membership.roster import Change
from seedflood.core.zo.replay import state_hash
from seedflood.roles.churnstart import ChurnStrategy, sponsored_catch_up
from seedflood.roles.client import Client
from seedflood.roles.evaluator import Settings
from seedflood.roles.identities import verifier_of
from seedflood.roles.logserver import Steps, fetched
from seedflood.roles.strategy import Strategy
from seedflood.roles.wiring import NO_RECORD, OwnRecord, Process, client_key
from seedflood.rundir.clientlog import ClientLog, client_report, complete_from_clients
from seedflood.rundir.layout import RunDir
from seedflood.rundir.logfile import Records

log = logging.getLogger(__name__)

REPORT_S = 10.0  # how often the evaluator says whose final report it still waits for (s)


class ChurnWiring:
    """A churn launched process (`wiring.Wiring[runtime.StoreGroup, EdgeTransport]`)."""

    certified = True  # its steps are committed by votes: a signed evaluator needs their certificates

    def __init__(self, process: Process) -> None:
        self.p = process
        self.run = RunDir.of(process.cfg)
        self.held: Steps = []  # a restart's or new id's prefix from the log server (churn.log_server)
        self.have = prefix.NOTHING  # what it tells its sponsor it holds

    def group(self, world: runtime.World) -> AbstractContextManager[runtime.StoreGroup]:
        return runtime.store_group(world, self.p.cfg.transport)

    def completed(self, records: Records) -> Records:
        """The agreed steps only the clients' own logs hold, appended (an evaluator restarted late);
        signed, each proven by its seals first, as the evaluator verifies a streamed one."""
        verifier = verifier_of(self.p.header, self.p.protocol, self.certified)
        return complete_from_clients(self.run, self.p.protocol, self.p.header, records, verifier)

    def started(self, group: runtime.StoreGroup) -> None:
        group.started(self.p.cfg.transport.timeout_s)  # store calls bounded by the hop timeout from now

    def transport(
        self, node: int, group: runtime.StoreGroup, counter: ByteCounter, changes: Mapping[int, Change]
    ) -> EdgeTransport:
        """A gloo group per edge, connected now to every neighbour that is up (and to the evaluator
        on the attach node after the logged changes); a restarted or late client connects nothing
        here: the neighbour that sponsors it does (`start`)."""
        cfg, top = self.p.cfg, self.p.top
        roster = self.p.protocol.roster(attach=cfg.eval.attach)
        for s in sorted(changes):
            roster.apply(changes[s])
        new = node not in top.nodes  # a brand-new id (SEEDFLOOD_NODE): no edge until the join rule's
        if not new and incarnation_of(group.store, node) > 0:  # a restart: fetch before it registers
            self._fetch(node)
        t = EdgeTransport(
            node,
            () if new else top.neighbors(node),
            group.store,
            counter=counter,
            timeout_s=cfg.transport.timeout_s,
            joinable=range(top.n, self.p.protocol.ids),  # the new ids it may sponsor (churn.max_nodes)
        )
        if new:  # knock once the run has started: members sponsor only between their steps
            if not _started(t, cfg.transport.startup_timeout_s):
                log.warning("node %d: the run has not started within transport.startup_timeout_s", node)
            self._fetch(node)  # before it knocks: members claim it from then on
            t.knock()
            log.warning("node %d: a new node id: knocked at the run's store (incarnation %d)", node, t.incarnation)
            return t
        if t.rejoining:  # a restarted client: its sponsor connects it
            return t
        if t.store.check([STARTED_KEY]):  # the others gave up waiting for this one: join as a restart does
            log.warning(
                "node %d: the run started without it (it came later than transport.startup_timeout_s=%g): "
                "joining by a sponsor",
                node,
                cfg.transport.startup_timeout_s,
            )
            t.rejoining = True
            return t
        t.attach = node == roster.attach
        # Every client waits for every other to be up (model loaded) within the start-up bound, not the
        # hop timeout: a slow loader must not be left out, and a client must not start hopping while
        # a neighbour is still connecting (its first hop would wait out a peer that is not hopping).
        late = await_start(t.store, node, top.nodes, cfg.transport.startup_timeout_s)
        want = [*top.neighbors(node), *([EVALUATOR] if t.attach else [])]
        got = t.connect([p for p in want if p not in late], cfg.transport.timeout_s)
        t.store.set(STARTED_KEY, "1")
        if missing := sorted(set(want) - set(got)):
            log.warning(
                "node %d: not connected to %s at start-up (transport.startup_timeout_s=%g); training on without them",
                node,
                missing,
                cfg.transport.startup_timeout_s,
            )
        return t

    def _fetch(self, node: int) -> None:
        """churn.log_server: a restart's or new id's prefix, fetched and checked before the
        members can see it (no sponsor waits on the fetch), and what it tells its sponsor."""
        cfg = self.p.cfg
        if cfg.churn.log_server:
            timeout = Protocol.LATE_FACTOR * cfg.transport.timeout_s
            self.held, self.have = fetched(
                node, cfg.churn.log_server, self.p.protocol, self.p.header, cfg.eval.attach, timeout
            )

    def strategy(self, node: int, transport: EdgeTransport) -> Strategy:
        """With churn.max_nodes, the join rule over the topology (a new id's edges grow the
        transport at both ends and connect at its JOIN note's hop, or heal); with churn.repair,
        graph repair's (its edges grow the transport and heal)."""
        w, p = self.p.workload, self.p
        base = {i: p.top.neighbors(i) for i in p.top.nodes}
        grows = p.protocol.repair or p.protocol.ids > p.top.n
        growth = Growth.of(base, p.protocol.delay, repair=p.protocol.repair) if grows else None
        return ChurnStrategy(
            transport,
            state_hash=lambda: state_hash(w.model, w.direction),
            attach=self.p.cfg.eval.attach,
            evaluator=transport,  # it feeds the evaluator whenever it is the attach node
            incarnation=transport.incarnation,  # its votes carry it; a rejoin checks it
            growth=growth,
        )

    def start(self, client: Client, transport: EdgeTransport, records: Records, changes: Mapping[int, Change]) -> None:
        """A restarted client (incarnation > 1 in the run's store), or one that started later than
        the others' start-up bound, is caught up by the neighbour that claims it; any other
        resumes from the logged steps."""
        if transport.rejoining:
            wait_s = Protocol.LATE_FACTOR * self.p.cfg.transport.timeout_s
            new = client.node not in self.p.top.nodes  # a brand-new id (SEEDFLOOD_NODE)
            blob = sponsored_catch_up(transport, wait_s, client.flood.signing, new, self.have)
            client.churn.rejoin(blob, self.held)
        else:
            client.resume(records, changes)  # O(messages) for subcge, no checkpoint needed
        if threading.current_thread() is threading.main_thread():  # where Python runs signal handlers
            _leave_on_sigterm(client)

    def own_record(self, client: Client) -> OwnRecord:
        """This client's own copy of every agreed step (eval.client_logs), so no step depends on
        the evaluator being up when it is decided (docs/churn-design.md, Client logs)."""
        if not self.p.cfg.eval.client_logs:
            return NO_RECORD
        return _ClientCopy(ClientLog(self.run, self.p.protocol, self.p.header, client.node), client)

    def settings(self) -> Settings:
        return Settings.of(self.p.cfg)

    def inbox(self, group: runtime.StoreGroup, start: int, wall: float) -> Inbox:
        """The attach node's stream, whichever client that is now; given up when no edge has been
        up for the longer of the start-up bound and Protocol.LATE_FACTOR hop timeouts, or once every
        client has reported (in the store, or on this disk since `wall`)."""
        cfg, protocol, top = self.p.cfg, self.p.protocol, self.p.top
        if 0 < start < protocol.steps:
            log.warning("evaluator: its log holds %d steps; the attach node sends the rest", start)
        return AttachInbox(
            group.store,
            top.n,
            protocol.steps,
            joinable=range(top.n, protocol.ids),  # a new id may become the attach node (churn.max_nodes)
            start=start,
            wait_s=max(cfg.transport.startup_timeout_s, Protocol.LATE_FACTOR * cfg.transport.timeout_s),
            blob_wait_s=Protocol.LATE_FACTOR * cfg.transport.timeout_s,
            timeout_s=cfg.transport.timeout_s,
            done_keys=[group.report_key(client_key(n)) for n in top.nodes],
            # the same reports on this disk (a store restarted with this evaluator never gets
            # them), written since it started: one an earlier launch left says nothing
            done=lambda: all(client_report(self.run, n, since=wall) is not None for n in top.nodes),
        )

    def final_reports(self, group: runtime.StoreGroup, members: Sequence[int]) -> dict[str, Any]:
        """The final reports of `members`: from the store, or from their client logs on this disk
        (clientlog.client_report: what a client left when the store is gone, or when this evaluator
        came back to a fresh store). Waits at most Protocol.LATE_FACTOR × transport.timeout_s, saying on
        screen every REPORT_S whom it waits for; a report missing then is logged and left out (its
        hash shows as null in summary.json), never a reason to write no summary."""
        cfg, run_dir = self.p.cfg, self.run
        bound = Protocol.LATE_FACTOR * cfg.transport.timeout_s
        found: dict[str, Any] = {}
        store_ok = True
        start = time.monotonic()
        report_at = start + REPORT_S
        while True:
            for n in members:
                key = client_key(n)
                if key in found:
                    continue
                value = client_report(run_dir, n)
                if value is None and store_ok:
                    try:
                        if group.store.check([group.report_key(key)]):
                            value = json.loads(group.store.get(group.report_key(key)))
                    except StoreGone as e:
                        store_ok = False
                        log.error(
                            "evaluator: the store is gone (%s): final reports only from client logs on this disk", e
                        )
                if value is not None:
                    found[key] = value
            missing = [n for n in members if client_key(n) not in found]
            now = time.monotonic()
            if not missing:
                return found
            if now - start > bound or (not store_ok and run_dir.clients is None):
                log.error(
                    "evaluator: no final report from nodes %s within %g s: their hashes and byte counts are unknown "
                    "and the consensus is checked without them; `seedflood replay %s` checks the log",
                    missing,
                    bound,
                    cfg.run.out_dir,
                )
                return found
            if now >= report_at:
                log.warning(
                    "evaluator: waiting for the final reports of nodes %s (%.0f s of %g)", missing, now - start, bound
                )
                report_at = now + REPORT_S
            time.sleep(runtime.REPORT_POLL_S)


class _ClientCopy:
    """A churn client's own copy of the agreed log (`wiring.OwnRecord`): extended after every
    step the client applies, and once more when it stops, so it holds every step decided."""

    def __init__(self, copy: ClientLog, client: Client) -> None:
        self.copy = copy
        self.churn = client.churn
        self.extend()
        client.listeners.append(lambda s, _: self.extend())

    def extend(self) -> None:
        signed = self.churn.host.flood.signing is not None  # then each step is logged with its seals
        self.copy.extend(self.churn.history, self.churn.roster.changes, self.churn.certificates if signed else None)

    def stopped(self, report: dict[str, Any]) -> None:
        self.extend()
        self.copy.report(report)

    def close(self) -> None:
        self.copy.close()

    def finished(self, report: dict[str, Any]) -> None:
        self.copy.report(report)


def _started(t: EdgeTransport, bound_s: float) -> bool:
    """Wait up to `bound_s` for the run to have started (`STARTED_KEY`): a new id's wait for its
    sponsor (Protocol.LATE_FACTOR hop timeouts) starts only then, not while the founders load."""
    deadline = time.monotonic() + bound_s
    while not t.store.check([STARTED_KEY]):
        if time.monotonic() > deadline:
            return False
        time.sleep(runtime.REPORT_POLL_S)
    return True


def _leave_on_sigterm(client: Client) -> None:
    """SIGTERM asks this churn client to leave gracefully: it stops with `core.churn.member.Left` once a
    committed step leaves it out; a second SIGTERM is the default again (the process dies)."""

    def leave(signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        log.warning("SIGTERM: leaving the run gracefully (a second SIGTERM ends it at once)")
        client.churn.leave()

    signal.signal(signal.SIGTERM, leave)
