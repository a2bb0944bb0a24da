"""The two-point zeroth-order estimate.

Owns: scalar = (L(θ+εz) − L(θ−εz)) / 2ε for one seed, computed without ever writing θ (the
direction family evaluates θ ± εz at forward time), and its validation before it may travel.

Assumes: `loss()` evaluates the model on a fixed batch and returns a Python float; it is called
inside the direction's perturbation context, so it must run a fresh forward each time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from seedflood.core.zo.directions import Direction


class EstimateError(ArithmeticError):
    """The loss or the scalar is not finite or is out of bounds: training has diverged."""


def two_point(loss: Callable[[], float], direction: Direction, seed: int, step: int, eps: float) -> float:
    """(L(θ+εz) − L(θ−εz)) / 2ε along z(seed); θ is bit-identical afterwards."""
    with direction.perturbed(seed, step, +eps):
        plus = float(loss())
    with direction.perturbed(seed, step, -eps):
        minus = float(loss())
    if not (math.isfinite(plus) and math.isfinite(minus)):
        raise EstimateError(f"loss is not finite at step {step} (L+ = {plus}, L- = {minus}): lower zo.lr or zo.eps")
    return (plus - minus) / (2.0 * eps)


def check_scalar(scalar: float, bound: float, step: int) -> float:
    """Refuse to send a scalar that every receiver would reject."""
    if not math.isfinite(scalar) or abs(scalar) > bound:
        raise EstimateError(
            f"scalar {scalar:g} at step {step} exceeds flood.max_scalar={bound:g}: training diverged "
            "(lower zo.lr) or raise flood.max_scalar"
        )
    return scalar
