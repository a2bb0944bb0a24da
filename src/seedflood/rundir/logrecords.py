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

Assumes: the log's frame version and seed derivation come from its header (`LogFormat`).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from seedflood.core.flood.stepstream import decode_seals
from seedflood.core.membership.notes import SIG_SIZE
from seedflood.core.membership.roster import Change, Roster
from seedflood.core.wire import message
from seedflood.core.wire.message import Message
from seedflood.rundir.layout import CheckpointError
from seedflood.rundir.logheader import LogFormat

_U32 = struct.Struct("<I")
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


@dataclass
class Scan:
    records: list[tuple[int, list[Message]]]
    ends: list[int]  # ends[i]: byte offset just past record i
    start: int  # byte offset of record 0
    torn: int  # bytes of an incomplete final record (0: none)
    changes: dict[int, Change] = field(default_factory=dict)  # step -> membership change
    seals: dict[int, bytes] = field(default_factory=dict)  # step -> its seal record's bytes (signed runs)


def scan_records(f: IO[bytes], path: Path, start: int, fmt: LogFormat, check: RecordCheck | None) -> Scan:
    """Every whole record from `start`, validated; a torn final record is measured, not returned."""
    size = os.fstat(f.fileno()).st_size
    f.seek(start)
    scan = Scan(records=[], ends=[], start=start, torn=0)
    off = start
    roster: Roster | None = None  # from the first membership record on
    change_at: int | None = None  # byte offset of a membership or seal record awaiting its step record
    sealed = False  # a seal record awaits its step record
    while off < size:
        step = len(scan.records)  # the step this record must hold

        def bad(reason: str) -> CheckpointError:
            return CheckpointError(f"{path}: record at byte offset {off} (step {step}) is corrupt: {reason}")

        remaining = size - off
        head = f.read(min(REC.size, remaining))
        if len(head) < REC.size:  # torn inside the 8-byte record header
            got = head[:4]
            sealed_head = _U32.pack(SEAL_FLAG | step)[: len(got)] if fmt.signed and not sealed else None
            if got not in (_U32.pack(step)[: len(got)], sealed_head):
                raise bad(f"incomplete record header does not start with step {step}")
            scan.torn = remaining
            break
        rstep, n = REC.unpack(head)
        if rstep & SEAL_FLAG and not rstep & CHANGE_FLAG:
            if not fmt.signed:
                raise bad("a seal record in the log of an unsigned run (its header records no roster)")
            if rstep & ~SEAL_FLAG != step or sealed or not 4 <= n <= MAX_SEAL_BYTES:
                raise bad(f"seal record for step {rstep & ~SEAL_FLAG} out of sequence or of a bad length")
            data = f.read(min(n, remaining - REC.size))
            if len(data) >= 4 and 4 + SIG_SIZE * _U32.unpack_from(data)[0] > n:
                raise bad(f"seal record of {n} bytes claims {_U32.unpack_from(data)[0]} signatures")
            if len(data) < n:
                scan.torn = remaining
                break
            scan.seals[step] = data
            sealed = True
            change_at = off if change_at is None else change_at
            off += REC.size + n
            continue
        if rstep & CHANGE_FLAG:
            if rstep & ~CHANGE_FLAG != step or change_at is not None or sealed or n > MAX_CHANGE_BYTES:
                raise bad(f"membership record for step {rstep & ~CHANGE_FLAG} out of sequence or too long")
            data = f.read(min(n, remaining - REC.size))
            if len(data) < n:
                scan.torn = remaining
                break
            if roster is None:
                if fmt.nodes is None:
                    raise bad("membership record in a log whose header has no topology.nodes")
                roster = Roster(max(fmt.nodes, fmt.max_nodes), frozenset(range(fmt.nodes)))
            try:
                change = Change.from_bytes(step, data)
                roster.apply(change)
            except (message.FrameError, ValueError) as e:
                raise bad(str(e)) from None
            scan.changes[step] = change
            change_at = off
            off += REC.size + n
            continue
        if rstep != step:
            raise bad(f"holds step {rstep}, expected {step} (out of sequence)")
        frame = f.read(min(n, remaining - REC.size)) if n <= MAX_FRAME_BYTES else b""
        whole_frame = _check_v1 if fmt.version == message.VERSION_1 else _check_v2
        reason = whole_frame(frame, n, step)
        if reason:
            raise bad(reason)
        if len(frame) < n:  # torn inside the frame, and every byte present agrees
            scan.torn = remaining
            break
        try:
            msgs = message.decode(frame, seed_of=fmt.seed_of) if fmt.seed_of else message.decode(frame)
        except message.FrameError as e:
            raise bad(str(e)) from None
        if any(m.step != step for m in msgs):
            raise bad("holds messages of another step")
        if msgs != sorted(msgs):
            raise bad("messages are not in canonical (origin, k) order")
        if sealed:
            try:
                decode_seals(scan.seals[step], msgs)
            except message.FrameError as e:
                raise bad(f"its seal record: {e}") from None
        if check is not None:
            try:
                check(step, msgs) if roster is None else check(step, msgs, members=roster.members)
            except ValueError as e:
                raise bad(f"rejected: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        off += REC.size + n
        scan.records.append((step, msgs))
        scan.ends.append(off)
        change_at, sealed = None, False
    if change_at is not None:  # a membership or seal record without (all of) its step record: torn
        scan.torn = size - change_at
    scan.changes.pop(len(scan.records), None)
    scan.seals.pop(len(scan.records), None)
    return scan


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
