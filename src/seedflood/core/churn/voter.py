"""A client's agreement over its flood, on the protocol's schedule (docs/churn-design.md, One history).

Owns: `Voter` — an `agreement.Agreement` driven by the client's flood: what a churn client
(roles/churn.py) calls at the end of every local step (and of every hop it waits), and what the
schedule explorer (tests/explorer.py) drives through every fault schedule, so both run the same
decisions — its vote schedule (step s is voted at local step s + vote_lag), the evidence it
proposes against (two copies of one message id, two signed votes in one ballot, a differing
audited state hash, a scalar that did not recompute: `liars`, filled by roles/audit.py), whether
its votes count against liars (a signed flood), and taking a
committed step's messages from the flood (with, when signed, its certificate: certificate.py);
`joins_in`, the newcomers a step's JOIN notes name; and how long it waits in a ballot's view
(`pace`: the agreement's `quiet`, timing only), which joins may lengthen (docs/churn-design.md,
A new id joins).

Assumes: pure Python (the core); the flood holds the step's messages and notes (VOTE, JOIN,
AUDIT) as received; one thread uses the voter, its flood and its agreement at a time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from seedflood.core.churn.agreement import Agreement, Value, Vote, step_digest
from seedflood.core.churn.certificate import certify
from seedflood.core.flood.flooding import Flood
from seedflood.core.flood.protocol import Protocol
from seedflood.core.membership.growth import Growth
from seedflood.core.membership.notes import AUDIT, JOIN, VOTE, Note
from seedflood.core.membership.roster import Change, MembershipError, MinorityError, audit_verdict
from seedflood.core.wire.message import Message

MAX_CHOICES = 12  # equivocated ids of one step whose copies a client tries in every combination (2^12 digests)


def joins_in(notes: Iterable[Note]) -> dict[int, int]:
    """origin -> incarnation of the JOIN notes among `notes`."""
    return {n.origin: n.value for n in notes if n.kind == JOIN}


class Voter:
    """One client's agreement over its flood, on the protocol's schedule (roles/churn.py).

    `after(t, now)`: at the end of local step t (or of a hop waited at t), vote on every step whose
    vote time (s + vote_lag) has come and that this client has not voted on, then commit what
    the held votes prove and move its vote on (`Agreement.review`). `take(s)`: the messages of
    committed step s, taken from the flood, once they are all here.
    """

    def __init__(
        self,
        protocol: Protocol,
        flood: Flood,
        agreement: Agreement,
        on_error: Callable[[str], None],
        *,
        growth: Growth | None = None,
        liars: dict[int, str] | None = None,
    ) -> None:
        self.protocol = protocol
        self.flood = flood
        self.agreement = agreement
        self.on_error = on_error  # told once per origin named (two copies, an audit)
        self.logged = 0  # steps before this came from a log or a catch-up: never voted on
        self.spread = (protocol.delay - protocol.vote_lag) * protocol.hops  # a vote's spread over the topology
        agreement.quiet = self.spread
        self.growth = growth
        """The join rule of a run open to new ids or with graph repair: its committed graph,
        widened by joins, sets how long a ballot's view must stay quiet."""
        self._paced: tuple[int, frozenset[tuple[int, int]], int] | None = None  # (through, pending, quiet)
        self._expected: dict[int, int] = {}  # brand-new id whose knock the client saw -> the hop its edges are up by
        agreement.byzantine = flood.signing is not None  # signed votes: count against f liars
        self._named: set[int] = set()
        self.differs: set[int] = set()  # committed steps whose held copies hash to another digest
        self.liars: dict[int, str] = {} if liars is None else liars
        """origin -> why: a scalar of it that this client recomputed (or re-checked) and that
        differs from what it sent (verification by recomputation, roles/audit.py, which fills
        the dict it was handed)."""
        self._decoded: dict[Note, Vote] = {}
        self.certificates: dict[int, bytes] = {}
        """Signed votes only: step -> the certificate of a committed step taken (certificate.py),
        until the client takes it for the evaluator (`roles/churn.py`)."""

    def skip(self, logged: int) -> None:
        """Steps 0..logged-1 came from a log or a catch-up: never voted on."""
        self.logged = logged

    def after(self, t: int, now: int) -> list[tuple[int, Change]]:
        """`now`: hops this client has run (its clock for a ballot's quiet time)."""
        a, p = self.agreement, self.protocol
        for s in range(max(a.through + 1, self.logged), min(t - p.vote_lag, p.steps - 1) + 1):
            if s in a.mine:
                continue
            value = self.propose(s)
            if value is None:
                break  # not a voter of s (yet), so not of the steps after it either
            self.flood.originate_notes([a.vote(s, 0, value)])
        self.pace()
        if a.byzantine:  # signed: what it holds proof against (`tally`: their votes make nothing possible)
            a.proven = frozenset(self.flood.conflicts) | frozenset(self.liars)
        commits, votes = a.review(self.votes, self.propose, now)
        self.flood.originate_notes(votes)
        if commits:  # forget decoded votes of committed steps
            self._decoded = {n: v for n, v in self._decoded.items() if n.step > a.through}
        return commits

    def expect(self, node: int, seen: int) -> None:
        """The client saw brand-new id `node` knock at hop `seen` (the join rule links it to
        this client): the newcomer is claimed within 2·spread + 1 exchanges of a knock seen by a
        member within the spread, and its edges heal `Protocol.JOIN_GRACE` exchanges after the claim; no
        view is quiet before a spread past that (`pace`)."""
        self._expected.setdefault(node, seen + 3 * self.agreement.quiet + 1 + Protocol.JOIN_GRACE)

    def pace(self) -> None:
        """How long this client's views must stay unchanged before it leaves a ballot (`quiet`,
        timing only: the commit rule is timing-free, so no choice here can fork): a vote's spread
        over the widest part of the members' committed graph with the brand-new ids whose JOIN
        notes it holds for undecided steps (`Growth.spread`), at least the topology's. Joins may
        widen the graph beyond the diameter the delay was planned for (up to D + 2), and a part
        wider than the spread its voters wait for can split every later ballot: each side leaves
        a ballot on its own votes before the other side's arrive. And no view is quiet before a
        spread past the hop by which the edges of a newcomer it expects (`expect`) are up: the
        edges may join parts whose voters would otherwise leave a ballot apart (each alone with
        its own value possible) and split the next one for good. Bounded: a join that never
        comes delays a ballot by at most that wait."""
        a, p = self.agreement, self.protocol
        if self.growth is None:
            return
        ups = [hop for j, hop in self._expected.items() if j not in a.roster.members]
        pending: dict[int, int] = {}  # brand-new id -> its JOIN step, undecided
        lag = self.growth.lag  # a JOIN note further ahead cannot be computed on yet
        for s in range(a.through + 1, min(a.through + lag, p.steps - 1) + 1):
            for n in self.flood.notes(s, JOIN):
                if self.growth.new(n.origin) and n.origin not in a.roster.members:
                    pending[n.origin] = s
        key = frozenset(pending.items())
        if self._paced is None or self._paced[:2] != (a.through, key):
            spread = self.growth.spread(a.roster.changes, a.through, pending)
            self._paced = (a.through, key, max(self.spread, spread))
        a.quiet = self._paced[2]
        a.calm = max(ups) + a.quiet if ups else 0

    def votes(self, s: int) -> list[Vote]:
        """The votes held for step s (each note decoded once)."""
        out = []
        for note in self.flood.notes(s, VOTE):
            if (v := self._decoded.get(note)) is None:
                v = self._decoded[note] = Vote.of(note, self.protocol.ids)
            out.append(v)
        return out

    def propose(self, s: int) -> Value | None:
        """What this client holds for step s, less the origins it has evidence against: two
        copies of one message id, two votes signed in one ballot, a scalar that did not recompute
        (`liars`), or an audited state hash that differs from the majority's (the audit of the step
        whose notes have had a vote's spread to reach every voter)."""
        p = self.protocol
        excluded = set(self.flood.conflicts)
        for o in sorted(excluded - self._named):
            self._named.add(o)
            self.on_error(f"node {o} signed or sent two different items under one id ({self.flood.conflicts[o]})")
        for o, why in sorted(self.liars.items()):
            if o not in self._named:
                self._named.add(o)
                self.on_error(why)
            excluded.add(o)
        audited = s - 2 * (p.delay - p.vote_lag) - 1
        if audited >= 0 and p.audits(audited):
            votes = self.flood.notes(audited, AUDIT)
            odd = audit_verdict(self.agreement.node, audited, votes, self.agreement.roster.members)
            for o in sorted(set(odd) - self._named):
                self._named.add(o)
                self.on_error(f"audit of step {audited}: node {o}'s state differs from the majority's")
            excluded |= set(odd)
        joins = joins_in(self.flood.notes(s, JOIN))
        return self.agreement.propose(s, self.flood.held(s), self.flood.messages, joins, excluded)

    def take(self, s: int) -> list[Message] | None:
        """The messages of committed step s, taken from the flood, once all are here; None while
        s is uncommitted or a message is still missing. Where an origin equivocated this client
        applies the copies that hash to the committed digest; while no held copies do (the
        committed copy may still be on its way as a COPY note) it waits, and `stuck` stops it:
        it never applies another history."""
        value = self.agreement.pending.get(s)
        if value is None:
            return None
        msgs = self.flood.messages(s, value.members)
        if len(msgs) != self.expected(s, value):
            return None
        if step_digest(value.prev, s, msgs, value.joins) != value.digest:
            chosen = self._committed_copies(s, value)
            if chosen is None:
                self.differs.add(s)
                return None
            self.flood.choose(chosen)
        self.differs.discard(s)
        del self.agreement.pending[s]
        if (proof := self.agreement.proofs.pop(s, None)) is not None:
            cert = certify(s, self.flood.notes(s, VOTE), value, proof, self.protocol.ids)
            if cert is not None:
                self.certificates[s] = cert.to_bytes()
        return self.flood.take_step(s, value.members)

    def expected(self, s: int, value: Value) -> int:
        """How many messages committed step s holds: K per member due at s (zo.stride)."""
        return sum(self.agreement.expected(o, s) for o in value.members)

    def _committed_copies(self, s: int, value: Value) -> list[Message] | None:
        """The held copies of step s's messages whose digest is the committed one, or None."""
        choices = self.flood.copies(s, value.members)
        if sum(len(c) > 1 for c in choices) > MAX_CHOICES:
            return None  # too many equivocated ids to try every pick (their origins are excluded anyway)
        for pick in itertools.product(*choices):
            if step_digest(value.prev, s, pick, value.joins) == value.digest:
                return list(pick)
        return None

    def stuck(self, s: int, waited: int) -> MembershipError:
        """The one line of a client that waited `waited` hops for step s in vain."""
        a = self.agreement
        if s in self.differs:
            return MembershipError(
                f"node {a.node}: its copy of step {s} differs from the one a majority committed "
                f"(digest {a.pending[s].digest:016x}) and no other copy reached it within {waited} extra hops: "
                "it stops rather than apply another history"
            )
        if (value := a.pending.get(s)) is not None:  # committed, but messages never came
            missing = self.expected(s, value) - len(self.flood.messages(s, value.members))
            return MinorityError(
                f"node {a.node}: step {s} was committed but {missing} of its messages did not reach this "
                f"client within {waited} extra hops (it was stalled or cut off while they were flooded): "
                "this client stops (restart it to rejoin by replay)"
            )
        heard = sorted({v.origin for v in self.votes(s)} & a.roster.members)
        return MinorityError(
            f"node {a.node}: step {s} was not committed within {waited} extra hops (votes from "
            f"{len(heard)} of {len(a.roster.members)} members: {', '.join(map(str, heard)) or 'none'}; "
            f"committed through step {a.through}): no reachable majority agrees, this client stops "
            "(the majority, if any, trains on; restart this client to rejoin by replay)"
        )
