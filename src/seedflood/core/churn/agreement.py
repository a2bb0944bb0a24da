"""One agreed history under churn: every step's content is committed by a strict majority.

Owns (docs/churn-design.md, "One history"):
- `Value`: what a step holds — the origins whose messages it applies (`members`), the newcomers
  among them with their incarnations (`joins`), the digest of the step before (`prev`) and its
  own digest (`digest` = H(prev, step, the messages, joins): a hash chain over the history).
- `Vote`: (step, ballot, origin, incarnation, value), flooded as a VOTE note like any message.
- `Tally` and `verdict`: what the votes of one ballot held here prove — a committed value (a
  strict majority of the step's roster voted it), the values that could still reach a majority,
  and whether the ballot is closed (no value can commit in it any more, except at most one).
- `Agreement`: one client's side — its proposals, its votes, the committed chain and roster, and
  the rule that moves a vote to the next ballot.
An `Agreement` driven by the client's flood and schedule is voter.py's `Voter`.

The rule. Step s's voters are R_s, the members after the committed step s − 1 (a pure function
of the committed history). Each voter votes once per ballot. Ballot 0: at its vote time a voter
proposes what it holds (the eligible origins whose K messages of s are all here). A value is
committed once a strict majority of R_s voted it in one ballot. A voter moves from ballot b to
b + 1 only when its view of ballot b is closed: no value has a majority yet, fewer than a
majority of R_s are still unheard (so no value nobody has voted yet can win b), and at most one
value voted in b could still win (its votes + the unheard ≥ a majority). It votes that value in
b + 1 if there is one (it may have been committed somewhere), else a fresh proposal.

Why at most one value is ever committed for a step (any timing, any crash, stall, cut or
partition; non-Byzantine clients; lying voters below): two majorities of R_s share a voter, who votes once per
ballot, so one ballot commits at most one value. If X is committed in ballot b, every vote in
every later ballot is X: a voter leaving b sees X as possible (X's voters are in its view as X
or unheard), so it is forced to X; a voter leaving a later ballot c − 1 whose votes are all X
sees X possible (all seen votes are X, the rest unheard), so it is forced to X again. Hence no
other value reaches a majority in any ballot. Every client knows R_s and the committed digest of
s − 1 identically (induction over steps), so they count the same votes the same way; a client
applies X only if the messages it holds for X hash to X's digest, so equal digests mean equal
bits. A client whose chain differs from what a majority voted (a forked sponsor, a corrupted
copy) cannot commit and stops; it never applies a different history.

Liveness (what timing buys): in a connected part holding a majority of R_s, every vote any of
its clients holds reaches all of them, so they reach the same verdicts. A step commits once the
part's ballot-0 proposals agree (the survivors' diameter fits the vote lag) or, after a closed
ballot, on the forced or fresh value. It can wait forever only if two values each keep enough
unheard voters to possibly win: that needs at least 2·q − |R_s| unheard voters (q the majority),
i.e. two or more members cut off while the part's proposals split. Clients bound that wait and
stop with one line (docs/churn-design.md, Liveness, states it; the explorer counts such schedules).

Lying voters (signed votes, `Agreement.byzantine`; docs/churn-design.md, Lying voters). With
trust.sign every vote carries its origin's signature, so a voter can lie only in what it signs
itself: two votes in one ballot, a value it does not hold, or none. Bound: at most f = ⌊(n − 1)/3⌋
of R_s lie (n ≥ 3f + 1). The rule changes in three places, and with f = 0 it is the rule above:
(1) quorum q = max(crash quorum, ⌈(n + f + 1)/2⌉), so two quorums of a ballot share
2q − n ≥ f + 1 voters, one of them honest, who signs one vote a ballot: one ballot commits at
most one value, whoever counts (a double voter counts for each value it signed, so q signed
votes are a proof every client holding them counts alike); (2) possible and closed use q − f
in place of q: if X is committed in ballot b, at least q − f honest voters signed X, and an
honest voter shows an honest view only its one vote or nothing, so every honest view of b has
votes(X) + unheard ≥ q − f: X is possible there (a liar may show that view anything, which is
why q itself would not do), and, with at most one value possible, forced; in later ballots
every honest vote is X and n − f ≥ q − f honest voters show X or nothing, so X is forced again,
and no other value gets q − f ≥ 1 honest votes, hence no quorum, in b or after; (3) a voter
leaves only if the one possible value has more than f votes (an honest voter signed it, so
some honest client held it), which only withholds moves: a value only liars voted is never
forced. Liveness: a liar can delay, not fork. Mute, it is a crashed voter; a double or bogus
vote adds a value that may be possible, so a view with two possible values waits for more
votes; where honest ballot-0 proposals split and a liar stays silent, q − f can keep two
values possible for good (a single vote phase cannot avoid it below n ≥ 5f + 1), and clients
stop with one line after `protocol.patience_hops`, never forking.

Assumes: pure Python (the core); notes were checked by their codec; one process per
(origin, incarnation) votes (a restarted origin votes under its new incarnation, and the roster
ignores votes from any other incarnation than the one it admitted).
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from seedflood.core.membership.notes import VOTE, Note
from seedflood.core.membership.roster import Change, ExcludedError, MembershipError, Roster
from seedflood.core.wire import message
from seedflood.core.wire.message import FrameError, Message

GENESIS = 0
"""The digest before step 0."""

_HEAD = struct.Struct("<IQQH")  # incarnation, prev, digest, joins count
_JOIN = struct.Struct("<II")  # origin, incarnation
_CHAIN = struct.Struct("<QI")  # prev, step


def step_digest(prev: int, step: int, msgs: Sequence[Message], joins: Sequence[tuple[int, int]]) -> int:
    """H(prev, step, the step's messages in canonical order, its joins) as a u64."""
    if any(m.scalar == 0.0 for m in msgs):  # ±0 compare equal but encode apart: never from the cache
        return _step_digest(prev, step, msgs, joins)
    return _cached_digest(prev, step, tuple(msgs), tuple(joins))


@functools.lru_cache(maxsize=4096)
def _cached_digest(prev: int, step: int, msgs: tuple[Message, ...], joins: tuple[tuple[int, int], ...]) -> int:
    """`_step_digest`, remembered: every client digests the same messages of a step (its proposal,
    then the step it takes), so most calls in one process repeat one. Messages that compare
    equal encode alike (their fields but `sig`, which no digest reads; a nonzero float equals
    only itself bit for bit), so a hit is the digest the call would compute."""
    return _step_digest(prev, step, msgs, joins)


def _step_digest(prev: int, step: int, msgs: Sequence[Message], joins: Sequence[tuple[int, int]]) -> int:
    h = hashlib.blake2b(_CHAIN.pack(prev, step), digest_size=8)
    h.update(message.encode(sorted(msgs)))
    for o, inc in sorted(joins):
        h.update(_JOIN.pack(o, inc))
    return int.from_bytes(h.digest(), "little")


@dataclass(frozen=True)
class Value:
    """What step s holds: messages of `members` (K each), `joins` ⊆ members are newcomers;
    `evidence`: voters left out on evidence (an audit, two copies of one message), logged as
    the change's `audit` reason."""

    prev: int
    members: frozenset[int]
    joins: tuple[tuple[int, int], ...]
    digest: int
    evidence: frozenset[int] = frozenset()

    def change(self, step: int, roster: Roster) -> Change:
        """The roster change this value makes to the members of the step before."""
        leave = roster.members - self.members
        return Change(step, leave=tuple(sorted(leave)), join=self.joins, audit=tuple(sorted(leave & self.evidence)))


@dataclass(frozen=True)
class Vote:
    step: int
    ballot: int
    origin: int
    incarnation: int
    value: Value

    def note(self, n_origins: int) -> Note:
        v = self.value
        body = _HEAD.pack(self.incarnation, v.prev, v.digest, len(v.joins))
        body += _mask(v.members, n_origins) + _mask(v.evidence, n_origins)
        body += b"".join(_JOIN.pack(o, i) for o, i in v.joins)
        return Note(self.step, VOTE, self.origin, self.ballot, body)

    @classmethod
    def of(cls, note: Note, n_origins: int) -> Vote:
        """The vote a VOTE note carries; FrameError if its body is malformed."""
        got = _vote_body(note.body, n_origins)
        if isinstance(got, str):
            raise FrameError(f"vote of node {note.origin} for step {note.step}: {got}")
        inc, value = got
        return cls(note.step, note.value, note.origin, inc, value)


@functools.lru_cache(maxsize=4096)
def _vote_body(b: bytes, n_origins: int) -> tuple[int, Value] | str:
    """A VOTE note's body as (incarnation, value), or what is wrong with it. Remembered: every
    client decodes every vote it holds, and the clients of one process hold the same ones (a
    Value is immutable, so sharing it changes nothing)."""
    width = (n_origins + 7) // 8
    if len(b) < _HEAD.size + 2 * width:
        return f"{len(b)} body bytes"
    inc, prev, digest, count = _HEAD.unpack_from(b)
    members = _unmask(b[_HEAD.size : _HEAD.size + width], n_origins)
    evidence = _unmask(b[_HEAD.size + width : _HEAD.size + 2 * width], n_origins)
    rest = b[_HEAD.size + 2 * width :]
    if len(rest) != count * _JOIN.size:
        return "bad joins length"
    joins = tuple(_JOIN.iter_unpack(rest))
    if not {o for o, _ in joins} <= members:
        return "a join outside its members"
    return inc, Value(prev, members, joins, digest, evidence)


def _mask(origins: frozenset[int], n_origins: int) -> bytes:
    mask = bytearray((n_origins + 7) // 8)
    for o in origins:
        mask[o // 8] |= 1 << (o % 8)
    return bytes(mask)


def _unmask(mask: bytes, n_origins: int) -> frozenset[int]:
    return frozenset(o for o in range(n_origins) if mask[o // 8] >> (o % 8) & 1)


# -- counting --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tally:
    """One ballot of one step, as this client's view shows it."""

    committed: Value | None
    """A value a strict majority voted (there is at most one)."""
    possible: tuple[Value, ...]
    """Values on this chain that could still reach a majority in this ballot."""
    closed: bool
    """No value nobody voted yet can win this ballot (fewer than a majority unheard)."""
    heard: frozenset[int]
    """Voters of R_s heard from in this ballot."""
    foreign: Value | None = None
    """A value a majority voted whose chain is not this client's (this client's history differs)."""
    faults: int = 0
    """The lying voters this verdict allows for beyond the proven ones: f less the voters it holds
    proof against (0 unless votes are signed)."""
    support: tuple[int, ...] = ()
    """Votes of each possible value (in `possible`'s order), proven liars' left out."""
    doubled: frozenset[int] = frozenset()
    """Voters heard with two different votes in this ballot (signed votes: proven liars)."""

    @property
    def leavable(self) -> bool:
        """A voter may leave this ballot: it is closed, at most one value is possible, and that
        one has more than f votes (an honest voter cast it, so it is a value an honest client
        held; a value only liars voted is never forced on anyone)."""
        return self.closed and len(self.possible) <= 1 and all(c > self.faults for c in self.support)


def counted(votes: Iterable[Vote], roster: Roster) -> dict[int, Vote]:
    """origin -> its vote, for votes of R_s members under their admitted incarnation; an origin's
    first vote wins (a correct voter never casts two in a ballot; under signed votes one that did
    counts for each value it signed: `tally`)."""
    out: dict[int, Vote] = {}
    for v in votes:
        if v.origin in roster.members and roster.incarnations.get(v.origin, v.incarnation) == v.incarnation:
            out.setdefault(v.origin, v)
    return out


def double_voters(votes: Iterable[Vote], roster: Roster) -> frozenset[int]:
    """Members that cast two different votes in these votes of one ballot under their admitted
    incarnation. With signed votes that is a proof (nobody else can sign them): the origin is
    Byzantine."""
    first: dict[int, Value] = {}
    out = set()
    for v in votes:
        if v.origin in roster.members and roster.incarnations.get(v.origin, v.incarnation) == v.incarnation:
            if first.setdefault(v.origin, v.value) != v.value:
                out.add(v.origin)
    return frozenset(out)


def quorum(members: int, ballot: int) -> int:
    """Votes that commit a value: ballot 0 (everyone proposes what it holds, so its votes may
    split) needs ⌈3n/4⌉, later ballots a strict majority. Any quorum above n/2 is safe (two
    quorums of a ballot share a voter); the larger first one means that where a majority is
    reachable, at most one value of ballot 0 can still be possible once the reachable votes are
    in (two need 2·q0 − n ≥ n/2 unheard voters), so a split ballot 0 never blocks the next."""
    return -(-3 * members // 4) if ballot == 0 else members // 2 + 1


def faults(members: int) -> int:
    """f, the Byzantine voters a roster of n tolerates under signed votes: ⌊(n − 1)/3⌋, the
    largest f with n ≥ 3f + 1."""
    return max(members - 1, 0) // 3


def byzantine_quorum(members: int, ballot: int) -> int:
    """Votes that commit a value under signed votes: the crash quorum (`quorum`), raised to
    ⌈(n + f + 1)/2⌉ where that is larger. Two such quorums share 2q − n ≥ f + 1 voters, so at
    least one honest voter, who signs one vote per ballot; and q ≤ n − f (n ≥ 3f + 1), so the
    honest voters alone can reach it in every ballot after 0 (ballot 0's ⌈3n/4⌉ may need more)."""
    f = faults(members)
    return max(quorum(members, ballot), -(-(members + f + 1) // 2))


def tally(
    votes: Iterable[Vote],
    roster: Roster,
    prev: int,
    ballot: int,
    byzantine: bool = False,
    proven: frozenset[int] = frozenset(),
) -> Tally:
    """The verdict of one ballot's votes (all of step s and `ballot`) for roster R_s and the
    committed digest `prev` of the step before (values on another chain can never be applied).
    `byzantine` (signed votes): up to f = `faults(n)` voters may lie — the Byzantine quorum; a
    double voter counts for each value it signed (a commit is then a proof anyone holding the
    same signed votes counts alike); a value is possible if its votes plus the unheard reach
    q − f (a committed value's honest voters alone show that much to any honest view).

    `proven` (signed votes only): members this client holds proof against (two signed copies,
    a scalar it recomputed, a double vote — the ballot's own double voters count too). Their
    votes and silence are left out of what makes a value possible or a ballot open: a committed
    value's q − f honest votes never come from one of them, so it stays possible without them.
    Without it a 2–2 split of 4 voters whose one side is a liar's stays possible for good (q − f
    = 2 each), though the other side knows it is the liar's."""
    votes = list(votes)
    n = len(roster.members)
    by = counted(votes, roster)
    f = faults(n) if byzantine else 0
    need = max((byzantine_quorum if byzantine else quorum)(n, ballot), 1)
    doubled = double_voters(votes, roster) if byzantine else frozenset()
    reach = need - f  # honest votes + unheard a committed value shows every honest view
    signed = {(v.origin, v.value) for v in votes if v.origin in doubled}  # each signed value once
    counts = Counter([v.value for v in by.values() if v.origin not in doubled] + [x for _, x in signed])
    committed = next((x for x, c in counts.items() if c >= need and x.prev == prev), None)
    foreign = next((x for x, c in counts.items() if c >= need and x.prev != prev), None)
    liars = (doubled | proven) & roster.members if byzantine else frozenset()
    honest = Counter(v.value for o, v in by.items() if o not in liars)  # votes no proof discounts
    unheard = len(roster.members - liars - by.keys())
    possible = tuple(sorted((x for x, c in honest.items() if x.prev == prev and c + unheard >= reach), key=_order))
    support = tuple(honest[x] for x in possible)
    return Tally(committed, possible, unheard < reach, frozenset(by), foreign, max(f - len(liars), 0), support, doubled)


def _order(v: Value) -> tuple[int, int]:
    return (-len(v.members), v.digest)


_Messages = Callable[[int, frozenset[int]], Sequence[Message]]
"""(step, origins) -> the held messages of those origins for that step."""
_Votes = Callable[[int], Iterable["Vote"]]
_Propose = Callable[[int], "Value | None"]


@dataclass(frozen=True)
class Proof:
    """How a step was committed here: in `ballot`, by votes of the voters R_s (`members`, each
    under its admitted incarnation in `incarnations`): what a certificate of it must hold."""

    ballot: int
    members: frozenset[int]
    incarnations: Mapping[int, int]


# -- one client's side -----------------------------------------------------------------------------
@dataclass
class Agreement:
    """The committed chain and roster of one client, and its votes (module docstring)."""

    node: int
    n_origins: int
    per_origin: int
    incarnation: int = 0
    roster: Roster = field(default=None)  # type: ignore[assignment]
    byzantine: bool = False
    """Votes are signed (trust.sign): count them against up to f lying voters (`tally`)."""
    rejoins_at: int = 0
    """A restarted process's JOIN step (its sponsor's catch-up): a committed step before it that
    leaves this node out is its earlier life's leave, which the catch-up may not have held yet
    (committed at the sponsor, not applied), not this process's exclusion."""
    proven: frozenset[int] = frozenset()
    """Signed votes only: origins this client holds proof against (the voter keeps it: two
    signed copies, a scalar that did not recompute); `tally` leaves their votes out of what
    makes a value possible."""
    due: Callable[[int, int], bool] | None = field(default=None, compare=False, repr=False)
    """(origin, step) -> origin originates at step (zo.stride, protocol.Protocol.due); None:
    every origin every step. An origin not due at a step holds none of its messages there and
    is proposed present (it did not leave): its absence is judged on its next due step."""
    prev: int = GENESIS
    """Digest of the last committed step."""
    through: int = -1
    """Last committed step."""
    pending: dict[int, Value] = field(default_factory=dict)
    """Committed steps not yet applied (step -> value)."""
    mine: dict[int, Vote] = field(default_factory=dict)
    """This client's latest vote per step."""
    digests: dict[int, int] = field(default_factory=dict)
    """step -> committed digest (the chain; 8 bytes a step)."""
    proofs: dict[int, Proof] = field(default_factory=dict, compare=False, repr=False)
    """Signed votes only (`byzantine`): committed steps not yet certified (step -> the ballot
    that committed it and its voters R_s), what certificate.certify picks the votes by."""
    quiet: int = 0
    """Hops a ballot's view must stay unchanged before this client leaves it: long enough for
    the votes of every voter it can reach to arrive (a vote's spread), so that the voters of a
    connected part leave a ballot on the same view and vote the same value in the next one."""
    calm: int = 0
    """No view is quiet before this hop (a brand-new id's edges, which may join parts, are up by
    then: `Voter.pace`). Timing only, like `quiet`."""
    _seen: dict[tuple[int, int], tuple[frozenset[int], int]] = field(default_factory=dict)
    _tallies: dict[
        tuple[int, int], tuple[list[Vote], int, frozenset[int], dict[int, int], tuple[bool, frozenset[int]], Tally]
    ] = field(default_factory=dict, compare=False, repr=False)
    """(step, ballot) -> the last `tally` and every input it was computed from (the votes by
    identity, prev, the roster's members and incarnations, byzantine and proven): a client reviews after
    every hop, and most hops bring no new vote of the undecided step, so its verdict is reused
    (a pure function of those inputs: the same decisions, only fewer recounts)."""

    def __post_init__(self) -> None:
        if self.roster is None:
            self.roster = Roster(self.n_origins)

    # -- the committed chain -----------------------------------------------------------------
    def extend(self, step: int, msgs: Sequence[Message], change: Change | None, pending: bool = False) -> None:
        """Take a step already agreed (a log, a sponsor's catch-up): advance the chain and the
        roster. `pending`: it is still to be applied (its messages wait in the flood)."""
        if step != self.through + 1:
            raise FrameError(f"node {self.node}: agreed steps come in order: expected {self.through + 1}, got {step}")
        joins = change.join if change else ()
        if change:
            self.roster.apply(change)
        value = Value(self.prev, frozenset(m.origin for m in msgs), joins, step_digest(self.prev, step, msgs, joins))
        self.prev, self.through = value.digest, step
        self.digests[step] = value.digest
        if pending:
            self.pending[step] = value

    def rejoin(self, incarnation: int, join_step: int) -> None:
        """A sponsor's catch-up admits this process as `incarnation`, counted from `join_step` (its
        JOIN step: an earlier life's leave committed before it is not this life's exclusion)."""
        self.incarnation = incarnation
        self.rejoins_at = join_step

    def _commit(self, step: int, value: Value, ballot: int = 0) -> Change:
        before = self.roster.members
        if self.byzantine:
            self.proofs[step] = Proof(ballot, before, dict(self.roster.incarnations))
        change = value.change(step, self.roster)
        self.roster.apply(change)
        self.prev, self.through = value.digest, step
        self.digests[step] = value.digest
        self.pending[step] = value
        if self.node in before and self.node not in value.members and step >= self.rejoins_at:
            raise ExcludedError(f"node {self.node}: the others committed step {step} without this client")
        return change

    # -- proposals and votes -----------------------------------------------------------------
    def basis(self, step: int) -> tuple[int, frozenset[int]] | None:
        """(prev, voters) that a vote for `step` builds on: the committed ones if step − 1 is
        committed, else this client's own latest vote for step − 1 (a pipelined guess: if it
        loses, this vote is void and the client votes again once step − 1 is committed)."""
        if step == self.through + 1:
            return self.prev, self.roster.members
        if step > self.through + 1 and (v := self.mine.get(step - 1)) is not None:
            return v.value.digest, v.value.members
        return None

    def propose(
        self,
        step: int,
        held: Mapping[int, int],
        messages_of: _Messages,
        joins: Mapping[int, int],
        excluded: Collection[int] = (),
    ) -> Value | None:
        """What this client holds for `step`: the eligible origins (voters, plus origins with a
        JOIN note for it) whose K messages are all here (none for an origin not due: `expected`), minus `excluded` (an audit verdict,
        evidence of two copies of one message). None if this client is not a voter of it."""
        basis = self.basis(step)
        if basis is None or self.node not in basis[1]:
            return None
        if self.roster.incarnations.get(self.node, self.incarnation) != self.incarnation:
            return None  # a stale process: the roster admitted another incarnation of this node
        prev, voters = basis
        eligible = set(voters) | set(joins)
        present = frozenset(o for o in eligible if held.get(o, 0) == self.expected(o, step) and o not in excluded)
        new = tuple(sorted((o, joins[o]) for o in present - voters))
        evidence = frozenset(excluded) & voters
        return Value(prev, present, new, step_digest(prev, step, messages_of(step, present), new), evidence)

    def expected(self, origin: int, step: int) -> int:
        """The messages `origin` originates at `step`: K, or 0 on a step it skips (zo.stride)."""
        return self.per_origin if self.due is None or self.due(origin, step) else 0

    def vote(self, step: int, ballot: int, value: Value) -> Note:
        v = Vote(step, ballot, self.node, self.incarnation, value)
        self.mine[step] = v
        return v.note(self.n_origins)

    # -- review --------------------------------------------------------------------------------
    def review(self, votes_of: _Votes, propose: _Propose, now: int = 0) -> tuple[list[tuple[int, Change]], list[Note]]:
        """Commit every step the held votes prove, in order, and move this client's vote on the
        first undecided step to the next ballot where its view allows (module docstring).
        `now`: this client's hop count (for `quiet`). Returns the commits (step, change) and the
        votes to flood."""
        commits: list[tuple[int, Change]] = []
        out: list[Note] = []
        while True:
            s = self.through + 1
            ballots: dict[int, list[Vote]] = {}
            for v in votes_of(s):
                ballots.setdefault(v.ballot, []).append(v)
            tallies = {b: self._tally(s, b, vs) for b, vs in sorted(ballots.items())}
            won = next(((b, t.committed) for b, t in tallies.items() if t.committed is not None), None)
            if won is not None:
                commits.append((s, self._commit(s, won[1], won[0])))
                continue
            if foreign := self._foreign(s, tallies, votes_of):
                raise MembershipError(
                    f"node {self.node}: a majority committed step {s} on a history this client does not hold "
                    f"(their previous digest {foreign.prev:016x}, this client's {self.prev:016x}): it stops "
                    "rather than apply another history"
                )
            if self.node in self.roster.members and (note := self._advance(s, tallies, propose, now)) is not None:
                out.append(note)
            return commits, out

    def _foreign(self, s: int, tallies: Mapping[int, Tally], votes_of: _Votes) -> Value | None:
        """A value a quorum of step s's ballot voted on another chain than this client's, which
        it can never apply: the chain handed over to it differs from the one the others commit
        on. Not a value built on one voted for step s − 1: that is a quorum of pipelined guesses
        that lost (void: `basis`), which the roster shrinking at s − 1 (a leave) can make large
        enough for R_s's quorum; their voters vote again on the committed step."""
        foreign = [t.foreign for t in tallies.values() if t.foreign is not None]
        if not foreign:
            return None
        guessed = {v.value.digest for v in votes_of(s - 1)}
        return next((x for x in foreign if x.prev not in guessed), None)

    def _tally(self, s: int, ballot: int, votes: list[Vote]) -> Tally:
        """`tally` of one ballot of step s for the committed roster and chain, reused while none
        of its inputs changed (`_tallies`)."""
        r = self.roster
        held = self._tallies.get((s, ballot))
        if (
            held is not None
            and held[1] == self.prev
            and held[2] == r.members
            and held[3] == r.incarnations
            and held[4] == (self.byzantine, self.proven)
            and len(held[0]) == len(votes)
            and all(a is b for a, b in zip(held[0], votes))
        ):
            return held[5]
        t = tally(votes, r, self.prev, ballot, self.byzantine, self.proven)
        if held is None:
            for key in [k for k in self._tallies if k[0] < s]:
                del self._tallies[key]
        self._tallies[(s, ballot)] = (
            votes,
            self.prev,
            r.members,
            dict(r.incarnations),
            (self.byzantine, self.proven),
            t,
        )
        return t

    def _advance(self, s: int, tallies: Mapping[int, Tally], propose: _Propose, now: int) -> Note | None:
        """This client's next vote for step s, if its view lets it leave its ballot: the first
        ballot after its own whose predecessor is closed with at most one possible value and has
        been quiet (a void pipelined guess counts as its vote: it cannot vote twice in a ballot)."""
        mine = self.mine.get(s)
        if mine is None:
            return None  # ballot 0 is cast at the vote time (`Voter.after`), not here
        for b, t in tallies.items():
            if self._seen.get((s, b), (None, 0))[0] != t.heard:
                self._seen[(s, b)] = (t.heard, now)
        for key in [k for k in self._seen if k[0] < s]:
            del self._seen[key]
        nxt = mine.ballot
        while (t := tallies.get(nxt)) is not None and t.leavable:
            if now - self._seen[(s, nxt)][1] < self.quiet or now < self.calm:
                break
            nxt += 1
        if nxt == mine.ballot:
            return None
        before = tallies[nxt - 1]
        value = before.possible[0] if before.possible else propose(s)
        if value is None or value.prev != self.prev:
            return None
        return self.vote(s, nxt, value)
