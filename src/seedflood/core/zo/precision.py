"""The precision floor on ε: the smallest zo.eps a direction family resolves in a model dtype.

Owns: `MIN_EPS` (per (direction, dtype)), `check_precision` (called by `family.build` and by the
CLI preflight before any model is loaded) and `DirectionError` (a model or setting that does not
fit the chosen direction family; the directions raise it too).

Why: a SubCGE perturbation adds ε·σ·(x·v_b)·u_a to a layer's output, entries about ε/√m of the
output's scale; in bfloat16 or float16 that is below the output's rounding unless ε is large, so
the two-point scalar measures rounding noise, not the direction. Keeping the perturbation in fp32
does not help (every layer's output is rounded to the model dtype again), so too small an ε is
refused, with the smallest ε at which reduced-precision scalars tracked fp32 ones on the tiny
model and on SmolLM2-135M.

Assumes: dtypes are named as strings ("float32", "bfloat16", "float16", or a torch dtype's str);
imports neither torch nor numpy, so the launchers' preflight (`seedflood world-size`) stays
torch-free.
"""

from __future__ import annotations

from seedflood.core.config.trainsections import ZOConfig


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
