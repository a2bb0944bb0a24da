"""The merged live view of a run: every process's status record as one table (`seedflood status`).

Owns `merge` (the records of status.py, read at one moment, into a `View`: one `Row` per
process, which rows are stale, and whether the processes agree) and `View.to_dict` (the JSON
`seedflood status --json` prints). Rendering is the CLI's.

Agreement: every record carries the chain digests of its newest committed steps (status.py). At
the step a record holds that the most compared records hold (the newest such), the digest held
by more of them than any other is the step's; a record holding another digest there, or any
holder where two digests tie, disagrees (`Row.agrees` False, listed in `View.odd`). A hash
chain differs at every step after the first that differs, so one shared step settles it.
Compared: the records that are not stale and did not fail or stop (those may lag or hold a
history the others left), the evaluator's included; `View.step` is the newest step all of them
that committed any hold, and `View.digest` its digest.

Membership: the roster's committed changes come from the log (logchanges.py, read without
disturbing the evaluator appending to it, and as true of a finished run as of a running one);
`View.missing` are the members of the log's last step that have no record (not started yet, or
on a host that cannot write the run directory).

May import: rundir's status and logchanges. Nothing else.

Assumes: records of one run (one status directory); clocks of the hosts agree to a second or so
(a record's age is now − its `updated`, both wall-clock times).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from seedflood.rundir.logchanges import Membership
from seedflood.rundir.status import FAILED, RUNNING, STOPPED, Status

STALE_S = 10.0
"""A running process whose record is older than this (s) is shown stale: records are
rewritten about once a second, so ten missed rewrites mean it is hung, dead or cut off."""


@dataclass(frozen=True)
class Row:
    """One process as the view shows it."""

    name: str  # "node-N" or "evaluator"
    status: Status
    age_s: float  # seconds since the record was written
    stale: bool  # running, and the record is older than the view's stale bound
    agrees: bool | None  # its digests match the others' where they overlap; None: nothing to compare

    @property
    def shown_state(self) -> str:
        """The state column: stale when the process stopped writing while it said it ran."""
        return "stale" if self.stale else self.status.state

    @property
    def links(self) -> list[Link]:
        """Its links: every topology neighbour, edge up now or with bytes counted (not the
        evaluator's stream), by peer id."""
        s = self.status
        peers = sorted((set(s.neighbours) | set(s.peers) | set(s.edges)) - {-1})
        return [Link(p, p in s.peers, *s.edges.get(p, (0, 0))) for p in peers]

    def to_dict(self) -> dict[str, object]:
        s = self.status
        return {
            **{k: v for k, v in asdict(s).items() if k not in ("digests", "edges")},
            "name": self.name,
            "state": self.shown_state,  # the record's own, or "stale"
            "age_s": round(self.age_s, 1),
            "agrees": self.agrees,
            "digest": s.digest,
            "links": [asdict(link) for link in self.links],
            "sent_to_evaluator": s.edges.get(-1, (0, 0))[0],
        }


@dataclass(frozen=True)
class Link:
    """One link of a client: the peer, whether the edge is up now, and the bytes over it so far."""

    peer: int
    up: bool
    sent: int  # bytes handed to the transport for this peer
    received: int  # bytes of hop frames received from it


@dataclass(frozen=True)
class View:
    """The run at one moment: rows (clients by node, then the evaluator), files that could not
    be read (one line each), and the agreement of the compared records."""

    rows: list[Row]
    problems: list[str]
    agree: bool | None  # None: fewer than two records to compare
    step: int | None  # the newest step every compared record with digests holds
    digest: str | None  # its digest (the majority's, where they disagree; None: a tie)
    odd: list[str]  # names of the records that disagree with the majority
    membership: Membership | None = None  # the log's roster history; None: no log (yet)
    missing: list[int] = field(default_factory=list)  # members of the log's last step without a record

    @property
    def readable(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, object]:
        return {
            "rows": [r.to_dict() for r in self.rows],
            "problems": self.problems,
            "agree": self.agree,
            "step": self.step,
            "digest": self.digest,
            "odd": self.odd,
            "membership": None if self.membership is None else self.membership.to_dict(),
            "missing": self.missing,
        }


def merge(
    statuses: Sequence[Status],
    problems: Sequence[str],
    now: float,
    stale_s: float = STALE_S,
    membership: Membership | None = None,
) -> View:
    """The view of `statuses` (read at `now`, time.time()); `problems`: lines for unreadable
    files; `membership`: the log's roster history, if there is a log."""
    ages = {s.name: max(0.0, now - s.updated) for s in statuses}
    stale = {s.name for s in statuses if s.state == RUNNING and ages[s.name] > stale_s}
    compared = [s for s in statuses if s.name not in stale and s.state not in (FAILED, STOPPED)]
    by_step: dict[int, dict[str, str]] = {}
    for s in compared:
        for step, digest in s.digests.items():
            by_step.setdefault(step, {})[s.name] = digest
    # each record is judged at the step it holds that the most compared records hold (the newest
    # of those), against the digest most of them hold there: a tie has no majority, so both sides are odd
    judged: dict[str, bool | None] = {}
    for s in compared:
        best = max(s.digests, key=lambda step: (len(by_step[step]), step), default=None)
        if best is None or len(by_step[best]) < 2:
            judged[s.name] = None
            continue
        judged[s.name] = s.digests[best] == _majority(by_step[best].values())
    odd = sorted(n for n, ok in judged.items() if ok is False)
    holding = [set(s.digests) for s in compared if s.digests]  # one that committed nothing yet holds no step
    common = set.intersection(*holding) if holding else set()
    step = max(common) if common and len(holding) > 1 else None
    digest = None if step is None else _majority(by_step[step].values())
    rows = [
        Row(
            s.name,
            s,
            ages[s.name],
            s.name in stale,
            judged.get(s.name),
        )
        for s in statuses
    ]
    agree = None if all(ok is None for ok in judged.values()) else not odd
    recorded = {s.node for s in statuses}
    missing = [] if membership is None else [n for n in membership.members if n not in recorded]
    return View(rows, list(problems), agree, step, digest, odd, membership, missing)


def _majority(digests: Iterable[str]) -> str | None:
    """The digest held by more records than any other; None on a tie."""
    (first, n), *rest = Counter(digests).most_common(2)
    return None if rest and rest[0][1] == n else first
