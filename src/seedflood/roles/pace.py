"""Pacing a client's steps: run.step_delay_s and run.slow_nodes.

Owns: `paced`, the loss a client steps with, slowed by a sleep before its forwards (a slower
device takes longer for them). Launched clients (roles/train.py) and the in-process simulation
(roles/inprocess.py) both take their loss through it, so a config paces both alike.

May import: the config sections only.

Assumes: a sleep changes no bit of a run (step_delay_s is left out of the trajectory), only its
pace in wall time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from seedflood.core.config.trainsections import RunConfig


def paced(run: RunConfig, node: int, loss: Callable[[int], float]) -> Callable[[int], float]:
    """`loss`, slowed by run.step_delay_s for the clients run.slow_nodes names (all if empty):
    a sleep before a step's forwards, as a slower device takes longer for them."""
    if not run.step_delay_s or (run.slow_nodes and node not in run.slow_nodes):
        return loss

    def slow(step: int) -> float:
        time.sleep(run.step_delay_s)
        return loss(step)

    return slow
