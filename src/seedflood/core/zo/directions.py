"""Perturbation directions z(seed) over a model's trainable matrices: the interface, and MeZO's.

Owns: which parameters train (`select_trainable`), the `Direction` interface (how the model is
evaluated at θ + s·z without touching θ, and how updates c·z are accumulated and folded into θ),
and the simplest family:

- `Gaussian` (MeZO): z ~ N(0, I) over every trainable parameter, drawn per parameter from a keyed
  CPU generator (bit-identical on any machine; moved to the model's device). Evaluating θ + s·z
  swaps each parameter's storage for a scratch tensor θ + s·z and swaps the untouched original
  back afterwards. Applying n messages costs O(n·d).

The low-rank family is seedflood.core.zo.subcge (`SubCGE`); seedflood.core.zo.family builds the one a
config names.

The precision floor on ε (`check_precision`, `MIN_EPS`) and `DirectionError` live in
seedflood.core.zo.precision, which imports no torch (the CLI preflight checks them).

Assumes: callers evaluate under torch.inference_mode / no_grad; trainable names are fixed for a
run; updates and forwards run on one thread.
"""

from __future__ import annotations

import contextlib
import fnmatch
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import nn

from seedflood.core.config import rng
from seedflood.core.zo.precision import DirectionError

StepUpdate = tuple[int, np.ndarray, np.ndarray]
"""One complete step for `Direction.apply_steps`: (step, seeds uint64 (n,), coefs float64 (n,)),
messages in canonical order (origin, k); coef is c in θ ← θ + c·z(seed)."""


def select_trainable(model: nn.Module, patterns: Sequence[str]) -> list[str]:
    """Names of 2-D parameters matching any fnmatch pattern, in the model's parameter order."""
    names = [
        name
        for name, p in model.named_parameters()
        if p.ndim == 2 and any(fnmatch.fnmatchcase(name, pat) for pat in patterns)
    ]
    if not names:
        raise DirectionError(f"no 2-D parameter matches zo.trainable={list(patterns)}")
    return names


class Direction(ABC):
    """A direction family bound to one model's trainable parameters."""

    def __init__(self, model: nn.Module, names: Sequence[str], run_seed: int) -> None:
        self.model = model
        self.names = list(names)
        self.run_seed = run_seed
        params = dict(model.named_parameters())
        self.params: list[nn.Parameter] = [params[n] for n in self.names]

    @property
    def numel(self) -> int:
        """d: the number of trainable scalars."""
        return sum(p.numel() for p in self.params)

    @abstractmethod
    def perturbed(self, seed: int, step: int, scale: float) -> contextlib.AbstractContextManager[None]:
        """Inside the context, forwards compute with θ + scale·z(seed); θ is never written."""

    @abstractmethod
    def accumulate(self, step: int, seed: int, coef: float) -> None:
        """Add coef·z(seed) (a message of `step`) to the pending update.

        Forwards between `accumulate` and `commit` are undefined (SubCGE already sees the pending
        core, Gaussian does not); the Applier never runs one there.
        """

    @abstractmethod
    def commit(self, step: int) -> None:
        """End of applying step `step`: fold pending updates into θ where the schedule says."""

    def apply_steps(self, steps: Sequence[StepUpdate]) -> None:
        """Apply consecutive steps, each `(step, seeds, coefs)` with its messages in canonical
        order (seeds uint64 (n,), coefs float64 (n,)): the same bits as `accumulate` for every
        message followed by `commit(step)` for every step, which is what this default does."""
        for step, seeds, coefs in steps:
            for seed, coef in zip(seeds.tolist(), coefs.tolist()):
                self.accumulate(step, seed, coef)
            self.commit(step)

    def apply_arrays(self, steps: np.ndarray, bounds: np.ndarray, seeds: np.ndarray, coefs: np.ndarray) -> None:
        """`apply_steps` of consecutive steps given as arrays: step steps[i]'s messages are
        seeds[bounds[i]:bounds[i+1]] with their coefs (bounds: len(steps) + 1 indices)."""
        b = bounds.tolist()
        self.apply_steps([(s, seeds[b[i] : b[i + 1]], coefs[b[i] : b[i + 1]]) for i, s in enumerate(steps.tolist())])

    def current(self) -> contextlib.AbstractContextManager[None]:
        """Forwards see the canonical state (including anything pending)."""
        return contextlib.nullcontext()

    def merge_all(self) -> None:
        """Fold everything pending into the parameters (before saving a plain model)."""

    def extra_state(self) -> dict[str, torch.Tensor]:
        """Canonical state beyond the parameters (hashed and checkpointed with them)."""
        return {}

    def effective_tensors(self) -> dict[str, torch.Tensor]:
        """Trainable tensors as the model computes with them (pending updates folded into
        copies; the canonical state is untouched), for exporting a plain model."""
        return {n: p.detach() for n, p in zip(self.names, self.params)}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what extra_state returned."""


class Gaussian(Direction):
    """MeZO's direction: z ~ N(0, I) over all trainable parameters, one keyed stream per tensor."""

    def __init__(self, model: nn.Module, names: Sequence[str], run_seed: int) -> None:
        super().__init__(model, names, run_seed)
        self._pending: list[torch.Tensor] | None = None  # fp32 Σ coef·z of the step being applied

    def z(self, seed: int, index: int) -> torch.Tensor:
        """The slice of z(seed) for trainable tensor `index`, fp32 on the parameter's device."""
        p = self.params[index]
        g = rng.torch_generator(rng.TAG_GAUSSIAN, seed, index)
        return torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.device)

    @contextlib.contextmanager
    def perturbed(self, seed: int, step: int, scale: float) -> Iterator[None]:
        originals = [p.data for p in self.params]
        try:
            for i, p in enumerate(self.params):
                p.data = (originals[i].float() + scale * self.z(seed, i)).to(originals[i].dtype)
            yield
        finally:
            for p, orig in zip(self.params, originals):
                p.data = orig  # the original storage was only read: no θ+εz−εz residue

    def accumulate(self, step: int, seed: int, coef: float) -> None:
        if self._pending is None:
            self._pending = [torch.zeros(p.shape, dtype=torch.float32, device=p.device) for p in self.params]
        for i, buf in enumerate(self._pending):
            buf.add_(self.z(seed, i), alpha=coef)

    def commit(self, step: int) -> None:
        if self._pending is None:
            return
        with torch.no_grad():
            for p, buf in zip(self.params, self._pending):
                p.data.copy_((p.data.float() + buf).to(p.dtype))
        self._pending = None
