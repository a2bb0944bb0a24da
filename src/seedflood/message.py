"""One ZO update as a message, and its wire format.

Owns: `Message` (origin, step, seed, scalar, k), its fixed-width little-endian record, frames
(a header plus records), and strict validation on decode. A frame is decoded whole or not at all:
any problem raises `FrameError` and yields no message, so nothing from a bad frame is applied.

Wire format (all little-endian):
  header  16 bytes: magic b"SFLD", version u16, record size u16, count u32, crc32 u32 (of records)
  record  24 bytes: origin u32, step u32, seed u64, scalar f32, k u16, reserved u16 (= 0)
The scalar travels as float32: the originator rounds its own scalar the same way (`Message.make`),
so every client applies exactly the bits that travel.

Assumes: origins are topology node ids (< 2**32), steps < 2**32, k < 2**16.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MAGIC = b"SFLD"
VERSION = 1
HEADER = struct.Struct("<4sHHII")
RECORD = struct.Struct("<IIQfHH")
HEADER_SIZE = HEADER.size  # 16
RECORD_SIZE = RECORD.size  # 24


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
    """What a receiver accepts. `seed_of` (if given) must reproduce each message's seed."""

    n_origins: int
    min_step: int = 0
    max_step: int = 2**32 - 1
    max_k: int = 1
    max_scalar: float = 1e6
    seed_of: Callable[[int, int, int], int] | None = None  # (origin, step, k) -> seed

    def check(self, m: Message) -> None:
        if not 0 <= m.origin < self.n_origins:
            raise FrameError(f"origin {m.origin} out of range 0..{self.n_origins - 1}")
        if not self.min_step <= m.step <= self.max_step:
            raise FrameError(f"step {m.step} outside window {self.min_step}..{self.max_step}")
        if not 0 <= m.k < self.max_k:
            raise FrameError(f"perturbation index k={m.k} out of range 0..{self.max_k - 1}")
        if not math.isfinite(m.scalar) or abs(m.scalar) > self.max_scalar:
            raise FrameError(f"scalar {m.scalar!r} is not finite or exceeds {self.max_scalar:g}")
        if self.seed_of is not None and self.seed_of(m.origin, m.step, m.k) != m.seed:
            raise FrameError(f"seed of message {m.id} does not match its derivation")


def encode(messages: Iterable[Message]) -> bytes:
    """Pack messages into one frame (an empty iterable gives a 16-byte header-only frame)."""
    body = b"".join(RECORD.pack(m.origin, m.step, m.seed, m.scalar, m.k, 0) for m in messages)
    count = len(body) // RECORD_SIZE
    return HEADER.pack(MAGIC, VERSION, RECORD_SIZE, count, zlib.crc32(body)) + body


def decode(frame: bytes, limits: Limits | None = None) -> list[Message]:
    """Unpack and validate a frame; raises FrameError (and returns nothing) on any problem."""
    if len(frame) < HEADER_SIZE:
        raise FrameError(f"frame of {len(frame)} bytes is shorter than the {HEADER_SIZE}-byte header")
    magic, version, rsize, count, crc = HEADER.unpack_from(frame)
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r} (expected {MAGIC!r})")
    if version != VERSION or rsize != RECORD_SIZE:
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
    if len({m.id for m in out}) != len(out):
        raise FrameError("frame repeats a message id")
    return out
