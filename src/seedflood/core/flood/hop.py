"""The hop payload: what one hop carries to one neighbour, messages and notes, and its bytes.

Owns `encode_hop` / `decode_hop`: a message frame (wire/message.py), plus notes
(membership/notes.py) when there are any; `outbox_frames` / `read_frame`: a flood's frames of
one exchange, and a neighbour's frame taken into it. Without notes it is exactly the plain message frame,
so a strict run's traffic is unchanged byte for byte. (A decided step's bytes beyond the hop —
the evaluator stream, the catch-up — are stepstream.py's.)

Assumes: pure Python (the core).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import replace

from seedflood.core.flood.flooding import Flood, Item
from seedflood.core.membership.notes import SIG_SIZE, Note, check_note
from seedflood.core.wire import message
from seedflood.core.wire.message import FrameError, Limits, Message

_NOTE = struct.Struct("<BIIQH")  # kind, origin, step, value, body length: 19 bytes, then the body
_HOP_MAGIC = b"SN\x02"  # a hop payload with notes: magic, u32 message-frame length, frame, notes
_SIGNED_MAGIC = b"SN\x03"  # the same, then every item's signature (a run with trust.sign)
_NO_SIG = bytes(SIG_SIZE)  # in a signed payload: an item that carries no signature
_NO_SIGNER = 0xFFFFFFFF
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")


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
    notes: list[Note] = []
    at = 2
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


def outbox_frames(flood: Flood) -> dict[int, bytes]:
    """Each neighbour's frame of the next exchange: the flood's outbox, encoded (neighbour ->
    bytes). In a signed run an item without a signature (restored from a log: nobody could check
    it) is not sent."""
    frames = {}
    signed = flood.signing is not None
    encode = encode_hop
    for p, items in flood.outbox().items():
        if signed:
            items = [i for i in items if i.sig]
        if items and isinstance(items[-1], Note):  # the outbox lists messages, then notes
            frames[p] = encode(
                [m for m in items if isinstance(m, Message)], [n for n in items if isinstance(n, Note)], signed
            )
        else:
            frames[p] = encode(items, (), signed)  # type: ignore[arg-type]  # messages only
    return frames


def read_frame(flood: Flood, peer: int, frame: bytes, limits: Limits) -> tuple[list[Item], bool]:
    """Take neighbour `peer`'s frame into `flood`: the items new to it, and whether the frame
    carried notes. Raises FrameError where the frame does not decode (nothing of it is taken)."""
    msgs, notes = decode_hop(frame, limits)
    return flood.receive(peer, [*msgs, *notes] if notes else msgs), bool(notes)
