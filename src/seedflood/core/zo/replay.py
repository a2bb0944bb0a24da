"""Canonical-order application of complete steps, and state hashing.

Owns: applying complete steps in canonical order (step, origin, k) with the update rule of the
run's `Protocol` (θ ← θ − lr(step)·w·scalar·z(seed), with its optional scalar clip), and the hash
that proves two processes hold the same bits.

Assumes: the caller hands steps in increasing order, each with all of its messages (complete).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from seedflood.core.flood import columnrules
from seedflood.core.flood.columns import StepColumns
from seedflood.core.flood.protocol import Protocol
from seedflood.core.wire.message import Message
from seedflood.core.zo.directions import Direction, StepUpdate


class ReplayError(ValueError):
    """A log or a step cannot be applied (out of order, duplicated, wrong step)."""


class Applier:
    """Applies complete steps to a direction's model in canonical order; remembers the last step.

    The update of each message is θ ← θ + c·z(seed) with c from protocol.coefficients (per step:
    −lr(step)·w·scalar, the scalar clamped first when zo.clip is set), accumulated in canonical
    order (step, origin, k) and committed per step.
    Steps go to `Direction.apply_steps` in batches of up to BATCH_MESSAGES messages (SubCGE
    vectorises a batch; the bits are those of one accumulate per message and one commit per step).
    """

    BATCH_MESSAGES = 1 << 15  # bounds the seeds/coefs arrays held at once (~0.5 MB)

    def __init__(self, direction: Direction, protocol: Protocol) -> None:
        self.direction = direction
        self.protocol = protocol
        self.last_step = -1
        self.last_messages: Sequence[Message] = ()
        """The messages of `last_step` (what every client holds alike: the audit draw's basis)."""

    def apply(self, step: int, messages: Sequence[Message]) -> None:
        self.apply_all([(step, messages)])

    def _prepare(self, step: int, messages: Sequence[Message], last: int) -> StepUpdate:
        """(step, seeds, coefs) in canonical order, after checking that `step` follows `last`."""
        if step != last + 1:
            raise ReplayError(f"step {step} applied out of order (last applied {last})")
        ordered = sorted(messages)
        for m in ordered:
            if m.step != step:
                raise ReplayError(f"message {m.id} handed in with step {step}")
        seeds = np.fromiter((m.seed for m in ordered), dtype=np.uint64, count=len(ordered))
        coefs = np.array(self.protocol.coefficients(ordered), dtype=np.float64)
        return step, seeds, coefs

    def apply_all(self, steps: Iterable[tuple[int, Sequence[Message]]]) -> int:
        """Apply (step, messages) pairs in order; returns the number of steps applied. A bad step
        raises ReplayError after every step before it has been applied (as one by one would).
        `StepColumns` (a log read as arrays) are applied without building their messages."""
        if isinstance(steps, StepColumns):
            return self._apply_columns(steps)
        n = 0
        batch: list[StepUpdate] = []
        held = 0
        last: Sequence[Message] = ()

        def flush() -> None:
            nonlocal batch, held
            todo, batch, held = batch, [], 0  # taken first: a failing apply is never retried
            if todo:
                self.direction.apply_steps(todo)
                self.last_step, self.last_messages = todo[-1][0], last

        try:
            for step, msgs in steps:
                batch.append(self._prepare(step, msgs, batch[-1][0] if batch else self.last_step))
                last = msgs
                held += len(msgs)
                n += 1
                if held >= self.BATCH_MESSAGES:
                    flush()
        finally:
            flush()
        return n

    def _apply_columns(self, cols: StepColumns) -> int:
        """`apply_all` of validated columns (each record's messages of its step, in canonical
        order): coefficients and seeds as arrays, the same StepUpdates as `_prepare` makes."""
        want = self.last_step + 1 + np.arange(len(cols))
        out_of_order = np.flatnonzero(cols.record_steps != want)
        n = int(out_of_order[0]) if len(out_of_order) else len(cols)
        steps = cols.record_steps[:n].tolist()
        steps = cols.record_steps[:n]
        bounds = cols.record_bounds[: n + 1]
        seeds = cols[:n].field("seed")
        coefs = columnrules.coefficients(self.protocol, cols[:n])
        i = 0
        while i < n:  # batches of at least BATCH_MESSAGES messages, as apply_all's
            j = min(n, max(i + 1, int(np.searchsorted(bounds, bounds[i] + self.BATCH_MESSAGES))))
            self.direction.apply_arrays(steps[i:j], bounds[i : j + 1], seeds, coefs)
            self.last_step, self.last_messages = int(steps[j - 1]), cols.messages(j - 1)
            i = j
        if n < len(cols):
            raise ReplayError(f"step {int(cols.record_steps[n])} applied out of order (last applied {self.last_step})")
        return n


def tensors_hash(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over tensors in sorted name order: per tensor `name|dtype|shape`, then its raw bytes
    (so bf16 and fp32 copies of the same values hash differently)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # a view, no copy
    return h.hexdigest()


def state_hash(model: nn.Module, direction: Direction | None = None) -> str:
    """The canonical state's hash: every parameter and buffer plus pending direction state."""
    tensors = dict(model.state_dict())
    if direction is not None:
        tensors.update(direction.extra_state())
    return tensors_hash(tensors)
