"""Gossip averaging: Metropolis–Hastings mixing weights, mixing of flat vectors, consensus distance.

Owns the arithmetic the gossip baselines (baselines.py: dzsgd, dsgd, choco) share:
- `mh_weights(top)`: W_ij = 1 / (1 + max(deg_i, deg_j)) for every edge {i, j},
  W_ii = 1 − Σ_{j≠i} W_ij, 0 elsewhere. W is symmetric and doubly stochastic (rows and columns
  sum to 1), so x ← W x keeps the mean of the clients' vectors (Lian et al. 2017's DSGD).
- `mh_row(top, i)`: node i's row as {j: W_ij} over itself and its neighbours (all it needs).
- `mix(own, received, row, node)`: W_ii·x_i + Σ_j W_ij·x_j for one node, into a new vector,
  computed as x_i + Σ_{j≠i} W_ij·(x_j − x_i) (the same W, since W_ii = 1 − Σ_{j≠i} W_ij): a node
  whose neighbours hold its own bits keeps them exactly, so identical clients stay bit-identical
  (the W_ii·x_i + Σ form rounds, e.g. 3 · f32(1/3) ≠ 1, and moved about half the entries by an ulp).
- `pull(own, received, row, node)`: Σ_{j≠i} W_ij·(x_j − x_i) alone (CHOCO-SGD's consensus step).
- `consensus_distance(xs)`: (mean over clients of ‖x_i − x̄‖₂, that / ‖x̄‖₂), Euclidean norms of
  the flat trainable vectors, x̄ the plain mean.

Pure: numpy for the weights, torch tensors for the vectors (never torch.distributed, no
transformers, no environment). Assumes the vectors of one call share shape, dtype and device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from seedflood.core.topology.graph import Topology


def mh_weights(top: Topology) -> np.ndarray:
    """N×N float64 Metropolis–Hastings matrix of `top` (symmetric, doubly stochastic)."""
    n = top.n
    w = np.zeros((n, n), dtype=np.float64)
    for i, j in top.edges:
        w[i, j] = w[j, i] = 1.0 / (1.0 + max(top.degree(i), top.degree(j)))
    # The diagonal takes what the row's off-diagonal weights leave; it is ≥ 1/(1 + deg_i) > 0.
    w[np.arange(n), np.arange(n)] = 1.0 - w.sum(axis=1)
    return w


def mh_row(top: Topology, i: int) -> dict[int, float]:
    """{j: W_ij} for j = i and i's neighbours (the non-zero entries of row i)."""
    row = {j: 1.0 / (1.0 + max(top.degree(i), top.degree(j))) for j in top.neighbors(i)}
    row[i] = 1.0 - sum(row.values())
    return row


def pull(own: torch.Tensor, received: Mapping[int, torch.Tensor], row: Mapping[int, float], node: int) -> torch.Tensor:
    """Σ_{j≠i} W_ij·(received[j] − own) (a new tensor; `received` must hold every neighbour in row).

    Accumulated in own's dtype in ascending neighbour order through one scratch vector, so the
    result is a fixed function of the inputs (no thread or arrival order enters), and exactly 0
    where every neighbour holds own's value.
    """
    peers = sorted(j for j in row if j != node)
    if missing := set(peers) - set(received):
        raise ValueError(f"node {node}: mixing needs the vectors of neighbours {sorted(missing)}")
    out = torch.zeros_like(own)
    scratch = torch.empty_like(own)
    for j in peers:
        torch.sub(received[j], own, out=scratch)
        out.add_(scratch, alpha=row[j])
    return out


def mix(own: torch.Tensor, received: Mapping[int, torch.Tensor], row: Mapping[int, float], node: int) -> torch.Tensor:
    """W_ii·own + Σ_j W_ij·received[j], computed as own + pull(...) (a new tensor; see `pull`):
    own itself when every neighbour holds own's bits."""
    return pull(own, received, row, node).add_(own)


def mean(xs: Sequence[torch.Tensor]) -> torch.Tensor:
    """x̄ = (1/N) Σ x_i, accumulated in float64 (one extra vector) and returned in xs' dtype."""
    if not xs:
        raise ValueError("mean of no vectors")
    acc = torch.zeros_like(xs[0], dtype=torch.float64)
    for x in xs:
        acc.add_(x)
    return acc.div_(len(xs)).to(xs[0].dtype)


def consensus_distance(xs: Sequence[torch.Tensor], xbar: torch.Tensor | None = None) -> tuple[float, float]:
    """(mean_i ‖x_i − x̄‖₂, that / ‖x̄‖₂): Euclidean norms over whole flat vectors (0/0 → 0)."""
    xbar = mean(xs) if xbar is None else xbar
    dist = sum(float(torch.linalg.vector_norm((x - xbar).double())) for x in xs) / len(xs)
    ref = float(torch.linalg.vector_norm(xbar.double()))
    return dist, (dist / ref if ref > 0 else 0.0)
