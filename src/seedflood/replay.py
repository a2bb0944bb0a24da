"""Canonical-order application of complete steps, and state hashing.

Owns: applying complete steps in canonical order (step, origin, k) with the update rule of the
run's `Protocol` (θ ← θ − lr(step)·w·scalar·z(seed)), and the hash that proves two processes
hold the same bits.

Assumes: the caller hands steps in increasing order, each with all of its messages (complete).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn

from seedflood.directions import Direction
from seedflood.message import Message
from seedflood.protocol import Protocol


class ReplayError(ValueError):
    """A log or a step cannot be applied (out of order, duplicated, wrong step)."""


class Applier:
    """Applies complete steps to a direction's model in canonical order; remembers the last step.

    The update of each message is θ ← θ + c·z(seed) with c = protocol.coefficient(m)
    (−lr(step)·w·scalar), accumulated in canonical order (step, origin, k) and committed per step.
    """

    def __init__(self, direction: Direction, protocol: Protocol) -> None:
        self.direction = direction
        self.protocol = protocol
        self.last_step = -1

    def apply(self, step: int, messages: Sequence[Message]) -> None:
        if step != self.last_step + 1:
            raise ReplayError(f"step {step} applied out of order (last applied {self.last_step})")
        for m in sorted(messages):
            if m.step != step:
                raise ReplayError(f"message {m.id} handed in with step {step}")
            self.direction.accumulate(step, m.seed, self.protocol.coefficient(m))
        self.direction.commit(step)
        self.last_step = step

    def apply_all(self, steps: Iterable[tuple[int, Sequence[Message]]]) -> int:
        """Apply (step, messages) pairs in order; returns the number of steps applied."""
        n = 0
        for step, msgs in steps:
            self.apply(step, msgs)
            n += 1
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
