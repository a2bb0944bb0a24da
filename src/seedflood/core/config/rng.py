"""Every random choice of a run, derived from explicit integer keys; never a global RNG.

Owns:
- `derive(run_seed, origin, step, k)`: the 64-bit seed of one message (`derive_many`: of arrays
  of messages at once, same bits);
- `hash_u64(key, counters)`: a counter-based integer hash (SplitMix64 finaliser over a keyed
  counter), vectorised with numpy uint64 so it gives the same bits on any machine and device
  (`hash_u64_many_torch`: the same bits from torch int64 ops, which AVX2 vectorises: ~4x numpy);
- `generator(*keys)`: a numpy Generator (PCG64) for CPU-side draws such as batch sampling;
- `orthonormal_basis(run_seed, epoch, matrix, rows, rank)`: the SubCGE basis, drawn in float64 on
  the CPU from a fixed torch generator, orthonormalised by QR with a sign convention and rounded
  to float32. The rounding makes last-bit differences between LAPACK builds vanish in all but
  astronomically rare cases, so clients on different machines agree on the basis.

Assumes: keys are non-negative Python ints below 2**64.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where a basis or generator is drawn: a preflight never loads it
    import torch

MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: SplitMix64's increment

# Domain tags keep independent streams apart (a message seed never equals a basis seed).
TAG_MESSAGE = 0x5EED_F100D
TAG_BASIS = 0xBA515
TAG_BATCH = 0xBA7C4
TAG_GAUSSIAN = 0x6A055


def _mix(x: int) -> int:
    """SplitMix64 finaliser on a Python int (bijective on 64 bits)."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def combine(*keys: int) -> int:
    """Hash a tuple of non-negative ints into one 64-bit value (order-sensitive)."""
    h = 0
    for key in keys:
        if key < 0:
            raise ValueError(f"rng keys must be non-negative, got {key}")
        h = _mix(h ^ _mix((key + _GOLDEN) & MASK64))
        h = (h + _GOLDEN) & MASK64
    return h


@functools.lru_cache(maxsize=64)
def _message_prefix(run_seed: int) -> int:
    """`combine`'s state after (TAG_MESSAGE, run_seed): the part of every message seed of a run
    that does not depend on the message."""
    return combine(TAG_MESSAGE, run_seed)


@functools.lru_cache(maxsize=1 << 12)
def _key_hash(key: int) -> int:
    """`combine`'s hash of one key (origins and k repeat in every step; steps in a window)."""
    if key < 0:
        raise ValueError(f"rng keys must be non-negative, got {key}")
    return _mix((key + _GOLDEN) & MASK64)


@functools.lru_cache(maxsize=1 << 16)
def derive(run_seed: int, origin: int, step: int, k: int = 0) -> int:
    """The seed of message (origin, step, k) in run `run_seed`: a 64-bit integer, exactly
    `combine(TAG_MESSAGE, run_seed, origin, step, k)` (tested), continued from the run's cached
    prefix with cached key hashes: 3 mixes instead of 10. Cached too: a message's seed is derived
    where it is made, where each frame holding it is decoded and where its step is checked, in
    every client of a process; 2**16 entries (~10 MB at most) cover a few steps of 128 clients ×
    16 perturbations. A rejoin replays mostly misses: this is its hot path."""
    h = _message_prefix(run_seed)
    for key in (origin, step, k):
        h = (_mix(h ^ _key_hash(key)) + _GOLDEN) & MASK64
    return h


def derive_many(run_seed: int, origin: np.ndarray, step: np.ndarray, k: np.ndarray) -> np.ndarray:
    """`derive(run_seed, origin[i], step[i], k[i])` for every i, as uint64 (same bits, tested);
    the keys are non-negative integer arrays of one shape."""
    h = np.full(np.shape(origin), _message_prefix(run_seed), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for key in (origin, step, k):
            h = _mix_array(h ^ _mix_array(np.asarray(key, dtype=np.uint64) + np.uint64(_GOLDEN))) + np.uint64(_GOLDEN)
    return h


def _mix_array(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (`_mix`) elementwise on a uint64 array (wraps mod 2**64)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def hash_u64(key: int, counters: np.ndarray) -> np.ndarray:
    """Counter-based hash: uint64 array of SplitMix64(key, counter) for each counter.

    Shape of the result equals counters.shape. Integer arithmetic only (wraps mod 2**64), so the
    output is the same on every platform.
    """
    c = np.asarray(counters, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _mix_array(c * np.uint64(_GOLDEN) + np.uint64(_mix(key)))


def hash_u64_many(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """`hash_u64(key, counters)` for every key at once: shape keys.shape + counters.shape."""
    k = _mix_array(np.asarray(keys, dtype=np.uint64))
    c = np.asarray(counters, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _mix_array(c[None] * np.uint64(_GOLDEN) + k[(...,) + (None,) * c.ndim])


def _signed(v: int) -> int:
    """The int64 with the bits of the uint64 `v`."""
    return v - (1 << 64) if v >= 1 << 63 else v


def hash_u64_many_torch(keys: np.ndarray, counters: np.ndarray) -> torch.Tensor:
    """`hash_u64_many(keys, counters)` as an int64 tensor holding the same 64 bits: shape
    (len(keys), counters.size), counters flattened. Integer ops wrap alike in int64 and uint64;
    the logical right shifts are arithmetic shifts masked to the bits a logical one keeps."""
    import torch

    x = torch.from_numpy(_mix_array(np.asarray(keys, dtype=np.uint64)).view(np.int64))[:, None]
    c = torch.from_numpy(np.asarray(counters, dtype=np.uint64).reshape(-1).view(np.int64))
    x = x + c[None, :] * _signed(_GOLDEN)  # (n, C)
    t = torch.empty_like(x)
    for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None)):
        torch.bitwise_right_shift(x, shift, out=t)
        t.bitwise_and_((1 << (64 - shift)) - 1)
        x.bitwise_xor_(t)
        if mul is not None:
            x.mul_(_signed(mul))
    return x


def generator(*keys: int) -> np.random.Generator:
    """A numpy Generator seeded from explicit keys (for CPU draws: batches, data splits)."""
    return np.random.Generator(np.random.PCG64(combine(*keys)))


def torch_generator(*keys: int) -> torch.Generator:
    """A CPU torch Generator seeded from explicit keys (fixed algorithm: Mersenne Twister)."""
    import torch

    g = torch.Generator(device="cpu")
    g.manual_seed(combine(*keys) & ((1 << 63) - 1))
    return g


def orthonormal_basis(run_seed: int, epoch: int, matrix: int, rows: int, rank: int) -> torch.Tensor:
    """A rows×rank float32 CPU tensor with orthonormal columns, fixed by (run_seed, epoch, matrix).

    Drawn as a float64 Gaussian from a keyed CPU generator, orthonormalised with QR, each column's
    sign fixed so the diagonal of R is positive (QR is unique up to those signs).
    """
    if rank > rows:
        raise ValueError(f"subspace rank {rank} exceeds matrix dimension {rows}")
    import torch

    g = torch_generator(TAG_BASIS, run_seed, epoch, matrix, rows)
    a = torch.randn(rows, rank, generator=g, dtype=torch.float64)
    q, r = torch.linalg.qr(a, mode="reduced")
    signs = torch.sign(torch.diagonal(r))
    signs[signs == 0] = 1.0
    return (q * signs).to(torch.float32).contiguous()
