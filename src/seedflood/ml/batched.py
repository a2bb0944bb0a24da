"""Batched clients for the shared-model simulation: every client's perturbed forwards of a step
in one forward (`sim.batched: true`; `seedflood simulate` only).

Why it is possible: in `sharedmodel` every client's estimate runs on the same shared weights; the
clients differ only in their batch and their direction. So the 2·K·N perturbed batches of a step
(client i, perturbation k, sign ±) are stacked into one decoder input, one group of packed rows per
(i, k, ±) (`grouped.grouped_losses`, `grouped.GroupLayout`), and each trainable layer adds each
group's own perturbation to that group's rows only:

- SubCGE: z restricted to matrix j is σ·u_a·v_bᵀ for one basis coordinate (a, b), so group g's
  term in y = x·(W + s_g·z_g)ᵀ is s_g·σ_gj·(x·v_{b_gj})·u_{a_gj}ᵀ: per layer one batched matvec
  (R, W, k)·(R, k, 1) and one batched rank-1 update (R, W, 1)·(R, 1, m) over the R packed rows
  (each row takes its group's u and v) on top of the shared
  x·Wᵀ (W_eff under `subspace.forward: materialize`, or with the pending low-rank term under
  `lowrank`, exactly as `direction.current()` gives the sequential path). The basis columns are
  gathered once per step (G·(m + k) floats per matrix) and spread to the rows by one
  index_select per layer call; no weight copy is made, so memory is the activations of the
  stacked batches. O(tokens·(m + k)) extra per layer, as the sequential hook.
- Gaussian: z_g is dense, so each group needs its own weights. Each trainable nn.Linear's forward
  is replaced, for the duration of the forward, by one GEMM per group against that group's
  perturbed copy (W.float() ± ε·z).to(dtype) (the sequential path's expression, so the perturbed
  weights are the same bits), built when the layer runs: two copies of one matrix alive at a time,
  and z(seed) drawn once per client and k for both signs (the sequential path draws it twice).
  Everything else in the forward (attention, norms, untrained layers) runs batched.
- Anything else (a trainable matrix outside the decoder, e.g. the output head, or not an
  nn.Linear weight under Gaussian) falls back to the sequential path with one log line
  (`BatchedEstimator.fallback` says why).

What stays bit-identical to the launched run (and to the sequential simulation): every seed,
every batch (the same examples, encoded by the same code), every direction's coordinates and
perturbed weights (Gaussian copies are the sequential path's expression), the flood, the frames,
the byte counts, the apply and merge of a step given its scalars, the log format and the
evaluator. A batched run's log replays to the batched run's hash exactly (`seedflood replay`),
and a resumed batched run equals the uninterrupted one (its scalars are a pure function of the
state, the step, the config and the thread count, like the sequential ones).

What is equal only up to floating-point reduction order: the scalars. The stacked forward runs
other GEMM and attention shapes (more rows, rows padded to the widest group) and adds the
perturbation as a batched product instead of `addr_`, and averages single-token groups'
cross-entropies with one index_add, so each loss differs from the sequential loss in its last bits (|ΔL| ~ 1e-7 in fp32), and a scalar (L+ − L−)/2ε by about |ΔL|/ε
(tests/unit/ml/test_batched.py states the tolerances). From the first differing scalar on, the
weights and so the trajectory differ from the launched run's in the last bits too: a batched
simulation is statistically, not bitwise, the launched run (final loss and accuracy within
tolerance: tested). `sim.clients_per_forward` and the thread count change the shapes and so
those bits too. The sequential path (`sim.batched: false`, the default) stays the exact reference.

Where it pays: on a GPU, where one client's forward is launch-bound. On a CPU a forward is
compute-bound already and stacked activations fall out of cache, so batched is 0.8–1.0× the
sequential rate there (docs/benchmarks.md, `sim`).

Assumes: the model is a decoder that `grouped.grouped_losses` can drive (objective.py's assumptions),
and its trainable layers see hidden states of shape (packed rows, width, ·), rows in
`GroupLayout` order (the decoder's layout; checked per call).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from seedflood.core.config.systemsections import SimConfig
from seedflood.core.flood.protocol import Protocol
from seedflood.core.zo.directions import Direction, Gaussian
from seedflood.core.zo.estimate import EstimateError
from seedflood.core.zo.subcge import SubCGE
from seedflood.ml import grouped, objective

log = logging.getLogger(__name__)

Context = Callable[[grouped.GroupLayout], contextlib.AbstractContextManager[Any]]


def _owner(model: nn.Module, name: str) -> nn.Module | None:
    return model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else None


def _fallback_reason(model: nn.Module, direction: Direction) -> str | None:
    """Why this model and direction cannot be batched (None: they can)."""
    if not isinstance(direction, SubCGE | Gaussian):
        return f"direction {type(direction).__name__} has no batched form"
    decoder, head = objective.parts(model)
    inside = {id(m) for m in decoder.modules()}
    for name in direction.names:
        mod = _owner(model, name)
        if not isinstance(mod, nn.Linear) or not name.endswith(".weight"):
            return f"trainable {name} is not an nn.Linear weight"
        if id(mod) not in inside or mod is head:
            return f"trainable {name} is outside the decoder (its rows are not grouped)"
    return None


@contextlib.contextmanager
def _subcge(direction: SubCGE, step: int, seeds: Sequence[int], scales: Sequence[float], layout: grouped.GroupLayout):
    """Forwards see W (+ the pending core, as `current()`) plus, on group g's rows,
    scales[g]·z(seeds[g]) — as `direction.perturbed(seeds[g], step, scales[g])` per group."""
    import numpy as np

    pert = direction.basis(direction.epoch(step))
    a, b, sign = direction.coordinates_many(np.asarray(seeds, dtype=np.uint64))  # (G, J)
    coef = torch.from_numpy(sign) * torch.tensor(scales, dtype=torch.float32)[:, None]  # (G, J) = ±ε·σ, exact
    handles = []

    rows = layout.row_group()  # the group of every packed row
    n_rows = len(rows)

    def make_hook(j: int):
        dev = direction.params[j].device
        u = (pert.u[j][:, torch.from_numpy(a[:, j]).to(dev)].T * coef[:, j, None].to(dev)).contiguous()  # (G, m)
        v = pert.v[j][:, torch.from_numpy(b[:, j]).to(dev)].T.contiguous()  # (G, k)
        at = rows.to(dev)

        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
            x = inputs[0]
            if x.numel() != n_rows * layout.width * x.shape[-1]:
                raise RuntimeError(f"batched: layer {direction.names[j]} saw {tuple(x.shape)}, not the group layout")
            xr = x.reshape(n_rows, layout.width, x.shape[-1])  # (R, W, k)
            orow = out.view(n_rows, layout.width, out.shape[-1])  # (R, W, m): the layer's fresh output
            vr = v.index_select(0, at).to(x.dtype)[:, :, None]  # (R, k, 1): each row's group's v_b
            ur = u.index_select(0, at).to(x.dtype)[:, None, :]  # (R, 1, m): ±εσ·u_a
            orow.baddbmm_(torch.bmm(xr, vr), ur)  # (x·v_b) ⊗ (±εσ·u_a), row by row
            return out

        return hook

    with direction.current():  # W_eff or the pending low-rank term, exactly as the sequential path
        try:
            for j, mod in enumerate(direction.modules):
                handles.append(mod.register_forward_hook(make_hook(j)))
            yield
        finally:
            for h in handles:
                h.remove()


@contextlib.contextmanager
def _gaussian(direction: Gaussian, units: Sequence[int], eps: float, layout: grouped.GroupLayout) -> Iterator[None]:
    """Group 2i computes with θ + ε·z(units[i]), group 2i + 1 with θ − ε·z(units[i]): each trainable
    layer multiplies each group's rows by that group's perturbed copy, built with the sequential
    path's expression when the layer runs (z drawn once for both signs; two copies alive)."""
    model = direction.model
    mods = [_owner(model, n) for n in direction.names]
    ranges = layout.ranges()
    n_rows = sum(layout.rows)

    def make_forward(i: int, mod: nn.Linear):
        def forward(x: torch.Tensor) -> torch.Tensor:
            w = direction.params[i].data
            xr = x.reshape(n_rows, layout.width, x.shape[-1])
            y = xr.new_empty(n_rows, layout.width, w.shape[0])
            for u, seed in enumerate(units):
                z = direction.z(seed, i)
                for g, scale in ((2 * u, eps), (2 * u + 1, -eps)):
                    lo, hi = ranges[g]
                    wg = (w.float() + scale * z).to(w.dtype)  # = Gaussian.perturbed's weight
                    torch.matmul(xr[lo:hi], wg.T, out=y[lo:hi])
                del z
            if mod.bias is not None:
                y += mod.bias
            return y.view(*x.shape[:-1], w.shape[0])

        return forward

    try:
        for i, mod in enumerate(mods):
            mod.forward = make_forward(i, mod)  # an instance attribute shadows nn.Linear.forward
        yield
    finally:
        for mod in mods:
            if "forward" in vars(mod):
                del mod.forward


class BatchedEstimator:
    """Every client's K two-point scalars of a step from batched forwards (module docstring).

    `estimate(step, nodes, batch)` returns {node: [scalar of k for k in 0..K-1]}; `batch(node,
    step)` is the client's batch (Workload.batch). When `fallback` is set the caller must use the
    sequential path (this class refuses to estimate)."""

    def __init__(self, model: nn.Module, direction: Direction, protocol: Protocol, cfg: SimConfig) -> None:
        self.model = model
        self.direction = direction
        self.protocol = protocol
        self.cfg = cfg
        self.fallback: str | None = _fallback_reason(model, direction)
        self.per_forward = cfg.clients_per_forward  # clients per forward; 0 = all
        if self.fallback:
            log.warning("sim.batched: running sequentially: %s", self.fallback)

    def chunks(self, nodes: Sequence[int]) -> list[Sequence[int]]:
        """The nodes of each batched forward, in order."""
        n = self.per_forward or len(nodes) or 1
        return [nodes[lo : lo + n] for lo in range(0, len(nodes), n)]

    def estimate(self, step: int, nodes: Sequence[int], batch: Callable[[int, int], Any]) -> dict[int, list[float]]:
        if self.fallback:
            raise RuntimeError(f"batched estimate unavailable: {self.fallback}")
        p = self.protocol
        eps = p.eps
        out: dict[int, list[float]] = {}
        for part in self.chunks(list(nodes)):
            units = [(node, k, p.seed(node, step, k)) for node in part for k in range(p.perturbations)]
            batches, seeds, scales = [], [], []
            for node, _, seed in units:
                b = batch(node, step)
                batches += [b, b]
                seeds += [seed, seed]
                scales += [eps, -eps]
            losses = grouped.grouped_losses(
                self.model, batches, self._context(step, seeds, scales, [s for *_, s in units])
            )
            for i, (node, _, _) in enumerate(units):
                plus, minus = losses[2 * i], losses[2 * i + 1]
                if not (math.isfinite(plus) and math.isfinite(minus)):
                    raise EstimateError(
                        f"loss is not finite at step {step} (L+ = {plus}, L- = {minus}): lower zo.lr or zo.eps"
                    )
                out.setdefault(node, []).append((plus - minus) / (2.0 * eps))  # zo.two_point's expression
        return out

    def _context(self, step: int, seeds: list[int], scales: list[float], units: list[int]) -> Context:
        d = self.direction
        if isinstance(d, SubCGE):
            return lambda layout: _subcge(d, step, seeds, scales, layout)
        assert isinstance(d, Gaussian)
        return lambda layout: _gaussian(d, units, self.protocol.eps, layout)

    def plain(self, batches: Sequence[Any]) -> list[float]:
        """The unperturbed losses of `batches` from one grouped forward on the canonical state (the
        benchmark's floor: what one forward at the batched size costs)."""
        with self.direction.current():
            return grouped.grouped_losses(self.model, batches)
