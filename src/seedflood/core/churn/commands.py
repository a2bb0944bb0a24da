"""What a churn member asks its driver to do: the commands `member.Member` yields.

Owns the command values. The member is a pure state machine: each of its entry points is a
generator that yields commands and is sent each command's result (the driver's `run`), so the
member decides and the driver does the I/O (a transport, the clock, the model) in exactly the
order the member asks. A trace of (command, result) pairs replayed into a fresh member yields the
same commands (tests/unit/core/churn/test_member.py).

Results: `Exchange` -> `Exchanged`; `Neighbours` -> (the transport's neighbours, whether any
edge is up); `Estimate` -> this client's messages of the step; `Now` -> the time (s, monotonic);
`Claim` -> the incarnation claimed or None; `Connect` -> the peers connected; `Grow` -> the
neighbours after it; `AskHeal` -> peer -> the agreed exchange index; `Revived`, `Newcomers` ->
node ids; `StateHash` -> the state's hash; every other command -> None.

Assumes: pure Python (the core).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from seedflood.core.wire.message import Message

INFO = 20  # logging levels of `Say` (the stdlib's values)
WARNING = 30


@dataclass(frozen=True)
class Exchange:
    """Send the flood's outbox to every neighbour (`hop.outbox_frames`) and receive theirs, as
    local step `t`: one exchange of the hop clock."""

    t: int


@dataclass(frozen=True)
class Exchanged:
    """What an exchange brought: each neighbour's frame (peer -> bytes, undecoded) and the peers
    the transport lost in it (peer -> why)."""

    frames: Mapping[int, bytes]
    lost: Mapping[int, str]


@dataclass(frozen=True)
class Received:
    """The new items a frame of local step `t` brought (what an auditor recomputes)."""

    items: Sequence[object]
    t: int


@dataclass(frozen=True)
class Neighbours:
    """The transport's neighbours (connected or not) and whether any edge is up."""


@dataclass(frozen=True)
class Estimate:
    """This client's messages of local step `t` (its forwards)."""

    t: int


@dataclass(frozen=True)
class Follow:
    """Between steps: where this client is the attach node and feeds the evaluator, answer it."""


@dataclass(frozen=True)
class Clock:
    """Set the hop clock (the index of the next exchange) to `hop`."""

    hop: int


@dataclass(frozen=True)
class Now:
    """The time (s, monotonic): the input a wait past patience is bounded by."""


@dataclass(frozen=True)
class Idle:
    """Pace a hop waited past patience (a short sleep)."""


@dataclass(frozen=True)
class Claim:
    """Claim the restarted or brand-new process `peer` to sponsor it (result: its incarnation,
    None when another member sponsors it)."""

    peer: int


@dataclass(frozen=True)
class Sponsor:
    """Meet claimed `peer` (incarnation `inc`) before step `t` and run the sponsor's handshake;
    the driver calls back `Member.sponsor` for the JOIN note and the catch-up."""

    t: int
    peer: int
    inc: int


@dataclass(frozen=True)
class Grow:
    """Add this end of the edges to `peers` (a growing transport)."""

    peers: tuple[int, ...]


@dataclass(frozen=True)
class Connect:
    """Meet `peers` now (result: those connected); `meet`: within the meeting timeout, else
    within the hop timeout."""

    peers: tuple[int, ...]
    meet: bool = True


@dataclass(frozen=True)
class Part:
    """Close the edge to `peer` by agreement (a graceful leave)."""

    peer: int


@dataclass(frozen=True)
class Drop:
    """Close the edge to `peer` now, saying `why` to the transport."""

    peer: int
    why: str


@dataclass(frozen=True)
class AskHeal:
    """Ask the transport to heal the down edges in `want` (peer -> the incarnation its other end
    must run as) at clock `hop` (result: peer -> the agreed exchange index)."""

    want: Mapping[int, int | None]
    hop: int


@dataclass(frozen=True)
class Restore:
    """Bring the agreed healed edge to `peer` up (its fresh pair)."""

    peer: int


@dataclass(frozen=True)
class Apply:
    """Apply committed step `step` (its `msgs`) to the model; `fresh`: beyond the resumed log (tell
    the listeners, push it to the evaluator where this client is the attach node)."""

    step: int
    msgs: list[Message]
    fresh: bool


@dataclass(frozen=True)
class ApplyAll:
    """Apply the replayed decided `steps` of a catch-up to the model, in order."""

    steps: list[tuple[int, list[Message]]]


@dataclass(frozen=True)
class Revived:
    """The restarted neighbours that asked to rejoin (result: their ids)."""


@dataclass(frozen=True)
class Newcomers:
    """The brand-new ids knocking (result: their ids)."""


@dataclass(frozen=True)
class StateHash:
    """The model's state hash (result: str), for an AUDIT note."""


@dataclass(frozen=True)
class Say:
    """Log `msg % args` at `level` on the churn client's logger."""

    level: int
    msg: str
    args: tuple[object, ...] = ()


Command = (
    Exchange
    | Received
    | Neighbours
    | Estimate
    | Follow
    | Clock
    | Now
    | Idle
    | Claim
    | Sponsor
    | Grow
    | Connect
    | Part
    | Drop
    | AskHeal
    | Restore
    | Apply
    | ApplyAll
    | Revived
    | Newcomers
    | StateHash
    | Say
)
