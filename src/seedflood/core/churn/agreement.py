"""One agreed history under churn: every step's content is committed by a strict majority.

Owns (docs/churn-design.md, "One history"): the commit rule as a whole — its statement and the
argument that it commits at most one value per step (below) — and one client's side of it:
- `Agreement`: its proposals, its votes, the committed chain (`prev`, `through`, `digests`) and
  roster, the steps committed but not yet applied, and the rule that moves a vote to the next
  ballot (`review`).
- `Proof`: how a step was committed here (its ballot and voters), what a certificate picks by.
An `Agreement` driven by the client's flood and schedule is voter.py's `Voter`. The parts it
rests on are their own modules: values.py (`Value`, `Vote`, `step_digest`: what a step holds,
the chain's hash, a vote's bytes) and ballots.py (`quorum`, `tally`: what the votes of one
ballot prove). Their names are re-exported here, where the rest of the package imports them.

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
ballot, on the forced or fresh value, once they leave a ballot on one view: voters that enter a
ballot at different hops can leave it apart and split the next, so each later ballot waits a hop
longer (`Agreement.wait`) until they do. It can wait forever only if two values each keep enough
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

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from seedflood.core.churn.ballots import (
    Tally,
    byzantine_quorum,
    counted,
    double_voters,
    faults,
    quorum,
    tally,
)
from seedflood.core.churn.values import GENESIS, Value, Vote, step_digest
from seedflood.core.membership.notes import Note
from seedflood.core.membership.roster import Change, ExcludedError, MembershipError, Roster
from seedflood.core.wire.message import FrameError, Message

__all__ = [
    "GENESIS",
    "Agreement",
    "Change",
    "Proof",
    "Tally",
    "Value",
    "Vote",
    "byzantine_quorum",
    "counted",
    "double_voters",
    "faults",
    "quorum",
    "step_digest",
    "tally",
]

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

    def wait(self, ballot: int) -> int:
        """Hops a view of `ballot` must stay unchanged before this client leaves it: `quiet`, one
        hop more for each ballot after 1. Timing only. Voters that enter a ballot at different
        hops (a healed cut, a part wider than the spread `quiet` was planned for) can leave it
        apart, one side forced to its own value before the other's votes arrive while the other
        sees them all and votes afresh, and split every later ballot the same way; a wait that
        grows passes that gap plus a vote's spread, and then the voters of a connected part leave
        on the same view (docs/churn-design.md, Liveness)."""
        return self.quiet + max(ballot - 1, 0)

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
        while (ahead := tallies.get(nxt)) is not None and ahead.leavable:
            if now - self._seen[(s, nxt)][1] < self.wait(nxt) or now < self.calm:
                break
            nxt += 1
        if nxt == mine.ballot:
            return None
        before = tallies[nxt - 1]
        value = before.possible[0] if before.possible else propose(s)
        if value is None or value.prev != self.prev:
            return None
        return self.vote(s, nxt, value)
