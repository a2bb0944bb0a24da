"""Who takes part in each step, as data: the roster and its changes.

Owns (docs/churn-design.md, Membership is data):
- `Change`: the roster change decided for one step — origins that leave (crashed, stalled, cut
  off, or excluded by an audit) and origins that join (with their incarnation) — and its bytes
  (a CRC-checked JSON record) for the log and the evaluator stream.
- `Roster`: the members of every step, a pure function of the changes (what is committed
  and how is agreement.py's business), and the attach node (`Roster.attach`): the client the
  evaluator follows — when it leaves, the next member after it (cyclically) takes over.
- `audit_verdict`: which origins' audited hashes differ from the majority's; `check_admitted`:
  a newcomer that the step its JOIN names left out stops.
- the errors that stop a client for a membership reason (`MembershipError` and its kinds).

Assumes: pure Python (the core); notes were validated by their codec.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from seedflood.core.membership.notes import AUDIT, Note
from seedflood.core.wire.message import FrameError

_U32 = struct.Struct("<I")


class MembershipError(RuntimeError):
    """This client cannot go on with the run (one line, for the operator)."""


class MinorityError(MembershipError):
    """This client's part of the graph holds no majority of the members: it stops so that one
    history continues; restarting it later rejoins it by replay."""


class ExcludedError(MembershipError):
    """The others decided without this client (its messages came too late, or its audited state
    hash differed from the majority's)."""


class JoinMissedError(ExcludedError):
    """A newcomer's JOIN step was committed without it (`check_admitted`): nothing it did wrong,
    so whoever runs it starts it again at once, as the next incarnation, and a member sponsors
    it again (roles/inprocess.py does; a launcher's restart policy does for a process)."""


def check_admitted(node: int, step: int, joined_at: int, roster: Roster) -> None:
    """After applying committed `step`: a newcomer (`joined_at` > 0, the step its JOIN note names)
    that the step left out raises ExcludedError. A JOIN note names one step, so once that step is
    committed without it (the voters did not hold the note when they proposed it: a sponsor that
    stalled or was cut off right after sponsoring) nothing would ever admit it, and it would
    relay on uncounted for the rest of the run; it stops, and its restart joins."""
    if step == joined_at > 0 and node not in roster.members:
        raise JoinMissedError(
            f"node {node}: step {step} was committed without this client's JOIN (its sponsor's note did "
            "not reach the voters in time): it stops (restart it to rejoin by replay)"
        )


# -- changes -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Change:
    """The roster change of `step`: `leave` are last step's members without messages in this one
    (`audit` ⊆ leave: excluded by an audit); `join` are (origin, incarnation) counted from here."""

    step: int
    leave: tuple[int, ...] = ()
    join: tuple[tuple[int, int], ...] = ()
    audit: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not set(self.audit) <= set(self.leave):
            raise ValueError(f"change of step {self.step}: audited origins {self.audit} must also leave")
        if set(self.leave) & {o for o, _ in self.join}:
            raise ValueError(f"change of step {self.step}: an origin both leaves and joins")

    def __bool__(self) -> bool:
        return bool(self.leave or self.join)

    def to_bytes(self) -> bytes:
        body = json.dumps(
            {"leave": list(self.leave), "join": [list(j) for j in self.join], "audit": list(self.audit)},
            separators=(",", ":"),
            sort_keys=True,
        ).encode()
        return _U32.pack(zlib.crc32(body) ^ self.step) + body

    @classmethod
    def from_bytes(cls, step: int, data: bytes) -> Change:
        """The change of `step` from its bytes (the CRC binds the step too); FrameError if bad."""
        if len(data) < 4 or _U32.unpack_from(data)[0] != zlib.crc32(data[4:]) ^ step:
            raise FrameError(f"membership record of step {step} fails its CRC")
        try:
            d = json.loads(data[4:])
            change = cls(
                step,
                tuple(int(o) for o in d["leave"]),
                tuple((int(o), int(i)) for o, i in d["join"]),
                tuple(int(o) for o in d["audit"]),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise FrameError(f"membership record of step {step} is malformed: {e}") from None
        return change

    def describe(self) -> str:
        parts = []
        if self.leave:
            why = {o: "audit" if o in self.audit else "silent" for o in self.leave}
            parts.append("leave " + ", ".join(f"{o} ({why[o]})" for o in self.leave))
        if self.join:
            parts.append("join " + ", ".join(f"{o} (incarnation {i})" for o, i in self.join))
        return f"step {self.step}: " + "; ".join(parts)


def next_attach(current: int, members: Collection[int], n_origins: int) -> int:
    """The attach node after `current` leaves: the first member after it, cyclically."""
    for k in range(1, n_origins + 1):
        if (node := (current + k) % n_origins) in members:
            return node
    raise ValueError("no members left to attach the evaluator to")


# -- the roster --------------------------------------------------------------------------------------
@dataclass
class Roster:
    """Members of the next step to decide, every change so far (step -> Change), and the attach
    node: the client that streams decided steps to the evaluator (it moves only when it leaves)."""

    n_origins: int
    members: frozenset[int] = field(default=frozenset())
    changes: dict[int, Change] = field(default_factory=dict)
    incarnations: dict[int, int] = field(default_factory=dict)
    attach: int = 0

    def __post_init__(self) -> None:
        if not self.members:
            self.members = frozenset(range(self.n_origins))

    def apply(self, change: Change) -> None:
        """Advance over a decided change (from `decide`, a log or the evaluator stream)."""
        if not set(change.leave) <= self.members:
            raise FrameError(f"{change.describe()}: origins {sorted(set(change.leave) - self.members)} are not members")
        if joined := {o for o, _ in change.join} & self.members:
            raise FrameError(f"{change.describe()}: origins {sorted(joined)} are already members")
        if any(not 0 <= o < self.n_origins for o, _ in change.join):
            raise FrameError(f"{change.describe()}: origin out of range")
        self.members = (self.members - set(change.leave)) | {o for o, _ in change.join}
        self.incarnations.update(dict(change.join))
        if self.attach not in self.members and self.members:
            self.attach = next_attach(self.attach, self.members, self.n_origins)
        if change:
            self.changes[change.step] = change


def audit_verdict(node: int, step: int, notes: Iterable[Note], members: Collection[int]) -> list[int]:
    """Origins among `members` whose audited hash of `step` differs from the strict majority of
    the audits held (absent audits are not votes: a crashed client is the message rule's
    business). Raises ExcludedError if this node is one of them, MembershipError if no hash has a
    strict majority (no side can be trusted)."""
    votes = {n.origin: n.value for n in notes if n.kind == AUDIT and n.step == step and n.origin in members}
    if not votes:
        return []
    (value, count), *_ = Counter(votes.values()).most_common(1)
    if 2 * count <= len(votes):
        raise MembershipError(
            f"node {node}: the audit of step {step} has no majority state ("
            + ", ".join(f"{o}: {v:016x}" for o, v in sorted(votes.items()))
            + ")"
        )
    odd = sorted(o for o, v in votes.items() if v != value)
    if node in odd:
        raise ExcludedError(
            f"node {node}: the audit of step {step} found this client's state {votes[node]:016x} "
            f"differs from the majority's {value:016x}"
        )
    return odd
