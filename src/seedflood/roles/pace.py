"""Pacing a client's steps: run.step_delay_s, run.slow_nodes and run.node_delay_s.

Owns: `paced` (and `delay`, `slowed`), the loss a client steps with, slowed by a sleep before its forwards (a slower
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


def delay(run: RunConfig, node: int) -> float:
    """Seconds client `node` sleeps before each forward: its run.node_delay_s if it has one, else
    run.step_delay_s for the clients run.slow_nodes names (all if empty), else 0."""
    if node in run.node_delay_s:
        return run.node_delay_s[node]
    return run.step_delay_s if not run.slow_nodes or node in run.slow_nodes else 0.0


def slowed(loss: Callable[[int], float], seconds: float) -> Callable[[int], float]:
    """`loss` after a sleep of `seconds` (none: `loss` itself), as a slower device takes longer
    for its forwards."""
    if not seconds:
        return loss

    def slow(step: int) -> float:
        time.sleep(seconds)
        return loss(step)

    return slow


def paced(run: RunConfig, node: int, loss: Callable[[int], float]) -> Callable[[int], float]:
    """`loss`, slowed by run.step_delay_s for the clients run.slow_nodes names (all if empty)."""
    return slowed(loss, delay(run, node))
