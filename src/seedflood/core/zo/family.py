"""Which direction family a run uses: `build` binds the one `zo.direction` names to a model.

Owns: `build` (select the trainable matrices, refuse an ε too small for their dtype, construct
Gaussian or SubCGE). The families themselves live in seedflood.core.zo.directions (the interface and
Gaussian) and seedflood.core.zo.subcge; the ε floor in seedflood.core.zo.precision.

Assumes: the model is loaded, on its device and dtype, and its trainable names fixed for the run.
"""

from __future__ import annotations

import logging

from torch import nn

from seedflood.core.config.trainsections import SubspaceConfig, ZOConfig
from seedflood.core.zo.directions import Direction, Gaussian, select_trainable
from seedflood.core.zo.precision import check_precision
from seedflood.core.zo.subcge import SubCGE

log = logging.getLogger(__name__)


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
