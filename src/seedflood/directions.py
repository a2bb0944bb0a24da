"""Perturbation directions z(seed) over a model's trainable matrices, behind one interface.

Owns: which parameters train, how a seed becomes a direction, how the model is evaluated at
θ + s·z without touching θ, and how updates c·z are accumulated and folded into θ.

- `Gaussian` (MeZO): z ~ N(0, I) over every trainable parameter, drawn per parameter from a keyed
  CPU generator (bit-identical on any machine; moved to the model's device). Evaluating θ + s·z
  swaps each parameter's storage for a scratch tensor θ + s·z and swaps the untouched original
  back afterwards. Applying n messages costs O(n·d).
- `SubCGE` (docs/design.md §3): per trainable matrix W (m×k, an nn.Linear weight) a basis U (m×r),
  V (k×r) with orthonormal columns, redrawn every `refresh` steps (an epoch) from
  (run seed, epoch, matrix index). A seed picks per matrix one core coordinate (a, b) and a sign σ
  with the counter-based hash; z restricted to W is σ·u_a·v_bᵀ. Evaluating θ + s·z adds
  s·σ·(x·v_b)·u_aᵀ to the layer's output in a forward hook (O(tokens·(m+k)), nothing materialised).
  Applying a message is one scalar add per matrix into an r×r accumulator S; W ← W + U·S·Vᵀ
  (O(r·d)) at every `merge_every`-th step end and always at an epoch's last step. While S is
  non-zero, forwards add x·V·Sᵀ·Uᵀ so the model always computes with W + U·S·Vᵀ.

Exactness: the canonical parameters are never written during a perturbed forward, accumulation
is fp32 in canonical order, and merges happen at steps fixed by the config, so two processes that
apply the same messages hold the same bits (same hardware and software).

Precision (`check_precision`, called by `build` and the CLI preflight): a SubCGE perturbation adds
ε·σ·(x·v_b)·u_a to a layer's output, entries about ε/√m of the output's scale; in bfloat16 or
float16 that is below the output's rounding unless ε is large, so the two-point scalar measures
rounding noise, not the direction. Keeping the perturbation in fp32 does not help (every layer's
output is rounded to the model dtype again), so too small an ε is refused, with the smallest
ε at which reduced-precision scalars tracked fp32 ones on the tiny model and on SmolLM2-135M.

Assumes: callers evaluate under torch.inference_mode / no_grad; trainable names are fixed for a run.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from seedflood import rng
from seedflood.config import SubspaceConfig, ZOConfig

log = logging.getLogger(__name__)


class DirectionError(ValueError):
    """The model does not fit the chosen direction family (one line, names the parameter)."""


# Smallest zo.eps per (direction, model dtype) at which two-point scalars computed in that dtype
# tracked float32 ones on the same seeds and batch (tiny model and SmolLM2-135M on rt, batch 8,
# 16 seeds, CPU). Relative error ‖s_dtype − s_fp32‖ / ‖s_fp32‖ at the same ε:
#   subcge bfloat16: SmolLM2 0.98 at ε=0.3, 0.31 at ε=1 (all signs agree), 0.09 at ε=3;
#                    tiny 0.13 at 0.1, 0.05 at 0.3, 0.02 at 1
#   subcge float16:  SmolLM2 (8 seeds) 0.32 at ε=0.1, 0.08 at ε=0.3; tiny 0.01 at 0.1, 0.006 at 0.3
# Below these the error grows like 1/ε (SmolLM2 bfloat16 at the default ε=1e-3: 280). A large ε
# also moves the estimate away from the derivative (float32 at ε=1 vs ε=0.01 on SmolLM2: 0.35),
# so for SmolLM2 bfloat16 ε=1 is the least bad choice, not a faithful one: prefer float32.
MIN_EPS: dict[tuple[str, str], float] = {
    ("subcge", "bfloat16"): 1.0,
    ("subcge", "float16"): 0.3,
}


def check_precision(zo: ZOConfig, dtype: str) -> None:
    """Raise DirectionError (one line) when zo.eps is too small for `dtype` ("float32",
    "bfloat16", "float16"; a torch dtype's name) to resolve the direction's perturbation."""
    dtype = dtype.removeprefix("torch.")
    need = MIN_EPS.get((zo.direction, dtype))
    if need is not None and zo.eps < need:
        raise DirectionError(
            f"zo.eps={zo.eps:g} is too small for zo.direction={zo.direction} in model.dtype={dtype}: "
            f"the perturbation is below {dtype} rounding and the scalars would be noise; "
            f"use zo.eps >= {need:g} or model.dtype=float32"
        )


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


@dataclass
class _Basis:
    epoch: int
    u: list[torch.Tensor]  # per matrix: m×r_j, on the parameter's device and dtype float32
    v: list[torch.Tensor]  # per matrix: k×r_j


class SubCGE(Direction):
    """Canonical coordinates of a shared low-rank subspace per matrix (docs/design.md §3)."""

    def __init__(self, model: nn.Module, names: Sequence[str], run_seed: int, cfg: SubspaceConfig) -> None:
        super().__init__(model, names, run_seed)
        self.cfg = cfg
        self.modules: list[nn.Linear] = []
        for name in self.names:
            owner = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            if not isinstance(owner, nn.Linear) or not name.endswith(".weight"):
                raise DirectionError(
                    f"subcge needs nn.Linear weights, but {name} belongs to {type(owner).__name__}: "
                    "use zo.direction=gaussian or narrow zo.trainable"
                )
            self.modules.append(owner)
        # Effective rank per matrix: r_j = min(r, m, k); S is padded to r×r.
        self.ranks = np.array([min(cfg.rank, *p.shape) for p in self.params], dtype=np.int64)
        r = cfg.rank
        self.S = torch.zeros(len(self.params), r, r, dtype=torch.float32)  # pending core, CPU
        self.S_epoch: int | None = None  # epoch the pending S belongs to (None = nothing pending)
        self._bases: dict[int, _Basis] = {}
        self._counters = np.arange(3 * len(self.params), dtype=np.uint64).reshape(-1, 3)

    # -- basis and coordinates -------------------------------------------------------------------
    def epoch(self, step: int) -> int:
        return step // self.cfg.refresh

    def basis(self, epoch: int) -> _Basis:
        """U, V of every matrix for `epoch`, generated once on the CPU and cached (two epochs)."""
        b = self._bases.get(epoch)
        if b is None:
            us, vs = [], []
            for j, p in enumerate(self.params):
                m, k = p.shape
                r = int(self.ranks[j])
                us.append(rng.orthonormal_basis(self.run_seed, epoch, 2 * j, m, r).to(p.device))
                vs.append(rng.orthonormal_basis(self.run_seed, epoch, 2 * j + 1, k, r).to(p.device))
            b = _Basis(epoch, us, vs)
            self._bases[epoch] = b
            for old in [e for e in self._bases if e < epoch - 1]:
                del self._bases[old]
        return b

    def coordinates(self, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per matrix j: row a_j, column b_j of the core (both < r_j) and sign σ_j ∈ {−1, +1}."""
        h = rng.hash_u64(seed, self._counters)  # (J, 3) uint64
        a = (h[:, 0] % self.ranks.astype(np.uint64)).astype(np.int64)
        b = (h[:, 1] % self.ranks.astype(np.uint64)).astype(np.int64)
        sign = np.where(h[:, 2] & np.uint64(1), 1.0, -1.0)
        return a, b, sign

    # -- forwards --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _hooks(self, seed: int | None, step: int, scale: float) -> Iterator[None]:
        pending = self.S_epoch is not None
        if seed is None and not pending:
            yield
            return
        pb = self.basis(self.S_epoch) if pending else None
        if seed is not None:
            pert = self.basis(self.epoch(step))
            a, b, sign = self.coordinates(seed)
        handles = []

        def make_hook(j: int):
            # Shapes: x (..., k), output (..., m). Low-rank terms only; W itself is never written.
            S = self.S[j].to(self.params[j].device) if pending else None
            if seed is not None:
                u = pert.u[j][:, a[j]] * float(scale * sign[j])  # (m,)
                v = pert.v[j][:, b[j]]  # (k,)

            def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
                x = inputs[0]
                if S is not None:
                    r = int(self.ranks[j])
                    out = out + ((x @ pb.v[j].to(x.dtype)) @ S[:r, :r].T.to(x.dtype)) @ pb.u[j].T.to(x.dtype)
                if seed is not None:
                    # out (…, m) += (x·v_b) ⊗ (s·σ·u_a): one in-place rank-1 update, no temporaries
                    # of the output's size (the output is a fresh contiguous tensor of this layer).
                    flat = out.view(-1, out.shape[-1])
                    flat.addr_((x @ v.to(x.dtype)).reshape(-1), u.to(x.dtype))
                return out

            return hook

        try:
            for j, mod in enumerate(self.modules):
                handles.append(mod.register_forward_hook(make_hook(j)))
            yield
        finally:
            for h in handles:
                h.remove()

    def perturbed(self, seed: int, step: int, scale: float) -> contextlib.AbstractContextManager[None]:
        return self._hooks(seed, step, scale)

    def current(self) -> contextlib.AbstractContextManager[None]:
        return self._hooks(None, 0, 0.0)

    # -- updates ---------------------------------------------------------------------------------
    def accumulate(self, step: int, seed: int, coef: float) -> None:
        epoch = self.epoch(step)
        if self.S_epoch is not None and self.S_epoch != epoch:
            raise DirectionError(f"pending core of epoch {self.S_epoch} was not merged before epoch {epoch}")
        self.S_epoch = epoch
        a, b, sign = self.coordinates(seed)
        j = torch.arange(len(self.params))
        # One fp32 add per matrix; (j, a_j, b_j) are distinct within a message, so this is exact.
        vals = torch.from_numpy(sign).to(torch.float32) * torch.tensor(coef, dtype=torch.float32)
        self.S[j, torch.from_numpy(a), torch.from_numpy(b)] += vals

    def commit(self, step: int) -> None:
        last_of_epoch = (step + 1) % self.cfg.refresh == 0
        if self.S_epoch is not None and (last_of_epoch or (step + 1) % self.cfg.merge_every == 0):
            self.merge_all()

    def _delta_factors(self, j: int, bs: _Basis) -> tuple[torch.Tensor, torch.Tensor] | None:
        """U·S·Vᵀ of matrix j as (U_A·S_AB) (m×|B|) and V_B (k×|B|), restricted to the rows A and
        columns B of S that hold anything: n messages touch at most n of each, so a step with few
        messages merges at rank ≤ n instead of r (above r/2 the full factors are used as they are).
        The choice is a function of S alone, so every client makes the same one. None when S_j = 0."""
        r = int(self.ranks[j])
        S = self.S[j, :r, :r]
        rows = torch.nonzero(S.any(dim=1)).flatten()
        if rows.numel() == 0:
            return None
        cols = torch.nonzero(S.any(dim=0)).flatten()
        dev = self.params[j].device
        if 2 * max(rows.numel(), cols.numel()) > r:  # dense enough: gathering would cost more
            return bs.u[j] @ S.to(dev), bs.v[j]
        core = S[rows][:, cols].to(dev)
        rows, cols = rows.to(dev), cols.to(dev)
        return bs.u[j][:, rows] @ core, bs.v[j][:, cols]

    def merge_all(self) -> None:
        """W ← W + U·S·Vᵀ for every matrix (fp32, fixed order), then S ← 0. O(r·d) at most."""
        if self.S_epoch is None:
            return
        bs = self.basis(self.S_epoch)
        with torch.no_grad():
            for j, p in enumerate(self.params):
                f = self._delta_factors(j, bs)
                if f is None:
                    continue
                if p.dtype == torch.float32:
                    p.data.addmm_(f[0], f[1].T)  # in place: no m×k temporary
                else:
                    p.data.copy_(torch.addmm(p.data.float(), f[0], f[1].T).to(p.dtype))
        self.S.zero_()
        self.S_epoch = None

    def effective_tensors(self) -> dict[str, torch.Tensor]:
        if self.S_epoch is None:
            return super().effective_tensors()
        bs = self.basis(self.S_epoch)
        out = {}
        for j, (name, p) in enumerate(zip(self.names, self.params)):
            f = self._delta_factors(j, bs)
            w = p.detach().float()
            out[name] = (w if f is None else torch.addmm(w, f[0], f[1].T)).to(p.dtype)
        return out

    def extra_state(self) -> dict[str, torch.Tensor]:
        epoch = -1 if self.S_epoch is None else self.S_epoch
        return {"subcge.S": self.S.clone(), "subcge.S_epoch": torch.tensor(epoch)}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        self.S.copy_(state["subcge.S"])
        epoch = int(state["subcge.S_epoch"])
        self.S_epoch = None if epoch < 0 else epoch


def build(model: nn.Module, zo: ZOConfig, subspace: SubspaceConfig, run_seed: int) -> Direction:
    """The direction family the config names, bound to the model's trainable matrices."""
    names = select_trainable(model, zo.trainable)
    params = dict(model.named_parameters())
    for dtype in sorted({str(params[n].dtype) for n in names}):
        check_precision(zo, dtype)
    if zo.direction == "gaussian":
        d: Direction = Gaussian(model, names, run_seed)
    else:
        d = SubCGE(model, names, run_seed, subspace)
    log.info("%s direction over %d matrices, %d trainable scalars", zo.direction, len(names), d.numel)
    return d
