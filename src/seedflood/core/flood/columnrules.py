"""The protocol's per-step rules over `StepColumns`: the check of complete steps and the update
coefficients, as array operations instead of a Python object per message.

Owns `first_bad` (the first record `Protocol.check_step` would reject, found without building
a message) and `coefficients` (`Protocol.coefficients` of every record at once, same float64
bits: the same products in the same order).

Assumes: the columns came from a validated log (logrecords.py): every record's messages are of
its step, in strictly increasing (origin, k) order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from seedflood.core.config import rng
from seedflood.core.flood.columns import StepColumns

if TYPE_CHECKING:
    from seedflood.core.flood.protocol import Protocol


def first_bad(protocol: Protocol, cols: StepColumns, members: Sequence[frozenset[int] | None]) -> int | None:
    """Index of the first record that `protocol.check_step(step, messages, members[i])` rejects,
    None when it accepts all. `members[i]` None: the N founders."""
    R = len(cols)
    if R == 0:
        return None
    steps, bounds = cols.record_steps, cols.record_bounds
    counts = np.diff(bounds)
    origin, k, scalar, seed = (cols.field(f) for f in ("origin", "k", "scalar", "seed"))
    rec = np.repeat(np.arange(R), counts)  # record of each message
    step_of = steps[rec]
    x = scalar.astype(np.float64)
    bad = (origin >= protocol.ids) | (k >= protocol.perturbations) | ~np.isfinite(x)
    bad |= np.abs(x) > protocol.max_scalar
    if cols.seeded_by != protocol.run_seed:  # seeds not derived with this run's seed: compare them
        bad |= rng.derive_many(protocol.run_seed, origin, step_of, k) != seed
    if protocol.stride:
        period = np.ones(max(int(origin.max()), max(o for o, _ in protocol.stride)) + 1, np.int64)
        for o, every in protocol.stride:
            period[o] = every
        bad |= step_of % period[origin] != 0
    firsts = [int(rec[np.argmax(bad)])] if bad.any() else []
    # Each record must hold exactly its due members' K messages: compare with the expected ids.
    K = protocol.perturbations
    groups: dict[frozenset[int] | None, list[int]] = {}
    for i, m in enumerate(members[:R]):
        groups.setdefault(m, []).append(i)
    for m, idx in groups.items():
        at = np.asarray(idx, dtype=np.int64)
        if protocol.stride:  # the expected origins depend on the step: one record at a time
            for i in idx:
                want = np.repeat(np.asarray(protocol.origins(int(steps[i]), m), np.int64), K)
                a, b = bounds[i], bounds[i + 1]
                if (
                    b - a != len(want)
                    or (origin[a:b] != want).any()
                    or (k[a:b] != np.tile(np.arange(K), len(want) // K)).any()
                ):
                    firsts.append(i)
                    break
            continue
        want_o = np.repeat(np.asarray(protocol.origins(0, m), np.int64), K)
        want_k = np.tile(np.arange(K, dtype=np.int64), len(want_o) // K)
        wrong = counts[at] != len(want_o)
        ok = at[~wrong]
        if len(ok) and len(want_o):
            pos = bounds[ok][:, None] + np.arange(len(want_o))[None, :]  # (records, N·K)
            wrong_ok = (origin[pos] != want_o).any(axis=1) | (k[pos] != want_k).any(axis=1)
            wrong[~wrong] = wrong_ok
        if wrong.any():
            firsts.append(int(at[np.argmax(wrong)]))
    return min(firsts) if firsts else None


def coefficients(protocol: Protocol, cols: StepColumns) -> np.ndarray:
    """float64 (M,): c of every message in θ ← θ + c·z(seed), record by record exactly
    `protocol.coefficients(messages)` (−lr(step)·w times the scalar, clamped first when the clip
    is on)."""
    steps, bounds = cols.record_steps, cols.record_bounds
    if protocol.schedule == "constant" and not protocol.warmup_steps and not (protocol.stride and protocol.mean):
        lr_w = np.full(len(steps), -protocol.lr_at(0) * protocol.weight_at(0))  # the same for every step
    else:
        lr_w = np.array([-protocol.lr_at(s) * protocol.weight_at(s) for s in steps.tolist()], dtype=np.float64)
    x = cols.field("scalar").astype(np.float64)
    if protocol.clip:
        x = x.copy()
        for i in range(len(steps)):
            a, b = int(bounds[i]), int(bounds[i + 1])
            if a == b:
                continue
            mags = np.sort(np.abs(x[a:b]))
            mid = (b - a) // 2  # statistics.median of the sorted magnitudes, as Protocol.clip_bound
            med = float(mags[mid]) if (b - a) % 2 else (float(mags[mid - 1]) + float(mags[mid])) / 2
            bound = protocol.clip * med
            if bound != math.inf:
                seg = x[a:b]
                over = np.abs(seg) > bound
                seg[over] = np.copysign(bound, seg[over])
    return np.repeat(lr_w, np.diff(bounds)) * x
