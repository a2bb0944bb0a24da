"""Decided steps as bytes beyond the hop: the step payload, the evaluator stream, the catch-up.

Owns (docs/churn-design.md: Membership is data, The evaluator follows the attach node, Rejoin across processes):
- the step payload (`encode_step` / `decode_step`): a decided step's messages plus its roster
  change when it has one; without a change it is exactly the plain message frame, so a strict
  run's log and evaluator stream are unchanged byte for byte. In a signed run (`trust.sign`) it
  carries the step's seals too (`encode_step(..., certificate)`, `decode_signed_step`): each
  message's signature and, under churn, the certificate of its commit (core/churn/certificate.py;
  docs/trust.md, What the evaluator and the log verify).
- the seals (`encode_seals` / `decode_seals`): those signatures as bytes apart from the messages,
  the same bytes in the signed step payload and in the log's seal record (rundir/logrecords.py).
- the churn evaluator stream: every push is a step payload prefixed by its step (`encode_push` /
  `decode_push`), and every evaluator edge opens with the sender's decided steps as one blob of
  such pushes (`encode_pushes` / `decode_pushes`); `StepSequence` turns the overlapping streams of
  successive attach nodes into each step once, in order, and refuses two contents for one step.
- `CatchUp`: what a sponsor hands a rejoining neighbour.

Assumes: pure Python (the core); the hop payload inside a catch-up (`held`) is flood/hop.py's.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from seedflood.core.membership.notes import SIG_SIZE
from seedflood.core.membership.roster import Change
from seedflood.core.wire import message
from seedflood.core.wire.message import FrameError, Limits, Message, SeedOf

_STEP_MAGIC = b"SC\x01"  # an evaluator payload with a change: magic, u32 change length, change, frame
_SIGNED_MAGIC = b"SS\x01"  # signed: magic, u32 change length, change, u32 seals length, seals, frame
_U32 = struct.Struct("<I")
_NO_SIG = bytes(SIG_SIZE)  # in the seals: a message that carries no signature


def encode_seals(msgs: Sequence[Message], certificate: bytes = b"") -> bytes:
    """A step's seals: u32 count, then the signature of each of `msgs` in canonical order (64
    bytes each; zeros for one without), then `certificate` (the rest: b"" in a strict run)."""
    ordered = sorted(msgs)
    return _U32.pack(len(ordered)) + b"".join(m.sig or _NO_SIG for m in ordered) + certificate


def decode_seals(data: bytes, msgs: Sequence[Message]) -> tuple[list[Message], bytes]:
    """(`msgs` in canonical order, each with its signature from `data`; the certificate bytes);
    FrameError when `data` does not hold one signature per message."""
    ordered = sorted(msgs)
    if len(data) < 4 or _U32.unpack_from(data)[0] != len(ordered) or len(data) < 4 + SIG_SIZE * len(ordered):
        raise FrameError(f"seals of {len(data)} bytes do not hold one signature for each of {len(ordered)} messages")
    out = []
    for i, m in enumerate(ordered):
        sig = data[4 + i * SIG_SIZE : 4 + (i + 1) * SIG_SIZE]
        out.append(replace(m, sig=bytes(sig)) if sig != _NO_SIG else replace(m, sig=b""))
    return out, bytes(data[4 + SIG_SIZE * len(ordered) :])


def encode_step(msgs: Sequence[Message], change: Change | None = None, certificate: bytes | None = None) -> bytes:
    """A decided step for the evaluator: its message frame, prefixed by its change if any.
    `certificate` not None: the signed payload (a signed run), with the step's seals
    (`encode_seals`: its messages' signatures and this certificate, b"" in a strict run)."""
    if certificate is not None:
        ordered = sorted(msgs)
        data = change.to_bytes() if change else b""
        seals = encode_seals(ordered, certificate)
        return _SIGNED_MAGIC + _U32.pack(len(data)) + data + _U32.pack(len(seals)) + seals + message.encode(ordered)
    frame = message.encode(msgs)
    if not change:
        return frame
    data = change.to_bytes()
    return _STEP_MAGIC + _U32.pack(len(data)) + data + frame


def content(payload: bytes) -> bytes:
    """What a step payload says, its seals left out: two honest attach nodes certify one step
    with other signed votes (each holds its own), yet send the same step. The payload itself
    when unsigned or not well-formed (decoding refuses that)."""
    at = len(_SIGNED_MAGIC)
    if not payload.startswith(_SIGNED_MAGIC) or len(payload) < at + 4:
        return payload
    (n,) = _U32.unpack_from(payload, at)
    change, at = payload[at + 4 : at + 4 + n], at + 4 + n
    if len(payload) < at + 4:
        return payload
    (n,) = _U32.unpack_from(payload, at)
    return _SIGNED_MAGIC + _U32.pack(len(change)) + change + payload[at + 4 + n :]


def decode_step(
    payload: bytes, step: int, *, limits: Limits | None = None, seed_of: SeedOf | None = None
) -> tuple[list[Message], Change | None]:
    """(messages, change) of a step payload, signed or not (a signed one's messages carry their
    signatures; its certificate is `decode_signed_step`'s). `limits`, `seed_of`: message.decode's."""
    msgs, change, _ = decode_signed_step(payload, step, limits=limits, seed_of=seed_of)
    return msgs, change


def decode_signed_step(
    payload: bytes, step: int, *, limits: Limits | None = None, seed_of: SeedOf | None = None
) -> tuple[list[Message], Change | None, bytes | None]:
    """(messages, change, certificate) of a step payload; the certificate is None for an unsigned
    payload and b"" for a signed one without (a strict run's). FrameError on any defect."""
    if payload.startswith(_SIGNED_MAGIC):
        at = len(_SIGNED_MAGIC)
        if len(payload) < at + 4:
            raise FrameError("signed step payload is truncated")
        (n,) = _U32.unpack_from(payload, at)
        data = payload[at + 4 : at + 4 + n]
        at += 4 + n
        if len(data) != n or len(payload) < at + 4:
            raise FrameError("signed step payload: its change runs past the end")
        change = Change.from_bytes(step, data) if n else None
        (n,) = _U32.unpack_from(payload, at)
        seals = payload[at + 4 : at + 4 + n]
        if len(seals) != n:
            raise FrameError("signed step payload: its seals run past the end")
        msgs = message.decode(payload[at + 4 + n :], limits, seed_of=seed_of)
        signed, certificate = decode_seals(seals, msgs)
        return signed, change, certificate
    if not payload.startswith(_STEP_MAGIC):
        return message.decode(payload, limits, seed_of=seed_of), None, None
    head = len(_STEP_MAGIC) + 4
    if len(payload) < head:
        raise FrameError("step payload with a change is truncated")
    (n,) = _U32.unpack_from(payload, len(_STEP_MAGIC))
    change = Change.from_bytes(step, payload[head : head + n])
    return message.decode(payload[head + n :], limits, seed_of=seed_of), change, None


_PUSH = struct.Struct("<II")  # a push in a blob: step, payload length (bytes)


def encode_push(step: int, payload: bytes) -> bytes:
    """A churn push to the evaluator: u32 step, then the step payload (`encode_step`)."""
    return _U32.pack(step) + payload


def decode_push(data: bytes) -> tuple[int, bytes]:
    """(step, step payload) of a push; FrameError when it cannot hold a step."""
    if len(data) < 4:
        raise FrameError(f"evaluator push of {len(data)} bytes has no step")
    return _U32.unpack_from(data)[0], data[4:]


def encode_pushes(steps: Iterable[tuple[int, bytes]]) -> bytes:
    """Decided steps (step, step payload) as one blob: what opens every evaluator edge. A CRC
    over the whole blob, because one corrupt length would misread every step after it."""
    body = b"".join(_PUSH.pack(s, len(p)) + p for s, p in steps)
    return _U32.pack(zlib.crc32(body)) + body


def decode_pushes(blob: bytes) -> list[tuple[int, bytes]]:
    """The (step, step payload) pairs of `encode_pushes`; FrameError on any defect."""
    if len(blob) < 4 or _U32.unpack_from(blob)[0] != zlib.crc32(blob[4:]):
        raise FrameError("evaluator catch-up blob fails its CRC or is truncated")
    out, at = [], 4
    while at < len(blob):
        if at + _PUSH.size > len(blob):
            raise FrameError("evaluator catch-up blob: a truncated step header")
        s, n = _PUSH.unpack_from(blob, at)
        at += _PUSH.size
        if at + n > len(blob):
            raise FrameError(f"evaluator catch-up blob: step {s} claims {n} bytes past the end")
        out.append((s, blob[at : at + n]))
        at += n
    return out


_CATCH_UP_MAGIC = b"SJ\x03"
_CATCH_UP_HEAD = struct.Struct("<IIIIQI")  # sponsor, next step, join step, incarnation, hop, base


@dataclass(frozen=True)
class CatchUp:
    """What a sponsor hands a rejoining neighbour (docs/churn-design.md, Rejoin across processes): its decided steps from
    `base` (step, step payload), the hop payload of the messages and notes it holds for undecided
    steps, the step the newcomer goes on from, its JOIN step, the incarnation admitted and `hop`,
    the sponsor's hop index of the edge's first exchange (the newcomer's hop clock starts there,
    so its JOIN note's link hop means the same exchange at both ends of its other edges). `base`
    is 0 (the whole log) unless the newcomer said it holds steps 0..base − 1 on the sponsor's
    chain (a log server's prefix: core/churn/prefix.py). Bytes: magic, CRC-32 of the rest, four
    u32, a u64 and a u32, u32 held length, held, then `encode_pushes(steps)`."""

    sponsor: int
    next_step: int
    join_step: int
    incarnation: int
    steps: list[tuple[int, bytes]]
    held: bytes
    hop: int = 0
    base: int = 0

    def to_bytes(self) -> bytes:
        head = _CATCH_UP_HEAD.pack(self.sponsor, self.next_step, self.join_step, self.incarnation, self.hop, self.base)
        body = head + _U32.pack(len(self.held)) + self.held + encode_pushes(self.steps)
        return _CATCH_UP_MAGIC + _U32.pack(zlib.crc32(body)) + body

    @classmethod
    def from_bytes(cls, data: bytes) -> CatchUp:
        """FrameError on any defect: a rejoin replays nothing it cannot trust."""
        at = len(_CATCH_UP_MAGIC) + 4
        if not data.startswith(_CATCH_UP_MAGIC) or len(data) < at + _CATCH_UP_HEAD.size + 4:
            raise FrameError("catch-up payload: bad magic or truncated")
        if _U32.unpack_from(data, len(_CATCH_UP_MAGIC))[0] != zlib.crc32(data[at:]):
            raise FrameError("catch-up payload fails its CRC")
        sponsor, next_step, join_step, incarnation, hop, base = _CATCH_UP_HEAD.unpack_from(data, at)
        at += _CATCH_UP_HEAD.size
        (n,) = _U32.unpack_from(data, at)
        at += 4
        if at + n > len(data):
            raise FrameError("catch-up payload: held messages run past the end")
        steps = decode_pushes(data[at + n :])
        return cls(sponsor, next_step, join_step, incarnation, steps, data[at : at + n], hop, base)


class StepSequence:
    """Steps from successive senders (attach nodes), each step once and in order from `next`.

    Each sender sends its decided steps from the step the evaluator needs (a catch-up blob), then
    each step it commits; its first steps may repeat what an earlier sender sent. `offer` says
    whether a step is the next one (take it), an old one (drop it, after checking that its bytes
    equal the ones taken: two senders with different contents for one step are two histories,
    an error, never a silent pick), or a gap, which is an error: a sender skips nothing.
    """

    def __init__(self, next_step: int = 0) -> None:
        self.next = next_step
        self._seen: dict[int, bytes] = {}  # step -> digest of the payload taken (this stream's)

    def offer(self, step: int, payload: bytes | None = None) -> bool:
        if step > self.next:
            raise FrameError(f"evaluator stream jumps from step {self.next} to step {step}")
        key = None if payload is None else hashlib.blake2b(content(payload), digest_size=8).digest()
        if step < self.next:
            if key is not None and self._seen.get(step, key) != key:
                raise FrameError(
                    f"evaluator stream: step {step} arrived again with other contents: two senders hold "
                    "different histories (refused; nothing of it is logged)"
                )
            return False
        if key is not None:
            self._seen[step] = key
        self.next += 1
        return True
