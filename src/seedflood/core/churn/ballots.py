"""What the votes of one ballot prove: the quorums and the verdict (`tally`) of one client's view.

Owns (docs/churn-design.md, "One history" and "Lying voters"; the argument that these rules
commit at most one value per step is agreement.py's module docstring):
- `quorum`, `faults`, `byzantine_quorum`: how many votes of a roster of n commit a value, under
  crashes and under signed votes with up to f = ⌊(n − 1)/3⌋ lying voters.
- `counted`, `double_voters`: which of the held votes count (the first of each member of R_s
  under its admitted incarnation) and which voters cast two different ones.
- `Tally` and `tally`: the verdict — a committed value, a value a quorum voted on another chain,
  the values that could still reach a quorum, whether the ballot is closed, and whether a voter
  may leave it (`Tally.leavable`).

Assumes: pure functions of their arguments (an `Agreement` caches a verdict while its inputs are
unchanged); the votes handed to `tally` are all of one step and one ballot, and the roster is
that step's voters R_s (the members after the committed step before).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from seedflood.core.churn.values import Value, Vote
from seedflood.core.membership.roster import Roster


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
