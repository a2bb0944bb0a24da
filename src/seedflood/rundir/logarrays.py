"""The message log's frames decoded as arrays: numpy structured views over the record bytes.

Owns `Frames` (what `logrecords.scan_records` collects per whole record in its one pass: where
the frame's messages start, how many, in which layout) and `decode`: every collected frame's
messages into one `StepColumns` (seeds derived at once for v2: rng.derive_many), plus the index
of the first record whose messages break a rule `message.decode` or the scan enforces (layout
not the narrowest, messages not in strictly increasing (origin, k) order, a v1 message of
another step or with a non-zero reserved field). The exact reason is then taken from the
per-message decoder (logrecords.py), so both paths give the same error.

Assumes: the frames' headers, lengths and CRCs were checked in the scan; v2 log frames have
no step offsets (one step per frame).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from seedflood.core.config import rng
from seedflood.core.flood.columns import StepColumns
from seedflood.core.wire import message

V1_KEY = -1  # the layout key of a v1 frame (v2 frames: their layout byte)
_V1_DTYPE = np.dtype(
    [("origin", "<u4"), ("step", "<u4"), ("seed", "<u8"), ("scalar", "<f4"), ("k", "<u2"), ("reserved", "<u2")]
)
_INT = {1: "u1", 2: "<u2", 4: "<u4"}


@dataclass
class Frames:
    """Per whole record, in order: byte offset (in the scanned buffer) of its first message, its
    message count and layout key."""

    body: list[int] = field(default_factory=list)
    count: list[int] = field(default_factory=list)
    key: list[int] = field(default_factory=list)

    def add(self, body: int, count: int, key: int) -> None:
        self.body.append(body)
        self.count.append(count)
        self.key.append(key)


def _dtype(key: int) -> np.dtype:
    if key == V1_KEY:
        return _V1_DTYPE
    lay = message.Layout.of_byte(key)
    fields = [(name, _INT[w]) for name, w in (("origin", lay.origin), ("k", lay.k)) if w]
    return np.dtype(fields + [("scalar", "<f4")])


def _widths(v: np.ndarray) -> np.ndarray:
    """message.width of each value: 0, 1, 2 or 4 bytes."""
    return np.select([v == 0, v < 1 << 8, v < 1 << 16], [0, 1, 2], 4)


def decode(buf: bytes, frames: Frames, steps: np.ndarray, run_seed: int | None) -> tuple[StepColumns, int | None]:
    """(the columns of every frame, the first record breaking a per-message rule or None).
    `steps[i]`: record i's step; `run_seed`: a v2 log's (None: v1, seeds in the frames)."""
    R = len(frames.count)
    if R == 0:
        return StepColumns.empty(), None
    counts = np.asarray(frames.count, np.int64)
    bounds = np.zeros(R + 1, np.int64)
    np.cumsum(counts, out=bounds[1:])
    M = int(bounds[-1])
    origin, k = np.empty(M, np.int64), np.empty(M, np.int64)
    scalar, seed = np.empty(M, np.float32), np.empty(M, np.uint64)
    bad = np.zeros(R, bool)
    u8 = np.frombuffer(buf, np.uint8)
    keys = np.asarray(frames.key, np.int64)
    body = np.asarray(frames.body, np.int64)
    rec = np.repeat(np.arange(R), counts)  # record of each message
    within = np.arange(M) - bounds[rec]  # index of each message in its record
    for key in np.unique(keys).tolist():
        dt = _dtype(key)
        sel = keys == key
        whole = bool(sel.all())
        mine = slice(None) if whole else np.flatnonzero(sel[rec])  # messages of this layout
        offs = body[rec[mine]] + within[mine] * dt.itemsize
        rows = np.ascontiguousarray(u8[offs[:, None] + np.arange(dt.itemsize)]).view(dt).reshape(-1)
        names = dt.names or ()
        origin[mine] = rows["origin"] if "origin" in names else 0
        k[mine] = rows["k"] if "k" in names else 0
        scalar[mine] = rows["scalar"]
        if key == V1_KEY:
            seed[mine] = rows["seed"]
            wrong = (rows["reserved"] != 0) | (rows["step"] != steps[rec[mine]])
            bad[rec[mine][wrong]] = True
        else:  # the narrowest layout for its records (message.decode's rule)
            lay = message.Layout.of_byte(key)
            at = np.flatnonzero(sel)
            if whole:
                starts = bounds[:-1]
                widths_ok = (_widths(np.maximum.reduceat(origin, starts)) == lay.origin) & (
                    _widths(np.maximum.reduceat(k, starts)) == lay.k
                )
            else:  # records of several layouts (rare): one at a time
                widths_ok = np.array(
                    [
                        message.width(int(origin[a:b].max())) == lay.origin
                        and message.width(int(k[a:b].max())) == lay.k
                        for a, b in zip(bounds[at].tolist(), bounds[at + 1].tolist())
                    ],
                    bool,
                )
            bad[at[~widths_ok]] = True
    if run_seed is not None:
        seed[:] = rng.derive_many(run_seed, origin, steps[rec], k)
    # Strictly increasing (origin, k) inside each record: no repeated id, canonical order.
    ident = origin.astype(np.uint64) << np.uint64(32) | k.astype(np.uint64)
    rising = ident[1:] > ident[:-1]
    same_record = rec[1:] == rec[:-1]
    bad[rec[1:][same_record & ~rising]] = True
    first = int(np.argmax(bad)) if bad.any() else None
    return StepColumns(steps, bounds, origin, k, scalar, seed, seeded_by=run_seed), first
