"""The message log's records: their format and the scan that validates them.

Owns what follows the header (logheader.py) in a log.bin (all integers little-endian): per step
a record: u32 step, u32 frame length, frame (message.py frame v2: magic, version, layout,
count, base step = the record's step, crc32 over header and messages; one record of
origin/k/scalar per message, in canonical (origin, k) order; never empty). Steps run 0, 1, 2...
Membership (churn runs, docs/churn-design.md, Membership is data): a step whose roster changed is preceded by a
membership record: u32 (CHANGE_FLAG | step), u32 length, membership.Change bytes (CRC-checked
JSON: leave, join, audit). The members of every step are a pure function of these records
(all N before the first), and each step record must hold exactly its members' messages.
Signatures (a signed run, `trust.sign`; docs/trust.md, What the evaluator and the log verify):
every step record is preceded (after its membership record, if any) by a seal record: u32
(SEAL_FLAG | step), u32 length, the step's seals (core/flood/stepstream.py `encode_seals`: u32
count, each message's signature in canonical order, then the certificate of its commit, empty
in a strict run). An unsigned run writes none, so its log is byte for byte what it was, and a
log from before seal records reads as it did; `Scan.seals` holds them for whoever verifies.

Torn tail vs corruption (`scan_records`): only an incomplete FINAL record is a torn tail (a
crash mid-append): fewer bytes remain than the record needs and every field that is present
agrees (the step is the next one, the length is a valid frame length, the frame header's
magic/version/count agree with the length; v1: whole messages present carry that step; v2: the
base step is that step, the layout has no step offsets, whole messages present are in strictly
increasing (origin, k) order). Readers leave a torn tail out (measured: `Scan.torn`) and
writers cut it off before appending. Anything else (a complete record failing its CRC, even the
last one; a bad magic; a step out of sequence; a length that disagrees with the frame header;
trailing garbage; a record the caller's `check` rejects) raises CheckpointError naming the
record's byte offset and step.
Every record is verified structurally and, through `check`, with the same limits as frames
from the wire.

Reading (`scan_records`) is one pass over the bytes that checks each record's header and CRC,
then every message at once as arrays (logarrays.py); the records come back as `StepColumns`.
A `StepsCheck` (the run's Protocol) checks them as arrays too; a plain `RecordCheck` is called
per record. Either way the first bad record raises, with the reason the per-message decoder and
check give (`_record_error`).

Assumes: the log's frame version and seed derivation come from its header (`LogFormat`).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol, runtime_checkable

import numpy as np

from seedflood.core.flood.columns import StepColumns
from seedflood.core.flood.stepstream import decode_seals
from seedflood.core.membership.notes import SIG_SIZE
from seedflood.core.membership.roster import Change, Roster
from seedflood.core.wire import message
from seedflood.core.wire.message import Message
from seedflood.rundir import logarrays
from seedflood.rundir.layout import CheckpointError
from seedflood.rundir.logheader import LogFormat

_U32 = struct.Struct("<I")
_V2_MAGIC = message.MAGIC_2 + bytes((message.VERSION_2,))
REC = struct.Struct("<II")  # step, frame length
CHANGE_FLAG = 0x8000_0000  # a record's step with this bit set: the membership record of that step
SEAL_FLAG = 0x4000_0000  # with this bit set: the seal record of that step (its signatures)
MAX_CHANGE_BYTES = 1 << 20
MAX_SEAL_BYTES = 1 << 26  # 64 MiB: a million signatures
# Sanity bound on one record: 2**22 messages (~100 MB) per step is far beyond any real N*K.
MAX_FRAME_BYTES = message.HEADER_SIZE + message.RECORD_SIZE * 2**22

# (step, messages) of one whole record from disk; raises ValueError to reject it. After a
# membership record it is called with members= (the step's members) as a keyword too.
RecordCheck = Callable[..., None]


@runtime_checkable
class StepsCheck(Protocol):
    """A check of whole records that can also find the first bad one among columns at once
    (core.flood.protocol.Protocol): `check_step` is the RecordCheck, `first_bad` its array form."""

    def check_step(self, step: int, messages: Sequence[Message], members: Collection[int] | None = None) -> None: ...
    def first_bad(self, cols: StepColumns, members: Sequence[frozenset[int] | None]) -> int | None: ...


@dataclass
class Scan:
    records: StepColumns  # every whole record, as arrays (a sequence of (step, messages))
    ends: list[int]  # ends[i]: byte offset just past record i
    start: int  # byte offset of record 0
    torn: int  # bytes of an incomplete final record (0: none)
    changes: dict[int, Change] = field(default_factory=dict)  # step -> membership change
    seals: dict[int, bytes] = field(default_factory=dict)  # step -> its seal record's bytes (signed runs)


def _v2_layouts() -> dict[int, tuple[int, int, int]]:
    """Layout byte -> (count width, header size, record size) of every v2 layout a log frame may
    have (a count, no step offsets)."""
    out = {}
    for b in range(256):
        try:
            lay = message.Layout.of_byte(b)
        except message.FrameError:
            continue
        if not lay.offset:
            out[b] = (lay.count, lay.header_size, lay.record_size)
    return out


_LAYOUTS = _v2_layouts()
_II = struct.Struct("<II")


def scan_records(f: IO[bytes], path: Path, start: int, fmt: LogFormat, check: RecordCheck | StepsCheck | None) -> Scan:
    """Every whole record from `start`, validated; a torn final record is measured, not returned.

    One pass over the bytes reads each record's header, checks its frame's header and CRC and
    notes where its messages lie; logarrays.decode then reads every message at once. A record's
    exact reason for rejection comes from the per-message decoder (`_record_error`), and the
    first bad record raises, whichever check found it."""
    size = os.fstat(f.fileno()).st_size
    f.seek(start)
    buf = f.read(size - start)
    size = start + len(buf)
    mv = memoryview(buf)
    ends: list[int] = []
    steps: list[int] = []
    at: list[int] = []  # byte offset of each whole record's step record (for error messages)
    frames = logarrays.Frames()
    members: list[frozenset[int] | None] = []
    changes: dict[int, Change] = {}
    seals: dict[int, bytes] = {}
    torn = 0
    off = start
    roster: Roster | None = None  # from the first membership record on
    change_at: int | None = None  # byte offset of a membership or seal record awaiting its step record
    sealed = False  # a seal record awaits its step record
    stopped: CheckpointError | None = None  # the scan's own rejection of record len(ends)
    v2 = fmt.version == message.VERSION_2
    crc32 = zlib.crc32
    add_frame, add_at, add_step, add_end, add_members = (
        frames.add, at.append, steps.append, ends.append, members.append
    )  # fmt: skip
    width = message.width
    while off < size:
        step = len(ends)  # the step this record must hold
        p = off - start
        remaining = size - off
        if remaining >= REC.size:
            rstep, n = REC.unpack_from(buf, p)
            if rstep == step and n <= remaining - REC.size:  # the common case: a whole step record
                q = p + REC.size
                ok = False
                if v2:
                    lay = _LAYOUTS.get(buf[q + 3]) if n >= message.V2_MIN_FRAME else None
                    if lay is not None and buf[q : q + 3] == _V2_MAGIC:
                        cw, hs, rs = lay
                        count = int.from_bytes(buf[q + 4 : q + 4 + cw], "little")
                        base, crc = _II.unpack_from(buf, q + 4 + cw)
                        ok = (
                            0 < count
                            and hs + count * rs == n <= MAX_FRAME_BYTES
                            and base == step
                            and width(count) == cw
                            and crc32(mv[q + hs : q + n], crc32(mv[q + 2 : q + hs - 4])) == crc
                        )
                        body, key = q + hs, buf[q + 3]
                elif n >= message.HEADER_SIZE:
                    magic, version, rsize, count, crc = message.HEADER.unpack_from(buf, q)
                    ok = (
                        magic == message.MAGIC
                        and version == message.VERSION_1
                        and rsize == message.RECORD_SIZE
                        and message.HEADER_SIZE + count * message.RECORD_SIZE == n <= MAX_FRAME_BYTES
                        and crc32(mv[q + message.HEADER_SIZE : q + n]) == crc
                    )
                    body, key = q + message.HEADER_SIZE, logarrays.V1_KEY
                if ok:
                    add_frame(body, count, key)
                    add_at(off)
                    off += REC.size + n
                    add_step(step)
                    add_end(off)
                    add_members(None if roster is None else roster.members)
                    change_at, sealed = None, False
                    continue

        # Anything else, record by record as the per-message reader always did.
        def bad(reason: str) -> CheckpointError:
            return CheckpointError(f"{path}: record at byte offset {off} (step {step}) is corrupt: {reason}")

        head = buf[p : p + min(REC.size, remaining)]
        if len(head) < REC.size:  # torn inside the 8-byte record header
            got = head[:4]
            sealed_head = _U32.pack(SEAL_FLAG | step)[: len(got)] if fmt.signed and not sealed else None
            if got not in (_U32.pack(step)[: len(got)], sealed_head):
                stopped = bad(f"incomplete record header does not start with step {step}")
                break
            torn = remaining
            break
        rstep, n = REC.unpack(head)
        if rstep & SEAL_FLAG and not rstep & CHANGE_FLAG:
            if not fmt.signed:
                stopped = bad("a seal record in the log of an unsigned run (its header records no roster)")
                break
            if rstep & ~SEAL_FLAG != step or sealed or not 4 <= n <= MAX_SEAL_BYTES:
                stopped = bad(f"seal record for step {rstep & ~SEAL_FLAG} out of sequence or of a bad length")
                break
            data = buf[p + REC.size : p + REC.size + min(n, remaining - REC.size)]
            if len(data) >= 4 and 4 + SIG_SIZE * _U32.unpack_from(data)[0] > n:
                stopped = bad(f"seal record of {n} bytes claims {_U32.unpack_from(data)[0]} signatures")
                break
            if len(data) < n:
                torn = remaining
                break
            seals[step] = data
            sealed = True
            change_at = off if change_at is None else change_at
            off += REC.size + n
            continue
        if rstep & CHANGE_FLAG:
            if rstep & ~CHANGE_FLAG != step or change_at is not None or sealed or n > MAX_CHANGE_BYTES:
                stopped = bad(f"membership record for step {rstep & ~CHANGE_FLAG} out of sequence or too long")
                break
            data = buf[p + REC.size : p + REC.size + min(n, remaining - REC.size)]
            if len(data) < n:
                torn = remaining
                break
            if roster is None:
                if fmt.nodes is None:
                    stopped = bad("membership record in a log whose header has no topology.nodes")
                    break
                roster = Roster(max(fmt.nodes, fmt.max_nodes), frozenset(range(fmt.nodes)))
            try:
                change = Change.from_bytes(step, data)
                roster.apply(change)
            except (message.FrameError, ValueError) as e:
                stopped = bad(str(e))
                break
            changes[step] = change
            change_at = off
            off += REC.size + n
            continue
        if rstep != step:
            stopped = bad(f"holds step {rstep}, expected {step} (out of sequence)")
            break
        frame = buf[p + REC.size : p + REC.size + min(n, remaining - REC.size)] if n <= MAX_FRAME_BYTES else b""
        whole_frame = _check_v1 if fmt.version == message.VERSION_1 else _check_v2
        reason = whole_frame(frame, n, step)
        if reason:
            stopped = bad(reason)
            break
        if len(frame) < n:  # torn inside the frame, and every byte present agrees
            torn = remaining
            break
        try:  # a whole frame the quick path refused: the decoder says why
            message.decode(frame, seed_of=fmt.seed_of) if fmt.seed_of else message.decode(frame)
        except message.FrameError as e:
            stopped = bad(str(e))
            break
        stopped = bad("frame refused by the log reader")  # unreachable: the quick path takes every valid frame
        break
    cols, first = logarrays.decode(buf, frames, np.asarray(steps, np.int64), fmt.run_seed)

    def record_error(i: int) -> CheckpointError | None:
        """Why record i is rejected, from the per-message decoder, its seals and `check`."""
        return _record_error(
            path, at[i], i, bytes(mv[at[i] - start + REC.size : ends[i] - start]), fmt, seals.get(i), check, members[i]
        )

    limit = len(ends) if first is None else first
    if fmt.signed:  # seal records hold one signature per message: checked record by record
        for i in sorted(s for s in seals if s < limit):
            if record_error(i) is not None:
                limit = i
                break
    if check is not None and limit:
        if isinstance(check, StepsCheck):
            c = check.first_bad(cols[:limit], members[:limit])
        else:
            c = next((i for i in range(limit) if _rejects(check, i, cols, members[i])), None)
        limit = limit if c is None else c
    if limit < len(ends):
        raise record_error(limit) or CheckpointError(
            f"{path}: record at byte offset {at[limit]} (step {limit}) is corrupt: rejected by the log reader"
        )
    if stopped is not None:
        raise stopped
    if change_at is not None:  # a membership or seal record without (all of) its step record: torn
        torn = size - change_at
    changes.pop(len(ends), None)
    seals.pop(len(ends), None)
    return Scan(records=cols, ends=ends, start=start, torn=torn, changes=changes, seals=seals)


def _rejects(check: RecordCheck, i: int, cols: StepColumns, members: frozenset[int] | None) -> bool:
    step, msgs = cols[i]
    try:
        check(step, msgs) if members is None else check(step, msgs, members=members)
    except ValueError:
        return True
    return False


def _record_error(
    path: Path,
    off: int,
    step: int,
    frame: bytes,
    fmt: LogFormat,
    seals: bytes | None,
    check: RecordCheck | StepsCheck | None,
    members: frozenset[int] | None,
) -> CheckpointError | None:
    """Why the whole record of `step` at byte offset `off` holding `frame` is rejected, or None:
    the per-message rules, in the order the reader has always applied them."""

    def bad(reason: str) -> CheckpointError:
        return CheckpointError(f"{path}: record at byte offset {off} (step {step}) is corrupt: {reason}")

    try:
        msgs = message.decode(frame, seed_of=fmt.seed_of) if fmt.seed_of else message.decode(frame)
    except message.FrameError as e:
        return bad(str(e))
    if any(m.step != step for m in msgs):
        return bad("holds messages of another step")
    if msgs != sorted(msgs):
        return bad("messages are not in canonical (origin, k) order")
    if seals is not None:
        try:
            decode_seals(seals, msgs)
        except message.FrameError as e:
            return bad(f"its seal record: {e}")
    if check is not None:
        fn = check.check_step if isinstance(check, StepsCheck) else check
        try:
            fn(step, msgs) if members is None else fn(step, msgs, members=members)
        except ValueError as e:
            return bad(f"rejected: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    return None


def _check_v1(frame: bytes, n: int, step: int) -> str | None:
    """Why the v1 frame prefix `frame` of a record of length `n` for `step` is corrupt, or None."""
    if n < message.HEADER_SIZE or (n - message.HEADER_SIZE) % message.RECORD_SIZE or n > MAX_FRAME_BYTES:
        return f"length field {n} is not a valid frame length"
    if len(frame) >= message.HEADER_SIZE:
        magic, version, rsize, count, _crc = message.HEADER.unpack_from(frame)
        if magic != message.MAGIC:
            return f"bad frame magic {magic!r}"
        if version != message.VERSION_1 or rsize != message.RECORD_SIZE:
            return f"unsupported frame version {version} / record size {rsize}"
        if message.HEADER_SIZE + count * message.RECORD_SIZE != n:
            return f"length field {n} disagrees with the frame header ({count} messages)"
    elif frame[:4] != message.MAGIC[: len(frame[:4])]:
        return f"bad frame magic {frame[:4]!r}"
    if len(frame) < n:  # torn: whole messages present must still fit
        body = frame[message.HEADER_SIZE :]
        whole = len(body) // message.RECORD_SIZE * message.RECORD_SIZE
        for origin, mstep, _seed, _scalar, _k, reserved in message.RECORD.iter_unpack(body[:whole]):
            if mstep != step or reserved != 0:
                return f"incomplete record holds a message of step {mstep} from origin {origin}"
    return None


def _check_v2(frame: bytes, n: int, step: int) -> str | None:
    """Why the v2 frame prefix `frame` of a record of length `n` for `step` is corrupt, or None.

    A log frame holds one step, so its base step is `step` and its layout has no offsets."""
    if not message.V2_MIN_FRAME <= n <= MAX_FRAME_BYTES:
        return f"length field {n} is not a valid frame length"
    if frame[:2] != message.MAGIC_2[: len(frame[:2])]:
        return f"bad frame magic {frame[:2]!r}"
    if len(frame) > 2 and frame[2] != message.VERSION_2:
        return f"unsupported frame version {frame[2]}"
    if len(frame) < message.V2_PREFIX:
        return None
    try:
        lay = message.Layout.of_byte(frame[3])
    except message.FrameError as e:
        return str(e)
    if lay.offset:
        return f"layout byte {frame[3]:#04x} has step offsets (a log frame holds one step)"
    if len(frame) >= message.V2_PREFIX + lay.count:
        count = int.from_bytes(frame[message.V2_PREFIX : message.V2_PREFIX + lay.count], "little")
        if count == 0 or lay.header_size + count * lay.record_size != n:
            return f"length field {n} disagrees with the frame header ({count} messages)"
    if len(frame) >= lay.header_size - 4:
        (base,) = _U32.unpack_from(frame, message.V2_PREFIX + lay.count)
        if base != step:
            return f"frame header holds step {base}"
    if len(frame) < n and len(frame) > lay.header_size:  # torn: whole messages present must be in order
        body = frame[lay.header_size :]
        ids = [row[:-1] for row in lay.record.iter_unpack(body[: len(body) // lay.record_size * lay.record_size])]
        if any(a >= b for a, b in zip(ids, ids[1:])):
            return "incomplete record holds messages out of canonical (origin, k) order"
    return None
