"""The `scaling` benchmark's launched mode (bench/scaling.py --launched): 4 clients on a ring +
the evaluator, `seedflood launch` through bench/procs.py's `launch`, twice (5 steps less 2).

Checks only speed-independent facts: every client reported its cost and ended on the evaluator's
hash, the forwards are part of the CPU, each client held a whole step (4 messages) after a step's
hops, and the bytes per edge and step are those of `seedflood simulate`'s row of the same config
(the same messages over the same edges). Never a timing against a threshold.
"""

from __future__ import annotations

import pytest

from seedflood.bench import scaling

pytestmark = pytest.mark.dist


@pytest.mark.timeout(600)
def test_a_launched_row_of_four_clients():
    r = scaling.measure_launched("ring", 4, 5, timeout_s=500, minus=2)
    assert r["launched"] and r["consensus"] is True
    assert (r["nodes"], r["diameter"], r["steps"], r["minus_steps"]) == (4, 2, 5, 2)
    assert 0 < r["client_step_forwards_s"] < r["client_step_cpu_s"] <= r["client_step_cpu_max_s"]
    assert r["held_per_client"] == 4
    simulated = scaling.measure("ring", 4, 5, budget_s=1e9)
    assert r["bytes_per_edge_step"] == pytest.approx(simulated["bytes_per_edge_step"], rel=0.05)
