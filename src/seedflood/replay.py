"""Canonical-order application of complete steps, the lr schedule, and state hashing.

Owns: the update rule θ ← θ − lr(step)·w·scalar·z(seed) applied step by step in canonical order
(step, origin, k); lr(step) as a pure function of the step and the config; rebuilding a model from
its base weights plus a message log; and the hash that proves two processes hold the same bits.

Assumes: the caller hands steps in increasing order, each with all of its messages (complete).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn

from seedflood.config import ZOConfig
from seedflood.directions import Direction
from seedflood.message import Message


class ReplayError(ValueError):
    """A log or a step cannot be applied (out of order, duplicated, wrong step)."""


def lr_at(step: int, zo: ZOConfig, total_steps: int) -> float:
    """Learning rate of `step` (0-based): linear warmup, then constant / linear decay / cosine."""
    if zo.warmup_steps and step < zo.warmup_steps:
        return zo.lr * (step + 1) / zo.warmup_steps
    if zo.schedule == "constant":
        return zo.lr
    span = max(1, total_steps - zo.warmup_steps)
    frac = min(1.0, (step - zo.warmup_steps) / span)
    if zo.schedule == "linear":
        return zo.lr * (1.0 - frac)
    return zo.lr * 0.5 * (1.0 + math.cos(math.pi * frac))


class Applier:
    """Applies complete steps to a direction's model in canonical order; remembers the last step."""

    def __init__(self, direction: Direction, zo: ZOConfig, total_steps: int, n_origins: int) -> None:
        self.direction = direction
        self.zo = zo
        self.total_steps = total_steps
        self.weight = 1.0 if zo.aggregate == "sum" else 1.0 / n_origins  # w in DESIGN.md §1
        self.last_step = -1

    def apply(self, step: int, messages: Sequence[Message]) -> None:
        if step != self.last_step + 1:
            raise ReplayError(f"step {step} applied out of order (last applied {self.last_step})")
        lr = lr_at(step, self.zo, self.total_steps)
        for m in sorted(messages):
            if m.step != step:
                raise ReplayError(f"message {m.id} handed in with step {step}")
            self.direction.accumulate(step, m.seed, -lr * self.weight * m.scalar)
        self.direction.commit(step)
        self.last_step = step

    def apply_all(self, steps: Iterable[tuple[int, Sequence[Message]]], upto: int | None = None) -> int:
        """Apply (step, messages) pairs in order, stopping after `upto`; returns steps applied."""
        n = 0
        for step, msgs in steps:
            if upto is not None and step > upto:
                break
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
