"""The notes that flood with the messages: their kinds, their record and their bodies.

Owns (docs/churn-design.md, Notes on the wire) `Note`, a record flooded with the messages: `JOIN`
(a sponsor admits a restarted origin from a step on, and names the hop at which its edges
connect: `join_note`, `link_hop`), `AUDIT` (an origin's state hash after a step), `VOTE` (an
origin's vote on a step's content, agreement.Vote in its body), `COPY` (another copy of a
message under an id already held: evidence that its origin equivocated, `copy_note`, `copied`),
`RECOMPUTE` (an auditor's recomputation of another origin's scalar that differs from what that
origin sent: evidence that it lied, `recompute_note`, `recomputed`; docs/trust.md, Verification by
recomputation) and `LEAVE` (a client that leaves gracefully, once a committed step left it out,
names the hop index before which it and its neighbours close their edges: `leave_note`;
docs/churn-design.md, Graceful leave); and `check_note`, the check a decoded note passes. (The
hop payload that carries notes is flood/hop.py's.)

Assumes: pure Python (the core); messages were validated by their codec.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from seedflood.core.wire.message import FrameError, Limits, Message

JOIN = 1
AUDIT = 2
VOTE = 4
COPY = 8
RECOMPUTE = 16
LEAVE = 32
_KINDS = {JOIN: "join", AUDIT: "audit", VOTE: "vote", COPY: "copy", RECOMPUTE: "recompute", LEAVE: "leave"}


# -- notes -------------------------------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class Note:
    """A flooded record. JOIN: `origin` counts again from `step` on, `value` = its incarnation,
    `body` = the u64 hop index at which it and its neighbours connect their edges (`link_hop`).
    AUDIT: `origin`'s state hash after applying `step`, `value` = its first 8 bytes (u64).
    VOTE: `origin`'s vote on the content of `step` in ballot `value`; `body` is the vote
    (agreement.Vote: incarnation, digests, members, joins).
    COPY: a copy of `origin`'s message (`step`, k = `value`) that differs from another copy
    under the same id; `body` is its seed (u64) and f32 scalar.
    RECOMPUTE: auditor `origin` recomputed the scalar of origin `value`'s message (`step`, k)
    and got another one than that origin sent; `body` is k (u32) and the recomputed f32.
    LEAVE: `origin` left gracefully, committed step `step` left it out; it and its neighbours
    close their edges right before exchange `value` (a hop index); no body."""

    step: int
    kind: int
    origin: int
    value: int
    body: bytes = b""
    signer: int = field(default=-1, compare=False)
    """Who signed it when the run signs (flood.signing: the origin, or for JOIN and COPY any
    member), else -1; with `sig`, not part of its identity, order or equality."""
    sig: bytes = field(default=b"", compare=False, repr=False)

    @property
    def id(self) -> tuple[str, int, int] | tuple[str, int, int, int] | tuple[str, int, int, int, bytes]:
        """De-duplication key; never equal to a message id (those are int triples). A vote's
        key holds its ballot: one vote per origin, step and ballot; a copy's holds the copy, so
        both copies of one message id flood (and a RECOMPUTE's holds its body: notes against two
        scalars both flood). A signed vote's key holds its body too: two votes its origin signed in
        one ballot both flood, the proof of a double vote."""
        if self.kind in (COPY, RECOMPUTE) or (self.kind == VOTE and self.sig):
            return (_KINDS[self.kind], self.origin, self.step, self.value, self.body)
        if self.kind == VOTE:
            return (_KINDS[self.kind], self.origin, self.step, self.value)
        return (_KINDS[self.kind], self.origin, self.step)


_LINK = struct.Struct("<Q")  # a JOIN note's body: the hop index its edges connect at


def join_note(step: int, origin: int, incarnation: int, link_hop: int) -> Note:
    """JOIN: `origin` (this incarnation) counts from `step`; it and its neighbours connect their
    edges right before exchange `link_hop` (a hop index, the same at both ends of every edge)."""
    return Note(step, JOIN, origin, incarnation, _LINK.pack(link_hop))


def link_hop(note: Note) -> int:
    """The hop index a JOIN note's edges connect at."""
    return _LINK.unpack(note.body)[0]


def leave_note(step: int, origin: int, unlink_hop: int) -> Note:
    """LEAVE: `origin` leaves gracefully; committed `step` left it out, and it and its neighbours
    close their edges right before exchange `unlink_hop` (the one after the exchange that first
    carries this note, so every neighbour holds it in time: it travels straight from `origin`,
    one hop, never relayed: flooding.py)."""
    return Note(step, LEAVE, origin, unlink_hop)


_COPY = struct.Struct("<Qf")  # a COPY note's body: the copy's seed and scalar, then its signature if signed
SIG_SIZE = 64  # an Ed25519 signature


def copy_note(m: Message) -> Note:
    """COPY: `m` floods as a note beside the copy a frame carried (a frame holds one copy per
    id), so every client comes to hold both copies: the evidence against `m.origin`. In a
    signed run the copy keeps its origin's signature: two signed copies are a proof anyone can
    check, and a relay cannot make one up."""
    return Note(m.step, COPY, m.origin, m.k, _COPY.pack(m.seed, m.scalar) + m.sig)


def copied(note: Note) -> Message:
    """The message a COPY note carries (with its origin's signature, if any)."""
    seed, scalar = _COPY.unpack_from(note.body)
    return Message(
        step=note.step, origin=note.origin, k=note.value, seed=seed, scalar=scalar, sig=note.body[_COPY.size :]
    )


_RECOMPUTE = struct.Struct("<If")  # a RECOMPUTE note's body: k, the recomputed f32 scalar


def recompute_note(auditor: int, accused: int, step: int, k: int, scalar: float) -> Note:
    """RECOMPUTE: `auditor` recomputed `accused`'s scalar of (step, k) as `scalar` (f32), which
    is not what `accused` sent. Signed by the auditor (its origin) in a signed run."""
    return Note(step, RECOMPUTE, auditor, accused, _RECOMPUTE.pack(k, scalar))


def recomputed(note: Note) -> tuple[int, int, float]:
    """(accused origin, k, recomputed f32 scalar) of a RECOMPUTE note."""
    k, scalar = _RECOMPUTE.unpack(note.body)
    return note.value, k, scalar


def audit_value(state_hash: str) -> int:
    """The u64 an AUDIT note carries: the first 16 hex digits of the state's sha256."""
    return int(state_hash[:16], 16)


def check_note(n: Note, limits: Limits) -> bool:
    """False for a note older than the window (stale: dropped, never an error — a neighbour that
    connects late is owed every note its peer still holds, however old); FrameError for a note
    no correct peer sends."""
    if n.kind not in _KINDS:
        raise FrameError(f"unknown note kind {n.kind}")
    if not 0 <= n.origin < limits.n_origins:
        raise FrameError(f"note origin {n.origin} out of range 0..{limits.n_origins - 1}")
    if n.step > limits.max_step:
        raise FrameError(f"note step {n.step} beyond window {limits.min_step}..{limits.max_step}")
    if (n.kind == VOTE and not n.body) or (n.kind == AUDIT and n.body):
        raise FrameError(f"note {n.id}: a vote has a body, an audit none")
    if n.kind == LEAVE and n.body:
        raise FrameError(f"note {n.id}: a leave has no body, got {len(n.body)} bytes")
    if n.kind == JOIN and len(n.body) != _LINK.size:
        raise FrameError(f"note {n.id}: a join's body is its {_LINK.size}-byte link hop, got {len(n.body)} bytes")
    if n.kind == RECOMPUTE:
        if len(n.body) != _RECOMPUTE.size:
            raise FrameError(f"note {n.id}: a recompute's body is its {_RECOMPUTE.size}-byte k and scalar")
        accused, k, _ = recomputed(n)
        if not 0 <= accused < limits.n_origins or accused == n.origin or not 0 <= k < limits.max_k:
            raise FrameError(f"note {n.id}: a recompute names origin {accused}, k {k}")
    if n.kind == COPY:
        if len(n.body) not in (_COPY.size, _COPY.size + SIG_SIZE):
            raise FrameError(
                f"note {n.id}: a copy's body is its {_COPY.size}-byte seed and scalar (and a "
                f"{SIG_SIZE}-byte signature), got {len(n.body)}"
            )
        if n.step >= limits.min_step:
            limits.check(copied(n))  # the same checks as a message in a frame (its seed too)
    return n.step >= limits.min_step
