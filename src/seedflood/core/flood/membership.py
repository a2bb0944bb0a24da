"""Who takes part in each step, as data: the roster, its changes, and the notes that flood.

Owns (docs/churn-design.md, Membership is data; Notes on the wire):
- `Change`: the roster change decided for one step — origins that leave (crashed, stalled, cut
  off, or excluded by an audit) and origins that join (with their incarnation) — and its bytes
  (a CRC-checked JSON record) for the log and the evaluator stream.
- `Roster`: the members of every step, a pure function of the changes (what is committed
  and how is agreement.py's business).
- `Note`: a record flooded with the messages: `JOIN` (a sponsor admits a restarted origin from a
  step on, and names the hop at which its edges connect: `join_note`, `link_hop`), `AUDIT` (an
  origin's state hash after a step), `VOTE` (an origin's vote on a step's content,
  agreement.Vote in its body), `COPY` (another copy of a message under an id already held:
  evidence that its origin equivocated, `copy_note`, `copied`) and `RECOMPUTE` (an auditor's
  recomputation of another origin's scalar that differs from what that origin sent: evidence
  that it lied, `recompute_note`, `recomputed`; docs/trust.md, Verification by recomputation)
  and `LEAVE` (a client that leaves gracefully, once a committed step left it out, names the
  hop index before which it and its neighbours close their edges: `leave_note`;
  docs/churn-design.md, Graceful leave).
- `audit_verdict`: which origins' audited hashes differ from the majority's.
- the hop payload (`encode_hop` / `decode_hop`): a message frame, plus notes when there are any.
  Without notes it is exactly the plain message frame, so a strict run's traffic is unchanged byte
  for byte. (A decided step's bytes beyond the hop — the evaluator stream, the catch-up — are
  stepstream.py's.)
- the attach node (`Roster.attach`): the client the evaluator follows, a pure function of the
  changes — when it leaves, the next member after it (cyclically) takes over.

Assumes: pure Python (the core); notes and messages were validated by their codecs.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace

from seedflood.core.flood import message
from seedflood.core.flood.message import FrameError, Limits, Message

JOIN = 1
AUDIT = 2
VOTE = 4
COPY = 8
RECOMPUTE = 16
LEAVE = 32
_KINDS = {JOIN: "join", AUDIT: "audit", VOTE: "vote", COPY: "copy", RECOMPUTE: "recompute", LEAVE: "leave"}


class MembershipError(RuntimeError):
    """This client cannot go on with the run (one line, for the operator)."""


class MinorityError(MembershipError):
    """This client's part of the graph holds no majority of the members: it stops so that one
    history continues; restarting it later rejoins it by replay."""


class ExcludedError(MembershipError):
    """The others decided without this client (its messages came too late, or its audited state
    hash differed from the majority's)."""


def check_admitted(node: int, step: int, joined_at: int, roster: Roster) -> None:
    """After applying committed `step`: a newcomer (`joined_at` > 0, the step its JOIN note names)
    that the step left out raises ExcludedError. A JOIN note names one step, so once that step is
    committed without it (the voters did not hold the note when they proposed it: a sponsor that
    stalled or was cut off right after sponsoring) nothing would ever admit it, and it would
    relay on uncounted for the rest of the run; it stops, and its restart joins."""
    if step == joined_at > 0 and node not in roster.members:
        raise ExcludedError(
            f"node {node}: step {step} was committed without this client's JOIN (its sponsor's note did "
            "not reach the voters in time): it stops (restart it to rejoin by replay)"
        )


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


_NOTE = struct.Struct("<BIIQH")  # kind, origin, step, value, body length: 19 bytes, then the body
_HOP_MAGIC = b"SN\x02"  # a hop payload with notes: magic, u32 message-frame length, frame, notes
_SIGNED_MAGIC = b"SN\x03"  # the same, then every item's signature (a run with trust.sign)
_NO_SIG = bytes(SIG_SIZE)  # in a signed payload: an item that carries no signature
_NO_SIGNER = 0xFFFFFFFF
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")


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


def encode_hop(msgs: Sequence[Message], notes: Sequence[Note] = (), signed: bool = False) -> bytes:
    """One hop's payload to one neighbour: the message frame alone when there are no notes and
    the run does not sign. `signed`: the signed layout (_SIGNED_MAGIC), every item's signature
    after the notes — 64 bytes per message (its origin signed it), a u32 signer and 64 bytes
    per note. An item without one (a message a resume restored from the log, handed on in a
    catch-up) travels with zero bytes in their place and decodes without a signature again: a
    flood drops it, a rejoin's restore takes it from the sponsor it trusts for its history."""
    if signed and not (msgs or notes):
        return b""  # nothing to sign
    frame = message.encode(msgs)
    if not notes and not signed:
        return frame
    ordered = sorted(notes)
    body = _U32.pack(len(frame)) + frame + _U16.pack(len(notes))
    body += b"".join(_NOTE.pack(n.kind, n.origin, n.step, n.value, len(n.body)) + n.body for n in ordered)
    if signed:
        body += b"".join(m.sig or _NO_SIG for m in msgs)
        body += b"".join(_U32.pack(n.signer if n.sig else _NO_SIGNER) + (n.sig or _NO_SIG) for n in ordered)
    return (_SIGNED_MAGIC if signed else _HOP_MAGIC) + body + _U32.pack(zlib.crc32(body))


def decode_hop(payload: bytes, limits: Limits) -> tuple[list[Message], list[Note]]:
    """(messages, notes) of a hop payload; FrameError on any defect (nothing is taken). A signed
    payload's items carry their signatures (checked by flood.signing, not here); an unsigned
    one's carry none."""
    signed = payload.startswith(_SIGNED_MAGIC)
    if not signed and not payload.startswith(_HOP_MAGIC):
        return message.decode(payload, limits), []
    body, crc = payload[len(_HOP_MAGIC) : -4], payload[-4:]
    if len(payload) < len(_HOP_MAGIC) + 4 + 2 + 4 or _U32.unpack(crc)[0] != zlib.crc32(body):
        raise FrameError("hop payload with notes fails its CRC or is truncated")
    (n,) = _U32.unpack_from(body)
    frame, rest = body[4 : 4 + n], body[4 + n :]
    if len(frame) != n or len(rest) < 2:
        raise FrameError("hop payload: message frame length disagrees with the payload")
    (count,) = _U16.unpack_from(rest)
    notes, at = [], 2
    for _ in range(count):
        if at + _NOTE.size > len(rest):
            raise FrameError(f"hop payload: note {len(notes)} of {count} is truncated")
        kind, origin, step, value, n = _NOTE.unpack_from(rest, at)
        at += _NOTE.size
        if at + n > len(rest):
            raise FrameError(f"hop payload: note {len(notes)} of {count} claims {n} body bytes past the end")
        notes.append(Note(step, kind, origin, value, bytes(rest[at : at + n])))
        at += n
    msgs = message.decode(frame, limits)
    if signed:
        want = at + SIG_SIZE * len(msgs) + (4 + SIG_SIZE) * len(notes)
        if want != len(rest):
            raise FrameError(f"signed hop payload: {len(rest) - at} bytes of signatures, {want - at} expected")
        sigs = [bytes(rest[at + i * SIG_SIZE : at + (i + 1) * SIG_SIZE]) for i in range(len(msgs))]
        msgs = [replace(m, sig=s) if s != _NO_SIG else m for m, s in zip(msgs, sigs)]
        at += SIG_SIZE * len(msgs)
        signed_notes = []
        for n in notes:
            signer, sig = _U32.unpack_from(rest, at)[0], bytes(rest[at + 4 : at + 4 + SIG_SIZE])
            at += 4 + SIG_SIZE
            unsigned = signer == _NO_SIGNER and sig == _NO_SIG
            signed_notes.append(n if unsigned else replace(n, signer=signer, sig=sig))
        notes = signed_notes
    if at != len(rest):
        raise FrameError(f"hop payload: {len(rest) - at} bytes after {count} notes")
    return msgs, [n for n in notes if check_note(n, limits)]


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
