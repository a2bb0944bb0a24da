"""The strict step schedule (core/flood/schedule.py) that roles/strict.py runs and lockstep.py replays:
every step applied once, in order, at local step t + delay (the drain included), for every delay
and with and without overlap."""

import pytest

from seedflood.core.flood.schedule import StepSchedule


def run(s: StepSchedule, hopped: list[int] | None = None) -> list[tuple[int, int]]:
    """(step, local step of the hops it was applied after) as the strict client walks the schedule;
    `hopped` gets every local step whose hops ran, in order."""
    applied, out, hopped = -1, [], [] if hopped is None else hopped
    for t in range(s.steps):
        for step in range(applied + 1, s.applies_through(t) + 1):
            out.append((step, t - 1 if s.apply_first else t))  # overlap applies before t's hops
        applied = max(applied, s.applies_through(t))
        hopped.append(t)  # with overlap in flight during t + 1: the drain joins the last ones first
    t = s.last
    if s.apply_first:
        for step in range(applied + 1, s.drained_through(t) + 1):
            out.append((step, t))
        applied = max(applied, s.drained_through(t))
    while applied < s.last:
        t = s.drain_hop(applied, t)
        hopped.append(t)
        for step in range(applied + 1, s.drained_through(t) + 1):
            out.append((step, t))
        applied = max(applied, s.drained_through(t))
    return out


@pytest.mark.parametrize("steps", [1, 2, 7])  # 1 and 2: fewer steps than the lag
@pytest.mark.parametrize("delay, overlap", [(0, False), (1, False), (3, False), (1, True), (2, True), (4, True)])
def test_every_step_is_applied_once_in_order_after_the_hops_that_complete_it(steps, delay, overlap):
    s = StepSchedule(steps, delay, overlap)
    hopped: list[int] = []
    got = run(s, hopped)
    assert hopped == list(range(len(hopped)))  # no local step's hops skipped (the drain of a run shorter than its lag)
    assert [step for step, _ in got] == list(range(steps))
    lag = delay - int(overlap)  # hops of local step t complete step t − lag
    for step, hops in got:
        assert hops >= step + lag, (step, hops)
    assert s.lag == lag and s.apply_first == overlap


def test_without_delay_each_step_applies_in_its_own_local_step():
    s = StepSchedule(5, 0, False)
    assert [s.applies_through(t) for t in range(5)] == [0, 1, 2, 3, 4]
    assert run(s) == [(t, t) for t in range(5)]
