"""The churn step strategy: apply only committed steps (docs/churn-design.md).

Owns: a churn client's schedule and membership work — the committed chain it votes on
(`agreement.Agreement` via its `Voter`), every decided step from 0 (`history`), sponsoring a
restarted neighbour (`boundary`, `catch_up`) or a brand-new id (`_knock`: every member the join
rule links it to sees its knock, and one claims it 2·spread + 1 exchanges later), rejoining from
a sponsor (`rejoin`), connecting rejoined edges on the shared hop clock (`link`), healing down
edges to live members and to a brand-new id before its admission (`heal`, `_heal_ok`, over
a `transport.Healing` transport), the edges graph repair adds after a committed leave (`repair`,
churn.repair: grown over a `transport.Growing` one, then healed), streaming decided steps to the evaluator as the
attach node (`follow`), audits, and a graceful leave (`leave`: this client stops originating,
hops on until a committed step leaves it out, then floods a LEAVE note and closes its edges
with its neighbours at the hop the note names, raising `Left`; `unlink`, the neighbours' side).

The transport drops a failed peer instead of raising (`take_lost`), the flood stops sending to it,
and no step is applied until a strict majority of its roster committed its content: at the end of
local step t the client votes on step t − vote_lag (what it holds), reviews the votes it holds
(commits, next ballots), and applies step t − delay once committed and held; until then it keeps
hopping without originating (bounded by `protocol.patience_hops`, then it stops with one line;
over a healing transport up to `transport.HEAL_FACTOR` timeouts more, whatever its own edges: an
edge anywhere in its part may heal and bring a majority, which the schedule explorer showed a
wait tied to its own down edges stops too early for).
Every `audit_every` steps the client floods an AUDIT note of its state hash; a client whose hash
differs from the majority's is left out of the proposals of the others and excluded once that
commits. A client that cannot reach an agreeing majority, or is excluded, raises
`membership.MembershipError` (one line) and stops, having applied only committed steps.

Assumes: the client floods to every neighbour (shortest-path routes break when a relay dies) and
tolerates conflicting copies until a commit settles them (`churnstart.ChurnStrategy` says so to
the client, and hands this module its `transport.ChurnTransport` and, on an attach node that
feeds the evaluator, the `transport.EvaluatorFeed` to do it with).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from seedflood.core.churn import prefix
from seedflood.core.churn.agreement import Agreement
from seedflood.core.churn.prefix import Have
from seedflood.core.churn.voter import Voter
from seedflood.core.flood import membership, stepstream
from seedflood.core.flood.flooding import FloodError
from seedflood.core.flood.growth import Growth
from seedflood.core.flood.membership import AUDIT, JOIN, LEAVE, Change, Note, Roster
from seedflood.core.flood.message import FrameError, Message
from seedflood.core.flood.transport import (
    EVALUATOR,
    HEAL_FACTOR,
    ChurnTransport,
    EvaluatorFeed,
    Growing,
    Healing,
    TransportError,
)
from seedflood.roles import rejoinproof
from seedflood.roles.strategy import Host, Records

log = logging.getLogger(__name__)

IDLE_S = 0.01  # a client waiting past its patience for an edge to heal hops at most this often (s)


class Left(Exception):
    """This client left the run gracefully: a committed step left it out after it was asked to
    leave (`Churn.leave`), and its edges are closed. Its message is the one line to print;
    the process exits 0."""

    def __init__(self, node: int, step: int) -> None:
        super().__init__(f"node {node} left at step {step}")
        self.node = node
        self.step = step


class Churn:
    """A churn client's schedule and membership (`host.Mode`)."""

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
    def roster(self) -> Roster:
        """The committed roster: members of the next step to commit; `roster.changes` holds every
        committed change (step -> Change)."""
        return self.agreement.roster

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

    # -- rejoin -----------------------------------------------------------------------------------
    def boundary(self, t: int) -> None:
        """Before step t: sponsor a restarted neighbour that is ours to catch up (its other edges
        connect later, at the hop its JOIN note names: `link`)."""
        h = self.host
        transport = self.transport
        fresh = transport.revived() if t >= self.joined_at and not self.leaving else []  # members sponsor
        # a restarted neighbour whose old incarnation is still a member waits until a committed
        # step has left it out: the new process must never vote or count as its old self
        revived = sorted(set(fresh) | self._deferred)
        self._deferred = {p for p in revived if p in self.roster.members}
        for p in (p for p in revived if p not in self._deferred):
            if (inc := transport.claim(p)) is not None:  # None: another neighbour sponsors it
                self._sponsor(t, p, inc)
        if self.feed is not None and self.roster.attach == h.node:
            self.follow(self.feed)

    def _knock(self, t: int) -> None:
        """Right before an exchange of (or waited at) step t: look for knocks (`_look`) and
        sponsor a brand-new id seen more than 2·spread exchanges ago (spread >= the graph's
        diameter d). An exchange completes only once each neighbour has started it, so by then
        every client within d hops of this one has started an exchange after the knock came, and
        looked before it: every member connected to this one sees the knock before the claim
        hides it. Counted in exchanges, not steps, so a member waiting for a commit (a split
        that a newcomer's edges may bridge) claims it too."""
        for j in self._look(t):
            if self.host.hops_run - self._seen[j] > 2 * self.agreement.quiet:
                if (inc := self.transport.claim(j)) is not None:
                    self._sponsor(t, j, inc)

    def _look(self, t: int) -> list[int]:
        """The brand-new ids knocking that the join rule links this member to (`_knocking`). It
        grows its end of each edge, remembers the hop it first saw each (`_knock` claims one
        2·spread + 1 exchanges later at the earliest) and expects it: the edge then heals
        before the newcomer is admitted (`_heal_ok`), even where this member never gets the
        JOIN note (a cut keeps it from the sponsor's part, and that edge may be its only path
        to the majority whose commit would admit the newcomer)."""
        knocking = self._knocking(t)
        self._seen = {j: self._seen.get(j, self.host.hops_run) for j in knocking}
        for j in knocking:
            assert self.grower is not None  # `_knocking` lists none without it
            self.grower.grow([j])
            self.voter.expect(j, self._seen[j])
            if j not in self._noted:
                self._expected[j] = t + self.host.protocol.delay + 1
        return knocking

    def _knocking(self, t: int) -> list[int]:
        """Brand-new ids this member would link to if a sponsor admitted them at the JOIN step
        of step t (t + delay + 1): the join rule over the graph committed through t − 1 − delay,
        which this client has applied (`growth.Growth`); only those it links to sponsor. An id
        that is a member already is not a newcomer (launched, a second process of it, or one
        after a whole-group relaunch, knocks too): it rejoins as a restart, by its neighbours
        (`revived`, deferred until a committed step has left its old life out)."""
        h, g = self.host, self.growth
        if self.grower is None or g is None or t < self.joined_at or self.leaving or h.node not in self.roster.members:
            return []
        e = t + h.protocol.delay + 1
        if self.agreement.through < e - g.lag:
            return []  # never expected: step t − 1 − delay is applied before step t
        knocking = [j for j in self.grower.newcomers() if j not in self.roster.members]
        return [j for j in knocking if h.node in g.edges(j, e, self.roster.changes)]

    def _sponsor(self, t: int, p: int, inc: int) -> None:
        """Before step t: catch up neighbour `p` (incarnation `inc`), which this client claimed:
        meet it, challenge it in a signed run, flood its JOIN note and send it the log."""
        h, transport = self.host, self.transport
        timeout = h.hop_timeout_s
        if not transport.connect([p], timeout):
            return  # it is gone again
        if why := rejoinproof.challenge(transport, h.flood.signing, p, inc, timeout):  # signed runs
            log.warning("node %d: refused node %d's rejoin (incarnation %d): %s", h.node, p, inc, why)
            transport.drop(p, f"rejoin refused: {why}")
            return
        if (have := _have_of(transport, p, timeout)) is None:  # what it holds already (a log server's prefix)
            log.warning("node %d: node %d said nothing of what it holds: not sponsoring it", h.node, p)
            transport.drop(p, "no word of what it holds")
            return
        # JOIN at e = t + delay + 1: the note gets the hops a message of step t gets before it
        # is applied, so it normally reaches every voter before they propose step e (one that
        # lacks it proposes e without the newcomer, and the ballots settle which commits).
        # Its other edges connect at the hop index where step e's first hop falls if nobody
        # waits: a hop index, not a step, because a client waiting for a commit hops on at
        # its step (its neighbours' steps move on), and because the newcomer and this sponsor
        # may both wait before e for votes that only those edges can bring (F5)
        e = t + h.protocol.delay + 1
        link = h.hops_run + h.protocol.hops * (h.protocol.delay + 1)
        note = membership.join_note(e, p, inc, link)
        h.flood.originate_notes([note])
        self.on_notes([note])
        blob = self.catch_up(t, e, inc, have)
        transport.send_blob(p, blob)
        h.flood.add_peer(p)
        base = self._base(have)
        log.warning(
            "node %d: sponsoring node %d (incarnation %d): joins at step %d, its edges connect at hop %d; "
            "catch-up of %d bytes (%s)",
            h.node,
            p,
            inc,
            e,
            link,
            len(blob),
            f"steps from {base}: it holds 0..{base - 1}" if base else "the whole log",
        )

    def on_notes(self, new: Sequence[object], sender: int | None = None) -> None:
        """Remember the JOIN notes among `new` by the hop index their edges connect at, and the
        LEAVE note of `sender` itself by the hop index its edge closes before: only the leaver's
        own frame closes its edge (it carries the note first, straight from it), so a relay
        cannot close the edge between two others with a LEAVE note it made up."""
        for n in new:
            if isinstance(n, Note) and n.kind == JOIN:
                self._grow(n.origin, n.step)
            if isinstance(n, Note) and n.kind == JOIN and membership.link_hop(n) >= self.host.hops_run:
                self._links.setdefault(membership.link_hop(n), []).append(n)
            if isinstance(n, Note) and n.kind == LEAVE and n.origin == sender and sender in self.host.flood.peers:
                self._unlink[n.origin] = n.value

    def _grow(self, node: int, step: int) -> None:
        """A brand-new id `node` joins at `step` (its JOIN note, or the committed step that
        admitted it): add the edges the join rule gives it at this end, the newcomer's own or
        this member's one to it (`growth.Growth.edges`). A client that has not committed step −
        lag yet cannot tell; it adds the edge when it commits `step`, and the edge heals then."""
        g, me = self.growth, self.host.node
        if self.grower is None or g is None or not g.new(node) or self.agreement.through < step - g.lag:
            return
        edges = g.edges(node, step, self.roster.changes)
        if node == me:
            self.grower.grow(edges)
        elif me in edges:
            self.grower.grow([node])
            if node not in self.roster.members:  # expected: its edge heals before admission too
                self._expected[node] = step
                self._noted.add(node)

    def before_hop(self) -> None:
        h = self.host
        if self.grower is not None and h.next_step < h.protocol.steps:
            self._knock(h.next_step)
        self.unlink()
        self.link()
        self.heal()

    # -- graceful leave ---------------------------------------------------------------------------
    def leave(self) -> None:
        """Asked to leave (an in-process `leave` event, SIGTERM to a launched churn client): from
        the next step on this client originates nothing, so the voters' proposals leave it out
        like a silent client, and the step that commits without it is the same at every client.
        It keeps hopping (relaying, voting) until it commits that step itself (`agree`)."""
        self.leaving = True

    def unlink(self) -> None:
        """Right before exchange number `hops_run`: close the edges of neighbours whose LEAVE note
        names this hop (or an earlier one). The note travels straight from the leaver in the
        exchange before, so both ends close before the same exchange and nobody waits on an edge
        whose other end is gone (no timeout, no lost peer)."""
        h = self.host
        for q in sorted(q for q, at in self._unlink.items() if at <= h.hops_run):
            del self._unlink[q]
            self._parted.add(q)
            if q in h.flood.peers:
                self.transport.part(q)
                h.flood.drop_peer(q)
                log.info("node %d: node %d left gracefully; edge closed before hop %d", h.node, q, h.hops_run)

    def _goodbye(self, t: int) -> Left:
        """A committed step has left this leaving client out: flood the LEAVE note, run the one
        exchange that hands it to every neighbour, close every edge (the neighbours close theirs
        before the same next exchange: `unlink`) and return the one line it stops with."""
        h = self.host
        step = self.agreement.through
        h.flood.originate_notes([membership.leave_note(step, h.node, h.hops_run + 1)])
        h.hop(t)
        for q in sorted(h.flood.peers):
            self.transport.part(q)
            h.flood.drop_peer(q)
        return Left(h.node, step)

    def _healable(self) -> dict[int, int | None]:
        """The down edges this client asks to heal (`_heal_ok`), less those agreed already and
        those to neighbours that left gracefully."""
        h = self.host
        return {
            q: inc
            for q, inc in self._heal_ok().items()
            if q not in h.flood.peers and q not in self._heal_at and q not in self._parted
        }

    def _heal_ok(self) -> dict[int, int | None]:
        """The edges this client may heal, -> the incarnation the other end must run as (None:
        its first life): while it is an admitted member, to every neighbour that is a member of
        its committed roster (as the roster admitted it) and to every brand-new id it expects
        (`_expected`: it grew its end, seeing the knock or the JOIN note, and no committed step
        has decided the join yet); while it is a brand-new id caught up and not yet admitted, to
        every member neighbour (the edges the join rule gave it). So a new id's edges, but its
        sponsor's, come up by the heal negotiation, not by a meeting at its link hop: a member
        the JOIN note never reached (a cut kept it from the sponsor's part) asks too, having seen
        the knock, and neither end waits on a meeting the other never joins. Edges carry frames;
        which come up changes no vote, so none of this touches safety."""
        h, a, roster = self.host, self.agreement, self.roster
        if h.node not in roster.members or roster.incarnations.get(h.node, a.incarnation) != a.incarnation:
            new = self.growth is not None and self.growth.new(h.node)
            if not new or a.through >= self.joined_at:  # joined_at: its JOIN step, once caught up
                return {}
            return {q: roster.incarnations.get(q) for q in self._neighbours() if q in roster.members}
        ok = {q: roster.incarnations.get(q) for q in self._neighbours() if q in roster.members}
        for j, e in list(self._expected.items()):
            if j in roster.members or any(j in dict(c.join) for c in roster.changes.values()):
                del self._expected[j]  # admitted: a member's edge from here on
            elif j in self._noted and a.through >= e:
                del self._expected[j]  # its JOIN step committed without it: it stops
            elif j in self._neighbours():
                ok[j] = 0  # a brand-new id's first life (a later one rejoins as a restart)
        return ok

    def heal(self) -> None:
        """Right before exchange number `hops_run`: ask the transport to heal the down edges to
        live members (never waiting), and connect those whose agreed exchange index is this one.
        Both ends connect right before the same exchange index (the transport's negotiation), so
        the edge's frames stay paired, and both then owe each other everything they hold
        (`Flood.add_peer`). A client with no edge at all has no exchanges to keep paired: its
        clock jumps to the agreed index (a stalled client wakes behind the others' clocks), and
        while it waits for an edge it holds its clock (it would race ahead)."""
        healer, h = self.healer, self.host
        if healer is None:
            return
        want = self._healable()
        if healer.peers or not (want or self._heal_at):
            self._alone = None
        else:
            # alone and waiting for an edge, an exchange with nobody pairs nothing, so the clock
            # holds where this client lost its last edge (at or behind every connected clock)
            # instead of racing ahead of them and having its edges agreed at an index the other
            # ends reach only after they have committed it out (graph repair: a member left alone;
            # a client whose neighbours all stalled, committed out so over gloo)
            self._alone = h.hops_run if self._alone is None else self._alone
            h.hops_run = self._alone
        if want:
            self._heal_at.update(healer.heal(want, h.hops_run))
        if not self._heal_at:
            return
        first = min(self._heal_at.values())
        if not healer.peers and h.hops_run < first:
            h.hops_run = self._jump(want, first) if self._alone is not None else first
            if self._alone is not None:
                self._alone = h.hops_run  # held from here if no edge comes up (never moved back)
        for q in sorted(q for q, at in self._heal_at.items() if at <= h.hops_run):
            at = self._heal_at.pop(q)
            if at < h.hops_run or q in h.flood.peers:
                continue  # never expected: the negotiation hands every index out ahead of the clock
            healer.restore(q)
            if q not in self._heal_ok():
                # committed out since the heal was agreed: close the edge at once, so the other
                # end's receive fails now (it stops and its restart rejoins) instead of waiting
                # out the late bound on a silent edge
                self.transport.drop(q, "committed out since the heal was agreed")
                continue
            h.flood.add_peer(q)
            log.warning("node %d: edge to node %d healed at hop %d", h.node, q, at)

    def _jump(self, want: Mapping[int, int | None], first: int) -> int:
        """A client alone (its clock held) about to jump its clock to `first`, the lowest exchange
        index agreed so far: tell the negotiation that clock first, so that a proposal of its own
        below it is withdrawn rather than accepted after the jump (its other end would connect
        at an exchange this end has passed, and wait on it), or turns out accepted already (then
        that lower index is the one to jump to). Returns the index to jump to."""
        healer = self.healer
        assert healer is not None
        while pending := {q: i for q, i in want.items() if q not in self._heal_at}:
            self._heal_at.update(healer.heal(pending, first))
            if (low := min(self._heal_at.values())) == first:
                break
            first = low
        return first

    def link(self) -> None:
        """Right before exchange number `hops_run`: connect the edges of rejoining neighbours
        whose JOIN note names this hop. Every client of a connected run shares one hop clock
        (each exchange pairs the i-th frames of both ends of an edge, and a newcomer's clock
        starts at its sponsor's), so both ends of an edge connect at the same exchange, whatever
        steps they are at or wait in. One rule on both ends (their rosters agree): the newcomer
        connects its member neighbours, and each member connects it; a neighbour that is itself
        still rejoining connects neither way (connecting one end alone leaves the edge's hops
        unpaired). Each edge is a meeting (the transport connects it only if both ends ask
        within the host's `meet_timeout_s`): a client that gets the note only after its hop (a
        part farther than the note travels in delay + 1 steps, or cut off from a sponsor that
        stalled right after it sponsored) does not ask, and the edge stays down at both ends.
        A brand-new id's edges are not connected here: they heal (`_heal_ok`)."""
        h = self.host
        due = self._links.pop(h.hops_run, [])
        for k in [k for k in self._links if k < h.hops_run]:
            del self._links[k]
        edges: list[int] = []
        for n in due:
            if self.growth is not None and self.growth.new(n.origin):
                continue  # a brand-new id's edges heal (`_heal_ok`)
            if n.origin == h.node:
                if n.value != self.agreement.incarnation:
                    continue  # an earlier incarnation's join
                edges += [q for q in self._neighbours() if q in self.roster.members]
            elif h.node in self.roster.members:
                edges.append(n.origin)
        edges = sorted({q for q in edges if q != h.node and q not in h.flood.peers and q in self._neighbours()})
        for q in self.transport.connect(edges, h.meet_timeout_s) if edges else []:
            h.flood.add_peer(q)

    def after_exchange(self, t: int) -> None:
        """Drop the peers the transport lost in this exchange: the flood stops sending to them."""
        h = self.host
        for peer, why in sorted(self.transport.take_lost().items()):
            log.warning("node %d: lost peer %d at step %d: %s", h.node, peer, t, why)
            h.flood.drop_peer(peer)

    def on_bad_frame(self, peer: int, t: int, error: FrameError) -> None:
        """Nothing of the frame is taken; the edge to its sender closes, as if the sender had
        failed, so a peer that sends garbage, bogus ids or oversize frames is cut off by its
        neighbours and left out by a committed step like a silent client, and no honest client
        stops for it."""
        h = self.host
        log.warning("node %d: dropped peer %d at step %d: bad frame: %s", h.node, peer, t, error)
        self.transport.drop(peer, f"bad frame at step {t}: {error}")
        h.flood.drop_peer(peer)

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
        blob = stepstream.encode_pushes((s, _payload(self, s, m)) for s, m in sent)
        try:
            feed.send_blob(EVALUATOR, blob)
        except TransportError as e:  # the evaluator is dropped; it greets again
            log.warning("node %d: catch-up to the evaluator failed: %s", self.host.node, e)
            return
        log.warning(
            "node %d: the evaluator follows this node; %s", self.host.node, _catch_up_said(sent, needs, self.history)
        )

    def _neighbours(self) -> tuple[int, ...]:
        """Topology neighbours, connected or not (what a churn transport may connect)."""
        return self.transport.neighbours

    def catch_up(self, t: int, e: int, inc: int, have: Have = prefix.NOTHING) -> bytes:
        """What a rejoining neighbour needs before step t (`stepstream.CatchUp`): every decided
        step (with its change; signed, with its seals, so the newcomer can stream it to the
        evaluator as its attach node) it does not hold already (`have`, checked by `_base`), the
        messages and notes held for undecided steps, its JOIN step."""
        h = self.host
        base = self._base(have)
        msgs, notes = h.flood.held_items()
        steps = [(s, _payload(self, s, m)) for s, m in self.history if s >= base]
        held = membership.encode_hop(msgs, notes, signed=h.flood.signing is not None)  # signatures kept
        return stepstream.CatchUp(h.node, t, e, inc, steps, held, h.hops_run, base).to_bytes()

    def _base(self, have: Have) -> int:
        """The first step a catch-up for a newcomer that holds `have` carries: the one after
        `have.step` where this client applied that step and its chain has the newcomer's digest
        there (the digest chains every step before it: the newcomer's prefix is this client's
        history), else 0 (the whole log: a prefix of another history, or one ahead of this
        client, is not built on)."""
        if have.step < 0:
            return 0
        if have.step < len(self.history) and self.agreement.digests.get(have.step) == have.digest:
            return have.step + 1
        return 0

    def rejoin(self, blob: bytes, held: Sequence[tuple[int, bytes]] = ()) -> None:
        """Catch up from a sponsor's payload (`catch_up`) as a restarted client: replay every
        decided step (O(messages)), hold the undecided ones, and originate from the JOIN step.
        `held`: the steps (step, step payload) from 0 this process fetched from a log server and
        checked (`prefix.check`), told the sponsor of, and takes below the catch-up's `base`;
        a catch-up from 0 (the sponsor's chain is not theirs) leaves them out."""
        h = self.host
        if h.next_step or h.applier.last_step >= 0:
            raise FloodError(f"node {h.node}: rejoin must come before the first step")
        d = stepstream.CatchUp.from_bytes(blob)
        if self.agreement.incarnation and d.incarnation != self.agreement.incarnation:
            raise FrameError(
                f"node {h.node}: node {d.sponsor}'s catch-up admits incarnation {d.incarnation}, "
                f"this process is incarnation {self.agreement.incarnation}"
            )
        if d.base > len(held):
            raise FrameError(f"node {h.node}: node {d.sponsor}'s catch-up starts at step {d.base}, past what it holds")
        if held and not d.base:
            log.warning(
                "node %d: node %d sent its whole log: the log server's steps 0..%d are not its chain (left out)",
                h.node,
                d.sponsor,
                len(held) - 1,
            )
        self.agreement.incarnation = d.incarnation
        steps: list[tuple[int, list[Message]]] = []
        for s, payload in [*held[: d.base], *d.steps]:
            if s != len(steps):
                raise FrameError(f"node {h.node}: catch-up from node {d.sponsor} jumps to step {s}")
            msgs, change, certificate = stepstream.decode_signed_step(payload, s, seed_of=h.protocol.seed)
            if certificate:  # the sponsor's proof of its commit, for the evaluator should it follow us
                self.certificates[s] = certificate
            # the chain is checked later, not here: this client commits nothing until a majority's
            # votes name the digest its replayed history ends on (a forked sponsor is found there)
            self.agreement.extend(s, msgs, change)
            h.protocol.check_step(s, msgs, members=self.roster.members)
            steps.append((s, msgs))
        h.applier.apply_all(steps)
        self.history = steps
        h.flood.applied_through = len(steps) - 1
        msgs, notes = membership.decode_hop(d.held, h.protocol.limits(0, 2**32 - 1))
        notes = [n for n in notes if n.kind != LEAVE]  # one hop: an earlier life's goodbye is not this one's
        h.flood.restore(msgs)
        h.flood.originate_notes(notes)
        h.hops_run = d.hop  # the sponsor's hop clock: this client's first exchange is its hop d.hop
        self.on_notes(notes)
        h.next_step = d.next_step
        h.logged = self.voter.logged = len(steps)
        self.joined_at = self.agreement.rejoins_at = d.join_step
        self.transport.connect([d.sponsor], h.hop_timeout_s)
        h.flood.add_peer(d.sponsor)
        # a new id that never left: its first life, so it joins (every other catch-up rejoins)
        first = self.growth is not None and self.growth.new(h.node)
        first = first and not any(h.node in c.leave for c in self.roster.changes.values())
        log.warning(
            "node %d: %s by replaying %d steps from node %d%s; originates from step %d",
            h.node,
            "joined" if first else "rejoined",
            len(steps),
            d.sponsor,
            f" (steps 0..{d.base - 1} from the log server)" if d.base else "",
            self.joined_at,
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
        except membership.ExcludedError:
            if not self.leaving or self.host.node in self.roster.members:
                raise
            raise self._goodbye(t) from None
        for _, change in commits:
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
                    heal_by = now + HEAL_FACTOR * (h.meet_timeout_s or 0.0)
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
                feed.push(stepstream.encode_push(s, _payload(self, s, msgs)), s)
            if h.protocol.audits(s) and self.state_hash is not None:
                value = membership.audit_value(self.state_hash())
                h.flood.originate_notes([Note(s, AUDIT, h.node, value)])
        membership.check_admitted(h.node, s, self.joined_at, self.roster)

    def poll(self) -> None:
        pass  # nothing runs beside the estimate

    def join(self) -> None:
        pass


def _have_of(transport: ChurnTransport, peer: int, timeout_s: float | None) -> Have | None:
    """A newcomer's word of the steps it holds (`churnstart.sponsored_catch_up` sends it right
    after the meeting, and the signed challenge): None when none comes (it is gone); one that is
    not a `Have` counts as holding nothing (the whole log goes)."""
    try:
        data = transport.recv_blob(peer, rejoinproof.WAIT_S if timeout_s is None else timeout_s)
    except TransportError:
        return None
    try:
        return Have.from_bytes(data)
    except FrameError:
        return prefix.NOTHING


def _payload(churn: Churn, s: int, msgs: list[Message]) -> bytes:
    """Decided step s of `churn` for the evaluator or a rejoining neighbour
    (`stepstream.encode_step`); signed, with the step's seals: its messages' signatures and the
    certificate of its commit (this client's, or its sponsor's when it rejoined; none for a step
    it replayed from a log, which an evaluator of a signed run refuses: docs/trust.md, What the
    evaluator and the log verify)."""
    certificate = churn.certificates.get(s, b"") if churn.host.flood.signing is not None else None
    return stepstream.encode_step(msgs, churn.roster.changes.get(s), certificate)


def _catch_up_said(sent: Records, needs: int, history: Records) -> str:
    """What an attach node logs having sent a (re)connected evaluator that needs the steps from
    `needs` on: the steps its catch-up held, ascending, or that it held none and why (the
    evaluator is ahead of this node's decided steps: they reach it as pushes once decided)."""
    if sent:
        return f"sent it steps {sent[0][0]}..{sent[-1][0]}"
    held = f"steps {history[0][0]}..{history[-1][0]}" if history else "no step yet"
    return f"sent it no steps: it needs steps from {needs} on, this node has decided {held}"
