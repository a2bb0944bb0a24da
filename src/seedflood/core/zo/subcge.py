"""SubCGE: canonical coordinates of a shared low-rank subspace per matrix (docs/design.md, Directions and exactness).

Owns: the `SubCGE` direction family. Per trainable matrix W (m×k, an nn.Linear weight) a basis U
(m×r), V (k×r) with orthonormal columns, redrawn every `refresh` steps (an epoch) from
(run seed, epoch, matrix index). A seed picks per matrix one core coordinate (a, b) and a sign σ
with the counter-based hash; z restricted to W is σ·u_a·v_bᵀ. Evaluating θ + s·z adds
s·σ·(x·v_b)·u_aᵀ to the layer's output in a forward hook (O(tokens·(m+k)), nothing materialised).
Applying a message is one scalar add per matrix into an r×r accumulator S (a whole batch of steps
at once through `apply_steps`: one vectorised hash and one np.add.at per run of steps between
merges, O(messages)); W ← W + U·S·Vᵀ (O(r·d)) at every `merge_period`-th step end (default: once
per epoch) and always at an epoch's last step. While S is non-zero, forwards compute with
W + U·S·Vᵀ: by default materialised once per state into a second copy of the matrices
(`subspace.forward: materialize`), or as a low-rank term in each layer (`lowrank`).

Exactness: the canonical parameters are never written during a perturbed forward, accumulation
is fp32 in canonical order, and merges happen at steps fixed by the config, so two processes that
apply the same messages hold the same bits (same hardware and software). Forwards are a pure
function of (W, S, basis, seed, scale): W_eff and the low-rank factors are rebuilt from scratch
whenever S or W changes (never updated incrementally), so a resumed client computes the scalars
of the uninterrupted one.

Assumes: the `Direction` contract (seedflood.core.zo.directions); the trainable weights are written
only through the direction (or followed by `load_extra_state` / `invalidate`, as every restore
path does): its W_eff cache is keyed on its own changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from seedflood.core.config import rng
from seedflood.core.config.trainsections import SubspaceConfig
from seedflood.core.zo.directions import Direction, StepUpdate
from seedflood.core.zo.precision import DirectionError


@dataclass
class _Basis:
    epoch: int
    u: list[torch.Tensor]  # per matrix: m×r_j, on the parameter's device and dtype float32
    v: list[torch.Tensor]  # per matrix: k×r_j


_StateKey = tuple[int, tuple[int, ...]]
"""`SubCGE._state_key`: (the version of S and W, the parameters' storages)."""
_Factors = tuple[torch.Tensor, torch.Tensor]
"""A low-rank term as (left m×c, right k×c): the term is left·rightᵀ."""
_Hook = Callable[[nn.Module, tuple[torch.Tensor, ...], torch.Tensor], torch.Tensor]
"""A forward hook: (module, its inputs, its output) -> the output, updated in place."""


class SubCGE(Direction):
    """Canonical coordinates of a shared low-rank subspace per matrix (docs/design.md, Directions and exactness)."""

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
        self.forward: str = cfg.forward
        """How forwards see a pending S (FORWARD_MODES; "carried" only for benchmarks)."""
        self._version = 0  # bumped by every change to S or W made here (cache key)
        # The forwards of one state (`_state_key`), of one kind at a time: W_eff or the factors.
        self._weights: tuple[_StateKey, list[torch.Tensor | None]] | None = None
        self._factors: tuple[_StateKey, list[_Factors | None]] | None = None
        self._buffers: dict[int, torch.Tensor] = {}  # W_eff storage per matrix, reused across states

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

    def coordinates_many(self, seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`coordinates` of n seeds at once: a, b int64 (n, J), sign float32 (n, J) in {−1, +1};
        row i equals coordinates(seeds[i]) (same hash, vectorised over the key too)."""
        h = rng.hash_u64_many(np.asarray(seeds, dtype=np.uint64), self._counters)  # (n, J, 3)
        ranks = self.ranks.astype(np.uint64)
        a = (h[..., 0] % ranks).astype(np.int64)
        b = (h[..., 1] % ranks).astype(np.int64)
        sign = np.where(h[..., 2] & np.uint64(1), np.float32(1.0), np.float32(-1.0))
        return a, b, sign

    # -- forwards --------------------------------------------------------------------------------
    # How forwards see a pending core S (W + U·S·Vᵀ). Every mode is a pure function of the state,
    # so each keeps the guarantee; they differ in the last bits, so the mode is a run setting
    # (`subspace.forward`, in the trajectory). Per state (once per applied step) and per forward:
    #   "materialize": W_eff = W + U_A·S_AB·V_Bᵀ into reused buffers (2·r·d flops + one pass over
    #                  W), swapped in as the weights: forwards cost nothing extra. One extra copy
    #                  of the trainable matrices in memory.
    #   "lowrank":     A = U_A·S_AB once per state; each layer adds (x·V_B)·Aᵀ, with a same-epoch
    #                  perturbation folded in as one more column (one product, not two).
    #   "carried":     the original hook x·V·Sᵀ·Uᵀ + a separate rank-1 pass (benchmarks only).
    # SmolLM2-135M shapes, rank 32, 1 thread, CPU time (bench `tradeoff`; machine shared, load ≈ 15):
    # at 1,024 tokens per forward materialize costs ≈ 2.4% of two forwards' GEMMs per step,
    # lowrank ≈ 24% and carried ≈ 35% per forward (skinny GEMMs run far below peak); lowrank wins
    # only at ≲ 128 tokens per forward (64 tokens: 15% vs 33%).
    FORWARD_MODES = ("materialize", "lowrank", "carried")

    def _state_key(self) -> _StateKey:
        """Identity of the state a cached W_eff / factor list was built from: our own version
        counter (bumped by every change to S or W we make) and the parameters' storages (a
        caller that swaps `p.data` invalidates it; one that writes W in place must call
        `load_extra_state` or `invalidate`, as every restore path does)."""
        return self._version, tuple(p.data.data_ptr() for p in self.params)

    def invalidate(self) -> None:
        """Forget cached forwards of the pending state (after writing W from outside)."""
        self._version += 1
        self._weights = self._factors = None

    def _pending_basis(self) -> _Basis:
        """The basis of the pending core S (its epoch's); only called while S is pending."""
        if self.S_epoch is None:
            raise DirectionError("subcge: no pending core to compute forwards with")
        return self.basis(self.S_epoch)

    def _pending_factors(self) -> list[_Factors | None]:
        """Per matrix (U_A·S_AB, V_B) of the pending core (None where S_j = 0), built once per state."""
        bs = self._pending_basis()
        key = self._state_key()
        if self._factors is None or self._factors[0] != key:
            self._weights = self._factors = None  # free the old copy before building the new one
            self._factors = (key, [self._delta_factors(j, bs) for j in range(len(self.params))])
        return self._factors[1]

    def _effective_weights(self) -> list[torch.Tensor | None]:
        """Per matrix W + U_A·S_AB·V_Bᵀ in the parameter's dtype (None where S_j = 0): computed from
        scratch from (W, S), never updated incrementally, so it is a pure function of the state."""

        def build() -> list[torch.Tensor | None]:
            bs = self._pending_basis()
            out: list[torch.Tensor | None] = []
            for j, p in enumerate(self.params):
                f = self._delta_factors(j, bs)
                if f is None:
                    out.append(None)
                    continue
                # Written into buffers kept across states: a fresh ~0.4 GB allocation per step
                # (SmolLM2) would pay its page faults every step. Contents are overwritten whole.
                buf = self._buffers.get(j)
                if buf is None or buf.shape != p.shape or buf.dtype != p.dtype or buf.device != p.device:
                    buf = self._buffers[j] = torch.empty_like(p.data)
                if p.dtype == torch.float32:
                    torch.addmm(p.data, f[0], f[1].T, out=buf)  # the kernel merge_all runs in place
                else:
                    buf.copy_(torch.addmm(p.data.float(), f[0], f[1].T))
                out.append(buf)
            return out

        key = self._state_key()
        if self._weights is None or self._weights[0] != key:
            self._weights = self._factors = None  # free the old copy before building the new one
            self._weights = (key, build())
        return self._weights[1]

    @contextlib.contextmanager
    def _hooks(self, seed: int | None, step: int, scale: float) -> Iterator[None]:
        pending = self.S_epoch is not None
        if seed is None and not pending:
            yield
            return
        mode = self.forward
        swapped: list[tuple[nn.Parameter, torch.Tensor]] = []
        eff = self._effective_weights() if pending and mode == "materialize" else []
        factors = self._pending_factors() if pending and mode == "lowrank" else []
        pb = self._pending_basis() if pending else None
        if seed is not None:
            pert = self.basis(self.epoch(step))
            a, b, sign = self.coordinates(seed)
        # Fold the perturbation into the pending product when both live in the same basis.
        fold = seed is not None and mode == "lowrank" and pending and self.S_epoch == self.epoch(step)
        handles = []

        def make_hook(j: int) -> _Hook:
            # Shapes: x (..., k), output (..., m). Low-rank terms only; W itself is never written.
            carried = (self.S[j].to(self.params[j].device), pb) if pb is not None and mode == "carried" else None
            f = factors[j] if factors else None
            rank1: _Factors | None = None  # (s·σ·u_a (m,), v_b (k,)) of the perturbation, unless folded
            if seed is not None:
                u = pert.u[j][:, a[j]] * float(scale * sign[j])  # (m,)
                v = pert.v[j][:, b[j]]  # (k,)
                if fold:
                    # U·(S + s·σ·e_a·e_bᵀ)·Vᵀ = [U_A·S_AB | s·σ·u_a]·[V_B | v_b]ᵀ: one product.
                    f = (
                        (u[:, None], v[:, None])
                        if f is None
                        else (torch.cat([f[0], u[:, None]], 1), torch.cat([f[1], v[:, None]], 1))
                    )
                else:
                    rank1 = (u, v)

            def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
                x = inputs[0]
                # The output is a fresh contiguous tensor of this layer: updated in place.
                flat, xf = out.view(-1, out.shape[-1]), x.reshape(-1, x.shape[-1])  # (T, m), (T, k)
                if carried is not None:
                    S, cb = carried
                    r = int(self.ranks[j])
                    flat.add_(((xf @ cb.v[j].to(x.dtype)) @ S[:r, :r].T.to(x.dtype)) @ cb.u[j].T.to(x.dtype))
                if f is not None:
                    flat.addmm_(xf @ f[1].to(x.dtype), f[0].T.to(x.dtype))  # (T, |B|)·(|B|, m)
                if rank1 is not None:
                    u1, v1 = rank1
                    flat.addr_((xf @ v1.to(x.dtype)), u1.to(x.dtype))  # rank 1: (x·v_b) ⊗ (s·σ·u_a)
                return out

            return hook

        try:
            for p, w in zip(self.params, eff):
                if w is not None:
                    swapped.append((p, p.data))
                    p.data = w  # a pointer swap: the forward computes with W_eff
            for j, mod in enumerate(self.modules):
                if seed is not None or (factors and factors[j] is not None) or (pending and mode == "carried"):
                    handles.append(mod.register_forward_hook(make_hook(j)))
            yield
        finally:
            for h in handles:
                h.remove()
            for p, orig in swapped:
                p.data = orig  # the canonical W was only read

    def perturbed(self, seed: int, step: int, scale: float) -> contextlib.AbstractContextManager[None]:
        return self._hooks(seed, step, scale)

    def current(self) -> contextlib.AbstractContextManager[None]:
        return self._hooks(None, 0, 0.0)

    # -- updates ---------------------------------------------------------------------------------
    def _merges_after(self, step: int) -> bool:
        """Whether the schedule merges at the end of `step` (merge_every divides refresh, so an
        epoch's last step is always one of these)."""
        return (step + 1) % self.cfg.merge_period == 0 or (step + 1) % self.cfg.refresh == 0

    def _open(self, step: int) -> None:
        epoch = self.epoch(step)
        if self.S_epoch is not None and self.S_epoch != epoch:
            raise DirectionError(f"pending core of epoch {self.S_epoch} was not merged before epoch {epoch}")
        self.S_epoch = epoch
        self.invalidate()

    def accumulate(self, step: int, seed: int, coef: float) -> None:
        self._open(step)
        a, b, sign = self.coordinates(seed)
        j = torch.arange(len(self.params))
        # One fp32 add per matrix; (j, a_j, b_j) are distinct within a message, so this is exact.
        vals = torch.from_numpy(sign).to(torch.float32) * torch.tensor(coef, dtype=torch.float32)
        self.S[j, torch.from_numpy(a), torch.from_numpy(b)] += vals

    def _accumulate_many(self, step: int, seeds: np.ndarray, coefs: np.ndarray) -> None:
        """`accumulate` for n messages of one epoch in canonical order, vectorised, same bits:
        np.add.at is unbuffered and adds its (index, value) pairs in order, so every cell of S
        receives the same fp32 additions in the same order as the per-message loop, and each
        value is float32(coef)·(±1) exactly, as there. The hash runs in torch int64
        (`rng.hash_u64_many_torch`, same bits as `coordinates_many`), in chunks of ~2**16 hashes
        so its temporaries stay in cache."""
        n = len(seeds)
        if n == 0:
            return
        self._open(step)
        r = self.cfg.rank
        J = len(self.params)
        flat_S = self.S.numpy().reshape(-1)  # a view: S is a contiguous CPU fp32 tensor
        base = torch.arange(J, dtype=torch.int64)[None, :] * (r * r)  # (1, J)
        ranks = torch.from_numpy(self.ranks)
        pow2 = bool(((self.ranks & (self.ranks - 1)) == 0).all())  # h % r_j is h & (r_j - 1)
        c32 = torch.from_numpy(np.ascontiguousarray(coefs, dtype=np.float64)).to(torch.float32)
        chunk = max(1, (1 << 16) // (3 * J))
        for lo in range(0, n, chunk):  # bounded temporaries: (chunk, J, 3) int64
            h = rng.hash_u64_many_torch(seeds[lo : lo + chunk], self._counters).view(-1, J, 3)
            if pow2:
                a, b = h[..., 0] & (ranks - 1), h[..., 1] & (ranks - 1)
            else:  # an unsigned remainder: through numpy's uint64 view of the same bits
                hu = h.numpy().view(np.uint64)
                a = torch.from_numpy((hu[..., 0] % self.ranks.astype(np.uint64)).astype(np.int64))
                b = torch.from_numpy((hu[..., 1] % self.ranks.astype(np.uint64)).astype(np.int64))
            odd = (h[..., 2] & 1).bool()
            vals = torch.where(odd, c32[lo : lo + chunk, None], -c32[lo : lo + chunk, None])  # (c, J) fp32, exact
            idx = base + a * r + b
            np.add.at(flat_S, idx.numpy().reshape(-1), vals.numpy().reshape(-1))  # message-major order

    def apply_steps(self, steps: Sequence[StepUpdate]) -> None:
        """O(messages) between merges (`apply_arrays` of the steps concatenated)."""
        if not steps:
            return
        bounds = np.zeros(len(steps) + 1, dtype=np.int64)
        np.cumsum([len(s) for _, s, _ in steps], out=bounds[1:])
        self.apply_arrays(
            np.array([step for step, _, _ in steps], dtype=np.int64),
            bounds,
            np.concatenate([s for _, s, _ in steps]),
            np.concatenate([c for _, _, c in steps]),
        )

    def apply_arrays(self, steps: np.ndarray, bounds: np.ndarray, seeds: np.ndarray, coefs: np.ndarray) -> None:
        """Each run of steps up to a merge point, an epoch change or the end is accumulated in
        one vectorised pass, then committed (merging where the schedule says): a step inside a
        run is never a merge point, so its commit would do nothing."""
        if not len(steps):
            return
        ends = ((steps + 1) % self.cfg.merge_period == 0) | ((steps + 1) % self.cfg.refresh == 0)
        epochs = steps // self.cfg.refresh
        ends[:-1] |= epochs[1:] != epochs[:-1]
        ends[-1] = True
        first = 0
        for j in np.flatnonzero(ends).tolist():
            a, b = int(bounds[first]), int(bounds[j + 1])
            self._accumulate_many(int(steps[j]), seeds[a:b], coefs[a:b])
            self.commit(int(steps[j]))
            first = j + 1

    def commit(self, step: int) -> None:
        if self.S_epoch is not None and self._merges_after(step):
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
        self.invalidate()

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
        self.invalidate()  # the caller has just written W too
