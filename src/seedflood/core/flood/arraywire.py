"""The wire side of `lockarrays.ArrayLockstep`: frame sizes, the receivers' checks, the real codec
where it must run.

Owns:
- `Frames`: per directed edge of one hop, what its frame holds (message count, largest origin,
  largest k, smallest and largest step) accumulated over the waves in flight, and `sizes`: the
  bytes the transport counts, by message.encode's rule (v2: header magic, version, layout, the
  count in its width, base step, crc, then per record the step offset, origin and k in the
  smallest of 0/1/2/4 bytes holding the frame's largest, and a float32; an empty frame is zero
  bytes. v1: 16-byte header and 24-byte records, an empty frame too), plus transport.HEADER.
- `accepted`: which of a wave's messages a receiver's `Limits` take (Limits.check, column by column).
- `exact`: the frames that hold a message `accepted` refused or an unusual one, in Lockstep's
  order (source, then neighbour), encoded and decoded with the real codec: the first bad one
  raises what Lockstep raises.
- `check_alike`: Lockstep's "holds other messages" error, where a decoded copy differs from its
  original (a seed the derivation does not give, a scalar that is not a float32).

Assumes: waves and tables as lockarrays.py and floodtables.py build them. Pure: numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from seedflood.core.flood.flooding import FloodError
from seedflood.core.flood.floodtables import HopPairs
from seedflood.core.flood.transport import HEADER
from seedflood.core.wire import message
from seedflood.core.wire.message import Limits

if TYPE_CHECKING:
    from seedflood.core.flood.lockarrays import ArrayLockstep, Wave

_NONE = np.iinfo(np.int64).max


def width(v: np.ndarray) -> np.ndarray:
    """message.width, elementwise, for values in 0..2**32-1."""
    return np.where(v == 0, 0, np.where(v < 1 << 8, 1, np.where(v < 1 << 16, 2, 4)))


@dataclass(eq=False)
class Frames:
    """One hop's frames, a column per directed edge (see the module doc)."""

    count: np.ndarray
    max_origin: np.ndarray
    max_k: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    @classmethod
    def empty(cls, edges: int) -> Frames:
        return cls(*(np.full(edges, v, dtype=np.int64) for v in (0, -1, -1, _NONE, -1)))

    def add(self, pairs: HopPairs, per_pair: np.ndarray, k_of_pair: np.ndarray, step: int) -> None:
        """The messages of one wave on each edge: `per_pair` of them from each pair's origin,
        the largest with k `k_of_pair`, all of `step`."""
        if not len(pairs.edge):
            return
        sent = per_pair > 0
        count = np.add.reduceat(per_pair, pairs.starts)
        top_origin = np.maximum.reduceat(np.where(sent, pairs.origin, -1), pairs.starts)
        top_k = np.maximum.reduceat(np.where(sent, k_of_pair, -1), pairs.starts)
        e = pairs.edges
        self.count[e] += count
        self.max_origin[e] = np.maximum(self.max_origin[e], top_origin)
        self.max_k[e] = np.maximum(self.max_k[e], top_k)
        e = e[count > 0]
        self.lo[e] = np.minimum(self.lo[e], step)
        self.hi[e] = np.maximum(self.hi[e], step)

    def sizes(self, version: int) -> np.ndarray:
        """Bytes per edge: transport.HEADER + message.encode(the frame's messages, version)."""
        c = self.count
        if version == message.VERSION_1:
            return HEADER + message.HEADER_SIZE + message.RECORD_SIZE * c
        some = c > 0
        span = np.where(some, self.hi - self.lo, 0)
        record = width(span) + width(np.maximum(self.max_origin, 0)) + width(np.maximum(self.max_k, 0)) + 4
        frame = message.V2_PREFIX + width(c) + 8 + c * record
        return HEADER + np.where(some, frame, 0)


def _derived_seeds(w: Wave, limits: Limits) -> np.ndarray | None:
    """limits.seed_of of each message of `w` (None without one), cached on the wave."""
    derive = limits.seed_of
    if derive is None:
        return None
    held = w.checked.get("seed")
    if held is None or held[0] != derive:
        seeds = np.array([derive(m.origin, m.step, m.k) == m.seed for m in w.msgs], dtype=bool).reshape(len(w.msgs))
        held = w.checked["seed"] = (derive, seeds)
    return held[1]


def _due(w: Wave, limits: Limits) -> np.ndarray | None:
    due = limits.due
    if due is None:
        return None
    held = w.checked.get("due")
    if held is None or held[0] != due:
        held = w.checked["due"] = (due, np.array([due(m.origin, m.step) for m in w.msgs], dtype=bool).reshape(-1))
    return held[1]


def accepted(w: Wave, limits: Limits, version: int) -> np.ndarray:
    """Per message of `w`: Limits.check passes for its decoded copy (v2: the seed is derived; v1:
    it travels and is checked; a v2 frame without `seed_of` cannot be decoded at all)."""
    if version == message.VERSION_2 and limits.seed_of is None:
        return np.zeros(len(w.msgs), dtype=bool)
    with np.errstate(over="ignore", invalid="ignore"):
        x = w.scalar.astype(np.float32).astype(np.float64)
        ok = np.isfinite(x) & ~(np.abs(x) > limits.max_scalar)
    ok &= (w.origin >= 0) & (w.origin < limits.n_origins) & (w.k >= 0) & (w.k < limits.max_k)
    if not limits.min_step <= w.step <= limits.max_step:
        ok[:] = False
    due = _due(w, limits)
    if due is not None:
        ok &= due
    if version == message.VERSION_1:
        seeds = _derived_seeds(w, limits)
        if seeds is not None:
            ok &= seeds
    return ok


def exact(
    lock: ArrayLockstep,
    live: Sequence[Wave],
    suspects: Sequence[tuple[Wave, np.ndarray]],
    limits: Limits | None,
    t: int,
) -> None:
    """Run the real codec over every frame of this hop that holds a suspect message, in
    Lockstep's order; raises what Lockstep raises at the first bad one (nothing if none is)."""
    tab = lock.tables
    edges: set[int] = set()
    for w, bad in suspects:
        pairs = tab.hops[w.r]
        edges.update(pairs.edge[np.isin(pairs.origin, w.origin[bad])].tolist())
    for e in sorted(edges):
        items = []
        for w in live:
            pairs = tab.hops[w.r]
            origins = set(pairs.origin[pairs.edge == e].tolist())
            items += [m for m in w.msgs if m.origin in origins]
        frame = message.encode(sorted(items), version=lock.version)
        if limits is not None:
            try:
                message.decode(frame, limits)
            except message.FrameError as ex:
                src, dst = int(tab.src[e]), int(tab.dst[e])
                raise message.FrameError(f"node {dst}: bad frame from node {src} at step {t}: {ex}") from None


def check_alike(lock: ArrayLockstep, s: int, waves: Sequence[Wave], keep: set[int]) -> None:
    """Lockstep's check that every node holds step `s` alike: node u holds its own messages as
    originated and every other as decoded, so u differs from node 0 where a message of origin 0
    or u changes in decoding (v2: a seed not derived; both versions: a scalar not a float32)."""
    assert lock.wire is not None
    limits = lock.wire(s)
    changed: list[int] = []
    for w in waves:
        if w.restored:
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            same = w.scalar.astype(np.float32).astype(np.float64) == w.scalar
        if lock.version == message.VERSION_2:
            seeds = _derived_seeds(w, limits)
            if seeds is not None:
                same &= seeds
        changed += [o for o in w.origin[~same].tolist() if o in keep]
    if changed:
        node = 1 if 0 in changed else min(changed)
        raise FloodError(f"lockstep: node {node} holds other messages of step {s} than node 0")
