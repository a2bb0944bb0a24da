"""One ZO update as a message, and its wire formats (frame v2, and v1 still decoded).

Owns: `Message` (origin, step, seed, scalar, k), frames (a header plus records, little-endian),
and strict validation on decode. A frame is decoded whole or not at all: any problem raises
`FrameError` and yields no message, so nothing from a bad frame is applied.

Frame v2 (what `encode` writes): a record carries only what a receiver cannot derive.
  empty   zero bytes: a frame with no messages is b"" (the transport's length header says 0)
  header  magic b"SF", version u8 = 2, layout u8, count (1/2/4 bytes), base step u32, crc32 u32
  record  step offset, origin, k (0/1/2/4 bytes each, from the layout), scalar f32
- The layout byte holds four 2-bit width codes (0, 1, 2, 4 bytes): bits 0-1 step offset, 2-3
  origin, 4-5 k, 6-7 count (code 0 is reserved there: a non-empty frame has a count). Widths are
  the smallest that hold the frame's largest value (0 when every value is 0). A record's step is
  the header's base step (the frame's smallest) + its offset. 16 clients, K = 1: a frame of one
  step spends 0 + 1 + 0 + 4 = 5 bytes per message, one spanning up to 256 steps 6.
- The seed does not travel: it is `seed_of(origin, step, k)` (protocol.seed = rng.derive), which
  every receiver checked anyway. `decode` fills it in, so decoding a non-empty v2 frame needs
  `seed_of` (argument or `Limits.seed_of`); without one it is a caller bug (ValueError).
- The CRC-32 covers the header bytes before it (layout, count, base step) and the records.
- One byte string per message set: the encoder's choice of widths and base is the only valid
  one (the decoder rejects wider fields or a base above the smallest step), so a log written
  twice from the same steps is byte-identical.
Frame v1 (decoded, and written by `encode(..., version=1)`): 16-byte header magic b"SFLD",
version u16 = 1, record size u16 = 24, count u32, crc32 u32 (of the records); 24-byte records
origin u32, step u32, seed u64, scalar f32, k u16, reserved u16 (= 0). v1 begins b"SFLD": its
third byte ("L" = 76) is never a v2 version byte, so the two are told apart by their first bytes.

The scalar travels as float32: the originator rounds its own scalar the same way (`Message.make`),
so every client applies exactly the bits that travel.

Assumes: origins and steps < 2**32, k < 2**16 (v1) or < 2**32 (v2).
"""

from __future__ import annotations

import functools
import math
import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

SeedOf = Callable[[int, int, int], int]  # (origin, step, k) -> seed

VERSION_1 = 1
VERSION_2 = 2
VERSION = VERSION_2
"""The version `encode` writes by default."""

# -- v1 --
MAGIC = b"SFLD"
HEADER = struct.Struct("<4sHHII")
RECORD = struct.Struct("<IIQfHH")
HEADER_SIZE = HEADER.size  # 16 (v1)
RECORD_SIZE = RECORD.size  # 24 (v1)

# -- v2 --
MAGIC_2 = b"SF"
WIDTHS = (0, 1, 2, 4)  # bytes of a field, by its 2-bit layout code
_FMT = {0: "", 1: "B", 2: "H", 4: "I"}
_U32 = struct.Struct("<I")
V2_PREFIX = 4  # magic, version, layout: where the count starts
V2_MIN_FRAME = V2_PREFIX + 1 + 8 + 4  # smallest non-empty v2 frame: 1-byte count, one 4-byte record


class FrameError(ValueError):
    """A frame failed validation; nothing in it may be applied."""


def _f32(x: float) -> float:
    """Round a Python float to the nearest float32 (what the wire carries)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


@dataclass(frozen=True, order=True)
class Message:
    """One update: θ ← θ − lr(step)·w·scalar·z(seed). Ordered canonically by (step, origin, k)."""

    step: int
    origin: int
    k: int
    seed: int
    scalar: float
    sig: bytes = field(default=b"", compare=False, repr=False)
    """Its origin's Ed25519 signature (64 bytes; flood.signing) when the run signs, else b"".
    Not part of its identity, order or equality: two copies differ by their scalar or seed."""

    @classmethod
    def make(cls, origin: int, step: int, seed: int, scalar: float, k: int = 0) -> Message:
        """A message with its scalar rounded to float32, exactly as it will travel."""
        return cls(step=step, origin=origin, k=k, seed=seed, scalar=_f32(scalar))

    @property
    def id(self) -> tuple[int, int, int]:
        """Identity for de-duplication: (origin, step, k)."""
        return (self.origin, self.step, self.k)


@dataclass(frozen=True)
class Limits:
    """What a receiver accepts. `seed_of` (if given) must reproduce each message's seed; a v2
    frame's seeds are made by it."""

    n_origins: int
    min_step: int = 0
    max_step: int = 2**32 - 1
    max_k: int = 1
    max_scalar: float = 1e6
    seed_of: SeedOf | None = None
    due: Callable[[int, int], bool] | None = None
    """(origin, step) -> whether that origin originates at that step (zo.stride); None = always."""

    def check(self, m: Message, check_seed: bool = True) -> None:
        """Raise FrameError unless m is acceptable (`check_seed=False`: its seed was derived)."""
        if not 0 <= m.origin < self.n_origins:
            raise FrameError(f"origin {m.origin} out of range 0..{self.n_origins - 1}")
        if not self.min_step <= m.step <= self.max_step:
            raise FrameError(f"step {m.step} outside window {self.min_step}..{self.max_step}")
        if not 0 <= m.k < self.max_k:
            raise FrameError(f"perturbation index k={m.k} out of range 0..{self.max_k - 1}")
        if not math.isfinite(m.scalar) or abs(m.scalar) > self.max_scalar:
            raise FrameError(f"scalar {m.scalar!r} is not finite or exceeds {self.max_scalar:g}")
        if check_seed and self.seed_of is not None and self.seed_of(m.origin, m.step, m.k) != m.seed:
            raise FrameError(f"seed of message {m.id} does not match its derivation")
        if self.due is not None and not self.due(m.origin, m.step):
            raise FrameError(f"origin {m.origin} does not originate at step {m.step} (zo.stride)")


# -- v2 layout -------------------------------------------------------------------------------------
def width(value: int) -> int:
    """Smallest of 0/1/2/4 bytes holding the non-negative `value` (0 bytes: value is 0)."""
    if value == 0:
        return 0
    if value < 1 << 8:
        return 1
    if value < 1 << 16:
        return 2
    if value < 1 << 32:
        return 4
    raise ValueError(f"message field {value} does not fit in 4 bytes")


@dataclass(frozen=True)
class Layout:
    """Field widths in bytes of one v2 frame (each 0, 1, 2 or 4; count never 0)."""

    offset: int
    origin: int
    k: int
    count: int

    @classmethod
    def of_byte(cls, b: int) -> Layout:
        lay = cls(*(WIDTHS[(b >> shift) & 3] for shift in (0, 2, 4, 6)))
        if lay.count == 0:
            raise FrameError(f"layout byte {b:#04x}: count width 0 is reserved (an empty frame is zero bytes)")
        return lay

    @property
    def byte(self) -> int:
        return sum(WIDTHS.index(w) << shift for w, shift in zip(self.fields, (0, 2, 4, 6)))

    @property
    def fields(self) -> tuple[int, int, int, int]:
        return (self.offset, self.origin, self.k, self.count)

    @property
    def header_size(self) -> int:
        """Magic, version, layout, count, base step, crc."""
        return V2_PREFIX + self.count + 8

    @property
    def record_size(self) -> int:
        return self.offset + self.origin + self.k + 4

    @property
    def record(self) -> struct.Struct:
        return _record_struct(self.offset, self.origin, self.k)


@functools.cache
def _record_struct(w_off: int, w_org: int, w_k: int) -> struct.Struct:
    return struct.Struct("<" + _FMT[w_off] + _FMT[w_org] + _FMT[w_k] + "f")


def _layout_of(max_offset: int, max_origin: int, max_k: int, count: int) -> Layout:
    return Layout(width(max_offset), width(max_origin), width(max_k), width(count))


@dataclass(frozen=True)
class Head:
    """The parsed v2 header: its layout, record count, base step and CRC."""

    layout: Layout
    count: int
    base: int
    crc: int

    @property
    def frame_size(self) -> int:
        return self.layout.header_size + self.count * self.layout.record_size


def read_head(frame: bytes | memoryview) -> Head:
    """Parse a v2 header from the start of `frame` (which may be longer); raises FrameError."""
    if len(frame) < V2_PREFIX:
        raise FrameError(f"frame of {len(frame)} bytes is shorter than a v2 header")
    if bytes(frame[:2]) != MAGIC_2:
        raise FrameError(f"bad magic {bytes(frame[:2])!r} (expected {MAGIC_2!r})")
    if frame[2] != VERSION_2:
        raise FrameError(f"unsupported frame version {frame[2]}")
    layout = Layout.of_byte(frame[3])
    if len(frame) < layout.header_size:
        raise FrameError(f"frame of {len(frame)} bytes is shorter than its {layout.header_size}-byte header")
    count = int.from_bytes(frame[V2_PREFIX : V2_PREFIX + layout.count], "little")
    base, crc = struct.unpack_from("<II", frame, V2_PREFIX + layout.count)
    return Head(layout, count, base, crc)


# -- encode / decode -----------------------------------------------------------------------------
def encode(messages: Iterable[Message], version: int = VERSION) -> bytes:
    """Pack messages into one frame, in the order given (v2: no messages give b"")."""
    if version == VERSION_1:
        body = b"".join(RECORD.pack(m.origin, m.step, m.seed, m.scalar, m.k, 0) for m in messages)
        count = len(body) // RECORD_SIZE
        return HEADER.pack(MAGIC, VERSION_1, RECORD_SIZE, count, zlib.crc32(body)) + body
    if version != VERSION_2:
        raise ValueError(f"message.encode: unknown frame version {version}")
    msgs = messages if isinstance(messages, Sequence) else list(messages)
    if not msgs:
        return b""
    # One pass per column and one struct call for the whole body (the hot path of every hop):
    # the bytes are those the format spells out field by field (test_message: a reference encoder).
    steps = [m.step for m in msgs]
    origins = [m.origin for m in msgs]
    ks = [m.k for m in msgs]
    base = min(steps)
    count = len(msgs)
    lay = _code(max(steps) - base) | _code(max(origins)) << 2 | _code(max(ks)) << 4 | _code(count) << 6
    body_struct, prefix, fields = _packer(lay, count)
    cols = [col for present, col in zip(fields, ([s - base for s in steps], origins, ks)) if present]
    cols.append([m.scalar for m in msgs])
    body = body_struct.pack(*[x for row in zip(*cols) for x in row]) if len(cols) > 1 else body_struct.pack(*cols[0])
    head = prefix + count.to_bytes(WIDTHS[lay >> 6], "little") + _U32.pack(base)
    return head + _U32.pack(zlib.crc32(body, zlib.crc32(head[2:]))) + body


def _code(value: int) -> int:
    """The 2-bit width code of `width(value)`."""
    return WIDTHS.index(width(value))


@functools.lru_cache(maxsize=1 << 12)
def _packer(lay: int, count: int) -> tuple[struct.Struct, bytes, tuple[bool, bool, bool]]:
    """(struct of `count` records, magic + version + layout byte, which of offset/origin/k are
    present) for layout byte `lay`."""
    layout = Layout.of_byte(lay)
    rec = _FMT[layout.offset] + _FMT[layout.origin] + _FMT[layout.k] + "f"
    present = (layout.offset > 0, layout.origin > 0, layout.k > 0)
    return struct.Struct("<" + rec * count), MAGIC_2 + bytes((VERSION_2, lay)), present


def decode(frame: bytes, limits: Limits | None = None, *, seed_of: SeedOf | None = None) -> list[Message]:
    """Unpack and validate a v1 or v2 frame; raises FrameError (and returns nothing) on any problem.

    A v2 frame's seeds come from `seed_of`, else `limits.seed_of`; a non-empty v2 frame without
    either raises ValueError (the caller must say how seeds are derived).
    """
    if frame[:4] == MAGIC:
        out = _decode_v1(frame, limits)
    elif not frame:
        return []
    else:
        derive = seed_of if seed_of is not None else (limits.seed_of if limits is not None else None)
        if derive is None and frame[:3] == MAGIC_2 + bytes((VERSION_2,)):
            raise ValueError("message.decode: a v2 frame carries no seeds; pass seed_of= or Limits(seed_of=...)")
        fast = _decode_v2_fast(frame, limits, derive)
        if fast is not None:
            return fast
        out = _decode_v2(frame, limits, derive)  # raises the defect's own error (or agrees with the fast path)
    if len({m.id for m in out}) != len(out):
        raise FrameError("frame repeats a message id")
    return out


_V2_START = MAGIC_2 + bytes((VERSION_2,))
_BASE_CRC = struct.Struct("<II")


@functools.lru_cache(maxsize=256)
def _unpacker(lay: int) -> tuple[int, int, int, tuple[int, int, int, int]] | None:
    """(count width, header size, record size, the four width codes) of layout byte `lay`;
    None for the reserved count width 0."""
    codes = (lay & 3, lay >> 2 & 3, lay >> 4 & 3, lay >> 6)
    if codes[3] == 0:
        return None
    layout = Layout.of_byte(lay)
    return layout.count, layout.header_size, layout.record_size, codes


@functools.lru_cache(maxsize=1 << 12)
def _body(lay: int, count: int) -> struct.Struct:
    layout = Layout.of_byte(lay)
    return struct.Struct("<" + (_FMT[layout.offset] + _FMT[layout.origin] + _FMT[layout.k] + "f") * count)


def _decode_v2_fast(frame: bytes, limits: Limits | None, seed_of: SeedOf | None) -> list[Message] | None:
    """A valid v2 frame's messages, checked column by column (one struct call for the body, a
    few min/max per field): the hot path of every hop. None whenever anything is off, or the
    check is a rare one (a second seed derivation, a non-finite scalar bound): `_decode_v2`
    then raises the defect's own error, or decodes it the long way."""
    size = len(frame)
    if size < V2_MIN_FRAME or frame[:3] != _V2_START or seed_of is None:
        return None
    spec = _unpacker(frame[3])
    if spec is None:
        return None
    w_cnt, header_size, rsize, (c_off, c_org, c_k, c_cnt) = spec
    count = int.from_bytes(frame[V2_PREFIX : V2_PREFIX + w_cnt], "little")
    if count == 0 or size != header_size + count * rsize or _code(count) != c_cnt:
        return None
    view = memoryview(frame)
    base, crc = _BASE_CRC.unpack_from(frame, V2_PREFIX + w_cnt)
    if zlib.crc32(view[header_size:], zlib.crc32(view[2 : header_size - 4])) != crc:
        return None
    flat = _body(frame[3], count).unpack_from(frame, header_size)
    if count == 1:  # a ring's frame: the record's fields as they are (its offset is 0: 0 bytes)
        origin = flat[0] if c_org else 0
        k = flat[-2] if c_k else 0
        if c_off or _code(origin) != c_org or _code(k) != c_k:
            return None
        steps: Sequence[int] = (base,)
        origins: Sequence[int] = (origin,)
        ks: Sequence[int] = (k,)
        last, max_org, max_k, scalars = base, origin, k, flat[-1:]
    else:
        stride = (c_off > 0) + (c_org > 0) + (c_k > 0) + 1
        at = 0
        cols: list[Sequence[int]] = []
        for c in (c_off, c_org, c_k):
            if c:
                col = flat[at::stride]
                at += 1
                if _code(max(col)) != c:  # not the narrowest width
                    return None
                cols.append(col)
            else:
                cols.append((0,) * count)
        offs, origins, ks = cols
        scalars = flat[stride - 1 :: stride]
        if c_off and min(offs) != 0:  # base is not the smallest step
            return None
        last = base + (max(offs) if c_off else 0)
        steps = [base + o for o in offs] if c_off else (base,) * count
        max_org, max_k = (max(origins) if c_org else 0), (max(ks) if c_k else 0)
    if last >= 1 << 32:
        return None
    if limits is not None:
        bound = limits.max_scalar
        if (
            (limits.seed_of is not None and limits.seed_of is not seed_of)
            or not math.isfinite(bound)
            or max_org >= limits.n_origins
            or base < limits.min_step
            or last > limits.max_step
            or max_k >= limits.max_k
            or not (-bound <= scalars[0] <= bound if count == 1 else all(-bound <= x <= bound for x in scalars))
        ):
            return None
        due = limits.due
        if due is not None and not (due(origins[0], base) if count == 1 else all(map(due, origins, steps))):
            return None
    if count > 1 and len(set(zip(origins, steps, ks))) != count:
        return None
    return [Message(s, o, k, seed_of(o, s, k), x) for s, o, k, x in zip(steps, origins, ks, scalars)]


def _decode_v1(frame: bytes, limits: Limits | None) -> list[Message]:
    if len(frame) < HEADER_SIZE:
        raise FrameError(f"frame of {len(frame)} bytes is shorter than the {HEADER_SIZE}-byte header")
    magic, version, rsize, count, crc = HEADER.unpack_from(frame)
    if version != VERSION_1 or rsize != RECORD_SIZE:
        raise FrameError(f"unsupported frame version {version} / record size {rsize}")
    if len(frame) != HEADER_SIZE + count * RECORD_SIZE:
        raise FrameError(f"frame length {len(frame)} does not match {count} records")
    body = memoryview(frame)[HEADER_SIZE:]
    if zlib.crc32(body) != crc:
        raise FrameError("frame checksum mismatch")
    out: list[Message] = []
    for origin, step, seed, scalar, k, reserved in RECORD.iter_unpack(body):
        if reserved != 0:
            raise FrameError("reserved record field is not zero")
        m = Message(step=step, origin=origin, k=k, seed=seed, scalar=scalar)
        if limits is not None:
            limits.check(m)
        out.append(m)
    return out


def _decode_v2(frame: bytes, limits: Limits | None, seed_of: SeedOf | None) -> list[Message]:
    head = read_head(frame)
    lay = head.layout
    if len(frame) != head.frame_size:
        raise FrameError(f"frame length {len(frame)} does not match {head.count} records of {lay.record_size} bytes")
    body = memoryview(frame)[lay.header_size :]
    if zlib.crc32(body, zlib.crc32(memoryview(frame)[2 : lay.header_size - 4])) != head.crc:
        raise FrameError("frame checksum mismatch")
    if head.count == 0:
        raise FrameError("a v2 frame with a header holds at least one message (an empty frame is zero bytes)")
    assert seed_of is not None  # decode() checked
    present = [w > 0 for w in lay.fields[:3]]
    out: list[Message] = []
    max_off = max_org = max_k = 0
    check_seed = limits is not None and limits.seed_of is not seed_of
    for row in lay.record.iter_unpack(body):
        it = iter(row)
        off, origin, k = (next(it) if p else 0 for p in present)
        scalar = row[-1]
        step = head.base + off
        if step >= 1 << 32:
            raise FrameError(f"step {head.base} + {off} does not fit in 32 bits")
        max_off, max_org, max_k = max(max_off, off), max(max_org, origin), max(max_k, k)
        m = Message(step=step, origin=origin, k=k, seed=seed_of(origin, step, k), scalar=scalar)
        if limits is not None:
            limits.check(m, check_seed=check_seed)
        out.append(m)
    # One encoding per message set: the smallest widths, base = the smallest step.
    if min(m.step for m in out) != head.base:
        raise FrameError(f"base step {head.base} is not the frame's smallest step")
    if _layout_of(max_off, max_org, max_k, head.count) != lay:
        raise FrameError(f"layout byte {lay.byte:#04x} is not the narrowest for its records")
    return out
