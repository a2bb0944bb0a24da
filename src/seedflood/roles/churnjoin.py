"""Sponsoring and (re)joining (docs/churn-design.md: Rejoin across processes, A new id joins, A log
server): the part of `churn.Churn` that brings a process into a running run.

Owns: sponsoring a restarted neighbour (`boundary`) or a brand-new id (`_knock`: every member the
join rule links it to sees its knock (`_look`, `_knocking`), and one claims it 2·spread + 1
exchanges later), the sponsor's handshake and catch-up (`_sponsor`, `catch_up`, `_base`: only the
steps after a log server's prefix the newcomer holds, where this client's chain has its digest),
the join rule's edges at this end (`_grow`), and the newcomer's side (`rejoin`: replay the
decided steps, hold the undecided ones, originate from the JOIN step).

Assumes: mixed into `churn.Churn`, which holds the state these methods read and write (declared
below for the type checker).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from seedflood.core.churn import prefix
from seedflood.core.churn.prefix import Have
from seedflood.core.churn.voter import Voter
from seedflood.core.flood import stepstream
from seedflood.core.flood.flooding import FloodError
from seedflood.core.flood.hop import decode_hop, encode_hop
from seedflood.core.flood.transport import ChurnTransport, EvaluatorFeed, Growing, TransportError
from seedflood.core.membership.notes import LEAVE, join_note
from seedflood.core.wire.message import FrameError, Message
from seedflood.roles import rejoinproof
from seedflood.roles.churnbase import ChurnBase

log = logging.getLogger("seedflood.roles.churn")  # one logger for the churn client's lines


class Joining(ChurnBase):
    """The joining half of `churn.Churn` (a mixin: its state is Churn's)."""

    voter: Voter
    feed: EvaluatorFeed | None
    certificates: dict[int, bytes]
    grower: Growing | None
    _deferred: set[int]
    _seen: dict[int, int]

    if TYPE_CHECKING:

        def follow(self, feed: EvaluatorFeed) -> None: ...

        def on_notes(self, new: Sequence[object], sender: int | None = None) -> None: ...

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
        note = join_note(e, p, inc, link)
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

    def catch_up(self, t: int, e: int, inc: int, have: Have = prefix.NOTHING) -> bytes:
        """What a rejoining neighbour needs before step t (`stepstream.CatchUp`): every decided
        step (with its change; signed, with its seals, so the newcomer can stream it to the
        evaluator as its attach node) it does not hold already (`have`, checked by `_base`), the
        messages and notes held for undecided steps, its JOIN step."""
        h = self.host
        base = self._base(have)
        msgs, notes = h.flood.held_items()
        steps = [(s, step_payload(self, s, m)) for s, m in self.history if s >= base]
        held = encode_hop(msgs, notes, signed=h.flood.signing is not None)  # signatures kept
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
        msgs, notes = decode_hop(d.held, h.protocol.limits(0, 2**32 - 1))
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


def step_payload(churn: Joining, s: int, msgs: list[Message]) -> bytes:
    """Decided step s of `churn` for the evaluator or a rejoining neighbour
    (`stepstream.encode_step`); signed, with the step's seals: its messages' signatures and the
    certificate of its commit (this client's, or its sponsor's when it rejoined; none for a step
    it replayed from a log, which an evaluator of a signed run refuses: docs/trust.md, What the
    evaluator and the log verify)."""
    certificate = churn.certificates.get(s, b"") if churn.host.flood.signing is not None else None
    return stepstream.encode_step(msgs, churn.roster.changes.get(s), certificate)
