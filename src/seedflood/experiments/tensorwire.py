"""Tensor frames: how the baselines put a flat fp32 vector (or a compressed form of it) on the wire.

Owns three frame kinds, their exact sizes (`size`, analytic, so byte counts can be checked
against parameters × bytes × edges) and strict decoding (`decode` raises `WireError` and returns
nothing for a bad frame, like message.decode). A frame is a 20-byte header then a payload:

  header  magic b"TW", version u8 = 1, kind u8, numel u32, count u32, crc32 u32, reserved u32 = 0
          (little-endian; the CRC-32 covers the header bytes before it plus the payload)
  DENSE   count = numel; payload numel × f32                              size 20 + 4·numel
  TOPK    count = k;     payload k × u32 index (strictly increasing, < numel), then k × f32 values
                                                                           size 20 + 8·k
  INT8    count = s segments (s ≥ 1, the tensors of the flat vector); payload s × f32 scales,
          s × u32 segment lengths (summing to numel), then numel × i8 values q with
          x ≈ q · scale_seg, scale_seg = absmax(segment) / 127 (round to nearest, ties to even)
                                                                           size 20 + 8·s + numel

Assumes: vectors are 1-D float32 (any device; frames are built on the CPU) with < 2**32 entries.
Pure: numpy + torch + zlib; no torch.distributed, no environment.
"""

from __future__ import annotations

import math
import struct
import warnings
import zlib
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

MAGIC = b"TW"
VERSION = 1
DENSE, TOPK, INT8 = 0, 1, 2
KINDS = {"dense": DENSE, "topk": TOPK, "int8": INT8}
Kind = Literal["dense", "topk", "int8"]
HEAD = struct.Struct("<2sBBIII")  # magic, version, kind, numel, count, crc: the CRC'd prefix is 12 bytes
HEADER_SIZE = HEAD.size + 4  # + reserved u32 (= 0): 20
_PREFIX = 12  # header bytes before the CRC


class WireError(ValueError):
    """A tensor frame that is malformed, truncated or corrupt (one line)."""


def size(kind: Kind, numel: int, count: int = 0) -> int:
    """Exact frame bytes: dense (count ignored), topk (count = k), int8 (count = segments)."""
    if kind == "dense":
        return HEADER_SIZE + 4 * numel
    if kind == "topk":
        return HEADER_SIZE + 8 * count
    if kind == "int8":
        return HEADER_SIZE + 8 * count + numel
    raise ValueError(f"unknown tensor frame kind {kind!r}")


def topk_count(numel: int, fraction: float) -> int:
    """k = ⌈fraction · numel⌉, at least 1 and at most numel."""
    return max(1, min(numel, math.ceil(fraction * numel)))


def _frame(kind: int, numel: int, count: int, payload: Sequence[bytes]) -> bytes:
    prefix = struct.pack("<2sBBII", MAGIC, VERSION, kind, numel, count)
    crc = zlib.crc32(prefix)
    for part in payload:
        crc = zlib.crc32(part, crc)
    return b"".join([prefix, struct.pack("<II", crc, 0), *payload])


def _cpu_f32(x: torch.Tensor) -> np.ndarray:
    if x.ndim != 1 or x.dtype != torch.float32:
        raise ValueError(f"tensor frames carry 1-D float32 vectors, got {tuple(x.shape)} {x.dtype}")
    return x.detach().cpu().contiguous().numpy().astype("<f4", copy=False)


def encode_dense(x: torch.Tensor) -> bytes:
    """x as raw little-endian fp32."""
    a = _cpu_f32(x)
    return _frame(DENSE, a.size, a.size, [memoryview(a).cast("B")])


def topk_select(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices ascending int64, values) of the k entries of x largest in magnitude."""
    idx = torch.topk(x.abs(), k, sorted=False).indices.sort().values
    return idx, x[idx]


def encode_topk(numel: int, idx: torch.Tensor, values: torch.Tensor) -> bytes:
    """A sparse vector of length numel: strictly increasing indices and their fp32 values."""
    i = idx.detach().cpu().numpy().astype("<u4")
    v = _cpu_f32(values)
    if i.size != v.size or i.size == 0:
        raise ValueError(f"topk frame needs k >= 1 matching indices/values, got {i.size} and {v.size}")
    return _frame(TOPK, numel, i.size, [i.tobytes(), v.tobytes()])


def quantize_int8(x: torch.Tensor, sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(scales f32 per segment, q int8 per entry): q = round(x / scale), scale = absmax / 127."""
    a = _cpu_f32(x)
    if sum(sizes) != a.size or not sizes or min(sizes) < 1:
        raise ValueError(f"int8 segments {list(sizes)[:4]}... must be >= 1 each and sum to {a.size}")
    scales = np.empty(len(sizes), dtype="<f4")
    q = np.empty(a.size, dtype=np.int8)
    off = 0
    for s, n in enumerate(sizes):
        seg = a[off : off + n]
        amax = float(np.abs(seg).max())
        scales[s] = np.float32(amax / 127.0) if amax > 0 else np.float32(0.0)
        if scales[s] > 0:
            q[off : off + n] = np.clip(np.rint(seg / scales[s]), -127, 127).astype(np.int8)
        else:
            q[off : off + n] = 0
        off += n
    return scales, q


def encode_int8(x: torch.Tensor, sizes: Sequence[int]) -> bytes:
    """x quantised to int8 with one absmax scale per segment (`sizes`: the tensors' numels)."""
    scales, q = quantize_int8(x, sizes)
    lens = np.asarray(sizes, dtype="<u4")
    return _frame(INT8, q.size, len(sizes), [scales.tobytes(), lens.tobytes(), q.tobytes()])


def read_header(frame: bytes | memoryview) -> tuple[int, int, int]:
    """(kind, numel, count) after checking magic, version, kind, length and CRC."""
    if len(frame) < HEADER_SIZE:
        raise WireError(f"tensor frame of {len(frame)} bytes is shorter than its {HEADER_SIZE}-byte header")
    magic, version, kind, numel, count, crc = HEAD.unpack_from(frame)
    if magic != MAGIC or version != VERSION:
        raise WireError(f"not a tensor frame (magic {magic!r}, version {version})")
    name = {v: k for k, v in KINDS.items()}.get(kind)
    if name is None:
        raise WireError(f"unknown tensor frame kind {kind}")
    if kind == INT8 and count < 1:
        raise WireError("int8 frame without segments")
    if kind == TOPK and not 1 <= count <= numel:
        raise WireError(f"topk frame with k = {count} of {numel} entries")
    if kind == DENSE and count != numel:
        raise WireError(f"dense frame with count {count} != numel {numel}")
    want = size(name, numel, count)  # type: ignore[arg-type]
    if len(frame) != want:
        raise WireError(f"{name} frame of {numel} entries is {len(frame)} bytes, expected {want}")
    view = memoryview(frame)
    if zlib.crc32(view[HEADER_SIZE:], zlib.crc32(view[:_PREFIX])) != crc:
        raise WireError(f"{name} frame fails its CRC")
    if struct.unpack_from("<I", frame, HEAD.size)[0] != 0:
        raise WireError(f"{name} frame has a non-zero reserved field")
    return kind, numel, count


def decode_topk(frame: bytes) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(numel, indices int64 ascending, values fp32) of a TOPK frame, on the CPU."""
    kind, numel, count = read_header(frame)
    if kind != TOPK:
        raise WireError(f"expected a topk frame, got kind {kind}")
    p = HEADER_SIZE
    idx = np.frombuffer(frame, dtype="<u4", count=count, offset=p).astype(np.int64)
    val = np.frombuffer(frame, dtype="<f4", count=count, offset=p + 4 * count).astype(np.float32)
    if count > 1 and not (np.diff(idx) > 0).all():
        raise WireError("topk frame indices are not strictly increasing")
    if idx[-1] >= numel:
        raise WireError(f"topk frame index {int(idx[-1])} is out of range for {numel} entries")
    if not np.isfinite(val).all():
        raise WireError("topk frame holds a non-finite value")
    return numel, torch.from_numpy(idx), torch.from_numpy(val)


def dense_view(frame: bytes) -> torch.Tensor:
    """A DENSE frame's vector as a read-only CPU tensor over the frame's own bytes (no copy;
    never write to it). The frame is checked (header, CRC) first."""
    kind, numel, _ = read_header(frame)
    if kind != DENSE:
        raise WireError(f"expected a dense frame, got kind {kind}")
    a = np.frombuffer(frame, dtype="<f4", count=numel, offset=HEADER_SIZE)
    with warnings.catch_warnings():  # torch warns that the buffer is read-only: it is, and stays so
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


def decode(frame: bytes, device: torch.device | str = "cpu") -> torch.Tensor:
    """The dense fp32 vector a frame stands for (top-k: zeros elsewhere; int8: q · scale)."""
    kind, numel, count = read_header(frame)
    p = HEADER_SIZE
    if kind == DENSE:
        a = np.frombuffer(frame, dtype="<f4", count=numel, offset=p).astype(np.float32)  # a copy
        return torch.from_numpy(a).to(device)
    if kind == TOPK:
        _, idx, val = decode_topk(frame)
        out = torch.zeros(numel, dtype=torch.float32)
        out[idx] = val
        return out.to(device)
    scales = np.frombuffer(frame, dtype="<f4", count=count, offset=p)
    lens = np.frombuffer(frame, dtype="<u4", count=count, offset=p + 4 * count).astype(np.int64)
    if int(lens.sum()) != numel or (lens < 1).any():
        raise WireError(f"int8 frame segments sum to {int(lens.sum())}, not {numel}")
    if not (np.isfinite(scales).all() and (scales >= 0).all()):
        raise WireError("int8 frame holds a negative or non-finite scale")
    q = np.frombuffer(frame, dtype=np.int8, count=numel, offset=p + 8 * count)
    out = q.astype(np.float32) * np.repeat(scales, lens)
    return torch.from_numpy(out).to(device)
