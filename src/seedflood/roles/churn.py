"""The churn step strategy: apply only committed steps (docs/churn-design.md).

Owns: a churn client's schedule — the committed chain it votes on (`agreement.Agreement` via its
`Voter`), every decided step from 0 (`history`), each step's hops on the hop clock's phase
(`step_hops`), the notes that schedule edge work (`on_notes`), the edges graph repair adds after a
committed leave (`repair`, churn.repair: grown over a `transport.Growing` transport, then healed),
streaming decided steps to the evaluator as the attach node (`follow`), and audits. Its two halves
live beside it: bringing a process in (`churnjoin.Joining`: sponsoring a restart or a brand-new
id, catch-up, rejoin) and its edges (`churnedges.EdgeWork`: graceful leave, heals, links, lost
peers).

The transport drops a failed peer instead of raising (`take_lost`), the flood stops sending to it,
and no step is applied until a strict majority of its roster committed its content: at the end of
local step t the client votes on step t − vote_lag (what it holds), reviews the votes it holds
(commits, next ballots), and applies step t − delay once committed and held; until then it keeps
hopping without originating (bounded by `protocol.patience_hops`, then it stops with one line;
over a healing transport up to `Protocol.HEAL_FACTOR` timeouts more, whatever its own edges: an
edge anywhere in its part may heal and bring a majority, which the schedule explorer showed a
wait tied to its own down edges stops too early for).
Every `audit_every` steps the client floods an AUDIT note of its state hash; a client whose hash
differs from the majority's is left out of the proposals of the others and excluded once that
commits. A client that cannot reach an agreeing majority, or is excluded, raises
`MembershipError` (one line) and stops, having applied only committed steps.

Assumes: the client floods to every neighbour (shortest-path routes break when a relay dies) and
tolerates conflicting copies until a commit settles them (`churnstart.ChurnStrategy` says so to
the client, and hands this module its `transport.ChurnTransport` and, on an attach node that
feeds the evaluator, the `transport.EvaluatorFeed` to do it with).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from seedflood.core.churn.agreement import Agreement
from seedflood.core.churn.voter import Voter
from seedflood.core.flood import stepstream
from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.transport import EVALUATOR, ChurnTransport, EvaluatorFeed, Growing, Healing, TransportError
from seedflood.core.membership.growth import Growth
from seedflood.core.membership.notes import AUDIT, JOIN, LEAVE, Note, audit_value, link_hop
from seedflood.core.membership.roster import Change, ExcludedError, check_admitted
from seedflood.core.wire.message import Message
from seedflood.roles.churnedges import EdgeWork
from seedflood.roles.churnhealth import Health
from seedflood.roles.churnjoin import Joining, step_payload
from seedflood.roles.strategy import Host, Records

log = logging.getLogger(__name__)

IDLE_S = 0.01  # a client waiting past its patience for an edge to heal hops at most this often (s)


class Churn(Joining, EdgeWork):
    """A churn client's schedule and membership (`host.Mode`); its joining and edge halves are
    `churnjoin.Joining` and `churnedges.EdgeWork`, over their shared `churnbase.ChurnBase`."""

    def __init__(
        self,
        host: Host,
        transport: ChurnTransport,
        *,
        state_hash: Callable[[], str] | None,
        attach: int,
        evaluator: EvaluatorFeed | None,
        incarnation: int,
        growth: Growth | None = None,
    ) -> None:
        """See `churnstart.ChurnStrategy`; `transport` is the one `host` hops on."""
        p = host.protocol
        if p.audit_every and state_hash is None:
            raise ValueError(f"node {host.node}: the protocol audits every {p.audit_every} steps: pass state_hash")
        self.host = host
        self.transport = transport
        self.health = Health()  # counts for the sinks (churnhealth.py): nothing decides on them
        self.agreement = Agreement(host.node, p.ids, p.perturbations, incarnation, p.roster(attach=attach), due=p.due)
        """The committed chain and roster, and this client's votes."""
        self.voter = Voter(p, host.flood, self.agreement, lambda line: log.error("node %d: %s", host.node, line))
        self.state_hash = state_hash
        self.feed = evaluator
        self._fed = 0  # the transport's evaluator edge (count) that got its catch-up blob
        self.history: list[tuple[int, list[Message]]] = []
        self.certificates: dict[int, bytes] = {}  # signed: step -> the certificate of its commit (certificate.py)
        """Every decided step from 0, what a sponsor hands a rejoining neighbour."""
        self.joined_at = 0  # first step this client originates (a rejoined client: its JOIN step)
        self._deferred: set[int] = set()  # restarted neighbours still members under their old incarnation
        self._links: dict[int, list[Note]] = {}  # hop index -> JOIN notes whose edges connect then
        self.healer = transport if isinstance(transport, Healing) else None
        """The transport, where its down edges heal (in memory and over gloo: both are `Healing`)."""
        self._heal_at: dict[int, int] = {}  # peer -> the exchange index its healed edge connects at
        self._alone: int | None = None  # the hop clock held while this client has no edge and waits for one (`heal`)
        self.leaving = False
        """Asked to leave (`leave`): originates nothing more, sponsors nobody, and stops with
        `Left` once a committed step leaves it out."""
        self._unlink: dict[int, int] = {}  # leaving neighbour -> the exchange index its edge closes before
        self._parted: set[int] = set()  # neighbours that left gracefully: never healed
        self.growth = growth
        """The join rule of a run open to new ids (churn.max_nodes) and graph repair
        (churn.repair), None where neither is on."""
        self.grower = transport if growth is not None and isinstance(transport, Growing) else None
        """The transport, where brand-new ids may join and repair may add edges (in memory, and
        launched over gloo: new ids knock through the run's store)."""
        self.voter.growth = growth  # a ballot's quiet time follows the committed graph (`Voter.pace`)
        self._seen: dict[int, int] = {}  # a knocking new id this member is linked to -> the hop it first saw it
        self._expected: dict[int, int] = {}  # a new id this member grew its end to, not yet admitted -> its JOIN step
        self._noted: set[int] = set()  # those whose JOIN step is the note's (else the knock's guess)

    @property
    def changes(self) -> Mapping[int, Change]:
        return self.roster.changes

    def resume(self, records: Records, cut: int, changes: Mapping[int, Change]) -> None:
        """Every logged step is committed (keeping its decision); those >= cut wait to be applied."""
        for s, msgs in records:
            self.agreement.extend(s, msgs, changes.get(s), pending=s >= cut)
        self.history = [(s, list(msgs)) for s, msgs in records[:cut]]
        self.voter.logged = len(records)

    def step(self, t: int) -> None:
        h = self.host
        self.boundary(t)
        self.health.begin(t, h.hops_run)
        if t >= self.joined_at and not self.leaving:  # a rejoining client originates from its JOIN step
            h.flood.originate(h.estimate(t))
        self.step_hops(t)
        self.agree(t)
        self.apply_through(t - h.protocol.delay, t)
        h.next_step = t + 1

    def step_hops(self, t: int) -> None:
        """The hops of local step t: up to the next exchange index that is a multiple of
        `protocol.hops` (`hops` of them where the step began on one, as every step does while
        nobody waits). Every client of a connected run shares the hop clock, and an exchange
        waits for each neighbour to start it, so a client whose steps begin off that phase (it
        waited a hop or two for a commit, a newcomer starts at its sponsor's clock mid-step)
        runs its forwards while its neighbours wait in an exchange, and theirs while it waits:
        the forwards of the run serialize and every later step is slower (measured: 1.8x per
        step after a cut healed, docs/benchmarks.md). A shorter step puts its step boundaries
        back on the phase, where the schedule plans them (its vote of step s at the exchange
        index the others cast theirs). Timing only: which exchange carries a frame changes no
        committed value (the agreement is timing-free), so no bit depends on it."""
        h = self.host
        n = h.protocol.hops
        for _ in range(n - h.hops_run % n):  # counted once: a client alone holds its clock (`heal`)
            h.hop(t)

    def on_notes(self, new: Sequence[object], sender: int | None = None) -> None:
        """Remember the JOIN notes among `new` by the hop index their edges connect at, and the
        LEAVE note of `sender` itself by the hop index its edge closes before: only the leaver's
        own frame closes its edge (it carries the note first, straight from it), so a relay
        cannot close the edge between two others with a LEAVE note it made up."""
        for n in new:
            if isinstance(n, Note) and n.kind == JOIN:
                self._grow(n.origin, n.step)
            if isinstance(n, Note) and n.kind == JOIN and link_hop(n) >= self.host.hops_run:
                self._links.setdefault(link_hop(n), []).append(n)
            if isinstance(n, Note) and n.kind == LEAVE and n.origin == sender and sender in self.host.flood.peers:
                self._unlink[n.origin] = n.value

    def before_hop(self) -> None:
        h = self.host
        if self.grower is not None and h.next_step < h.protocol.steps:
            self._knock(h.next_step)
        self.unlink()
        self.link()
        self.heal()

    def follow(self, feed: EvaluatorFeed) -> None:
        """As the attach node, between steps: answer the evaluator if it greets us (a start, a
        restart, or a failover from the attach node before us), and open each new evaluator edge
        with the committed steps it lacks; those applied from then on are pushed (`apply_committed`)."""
        feed.attach = True
        if not feed.evaluator_connected:
            feed.poll(evaluator_only=True)
        link = feed.evaluator_links
        if not feed.evaluator_connected or link == self._fed:
            return
        self._fed = link
        needs = feed.evaluator_needs()
        sent = [(s, m) for s, m in self.history if s >= needs]
        blob = stepstream.encode_pushes((s, step_payload(self, s, m)) for s, m in sent)
        try:
            feed.send_blob(EVALUATOR, blob)
        except TransportError as e:  # the evaluator is dropped; it greets again
            log.warning("node %d: catch-up to the evaluator failed: %s", self.host.node, e)
            return
        log.warning(
            "node %d: the evaluator follows this node; %s", self.host.node, _catch_up_said(sent, needs, self.history)
        )

    # -- agreement --------------------------------------------------------------------------------
    def drain(self) -> None:
        """After the last step: hop, vote and commit on without originating until every step is
        applied, then hop on for as long as a vote takes to spread, so that the votes this client
        holds reach a neighbour still waiting for them."""
        h = self.host
        last = h.protocol.steps - 1
        t = max(h.next_step, h.protocol.steps)
        while h.applier.last_step < last:
            self.step_hops(t)
            self.agree(t)
            self.apply_through(min(t - h.protocol.delay, last), t)
            t += 1
        for _ in range(h.protocol.delay - h.protocol.vote_lag):
            h.hops(t)
            t += 1

    def agree(self, t: int) -> None:
        """End of local step t (or of a hop waited at t): vote, commit, move votes on. A leaving
        client that a committed step left out says goodbye and raises `Left`."""
        try:
            commits = self.voter.after(t, self.host.hops_run)
        except ExcludedError:
            if not self.leaving or self.host.node in self.roster.members:
                raise
            raise self._goodbye(t) from None
        for s, change in commits:
            mine = self.agreement.mine.get(s)
            self.health.commit(s, self.host.hops_run, None if mine is None else mine.ballot)
            if change:
                log.warning("node %d: membership %s", self.host.node, change.describe())
            for j, _ in change.join:
                self._grow(j, change.step)
            if change.leave:
                self.repair(change.step)

    def repair(self, step: int) -> None:
        """Committed step `step` left members out: add this member's ends of the edges graph
        repair gives the graph committed through it (`growth.Growth.repaired`: the same at every
        client that commits it). Each edge then heals like any down edge between live members:
        both ends ask before every exchange and connect at the index they agreed (`heal`)."""
        g, me = self.growth, self.host.node
        if self.grower is None or g is None or not g.repair or me not in self.roster.members:
            return
        for a, b in g.repaired(self.roster.changes, step):
            if me in (a, b):
                other = b if me == a else a
                self.grower.grow([other])
                log.warning("node %d: graph repair after step %d links node %d", me, step, other)

    def apply_through(self, upto: int, t: int | None = None) -> None:
        """Apply every step <= upto, each once committed; the client hops on (as local step t)
        until it is."""
        h = self.host
        while h.applier.last_step < upto:
            self.apply_committed(h.applier.last_step + 1, h.next_step if t is None else t)

    def apply_committed(self, s: int, t: int) -> None:
        """Apply step s once it is committed and its messages are here, hopping on (as local step
        t, originating nothing) until then; tell the listeners, push it to the evaluator if this
        client is the attach node, and audit the state if this step is audited."""
        h = self.host
        waited = 0
        heal_by: float | None = None  # past its patience: when it stops waiting for a down edge to heal
        while (msgs := self.voter.take(s)) is None:
            if waited >= h.protocol.patience_hops:
                if self.healer is None:  # nothing that went down comes back by itself
                    raise self.voter.stuck(s, waited)
                # an edge may heal anywhere in this client's part (a stalled member wakes, a cut
                # link comes back) and bring a majority: wait for it, paced, before stopping
                now = time.monotonic()
                if heal_by is None:
                    heal_by = now + Protocol.HEAL_FACTOR * (h.meet_timeout_s or 0.0)
                if now > heal_by:
                    raise self.voter.stuck(s, waited)
                time.sleep(IDLE_S)
            h.hop(t)
            self.agree(t)
            waited += 1
        h.applier.apply(s, msgs)
        self.history.append((s, msgs))
        if (cert := self.voter.certificates.pop(s, None)) is not None:
            self.certificates[s] = cert
        if s >= h.logged:
            for listener in h.listeners:
                listener(s, msgs)
            feed = self.feed
            if feed is not None and self.roster.attach == h.node and feed.attach:
                feed.push(stepstream.encode_push(s, step_payload(self, s, msgs)), s)
            if h.protocol.audits(s) and self.state_hash is not None:
                value = audit_value(self.state_hash())
                h.flood.originate_notes([Note(s, AUDIT, h.node, value)])
        check_admitted(h.node, s, self.joined_at, self.roster)

    def poll(self) -> None:
        pass  # nothing runs beside the estimate

    def join(self) -> None:
        pass


def _catch_up_said(sent: Records, needs: int, history: Records) -> str:
    """What an attach node logs having sent a (re)connected evaluator that needs the steps from
    `needs` on: the steps its catch-up held, ascending, or that it held none and why (the
    evaluator is ahead of this node's decided steps: they reach it as pushes once decided)."""
    if sent:
        return f"sent it steps {sent[0][0]}..{sent[-1][0]}"
    held = f"steps {history[0][0]}..{history[-1][0]}" if history else "no step yet"
    return f"sent it no steps: it needs steps from {needs} on, this node has decided {held}"
