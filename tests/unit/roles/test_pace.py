"""run.step_delay_s / run.slow_nodes: a launched client's loss is slowed by a sleep before its
forwards, only on the clients named (all if none), and returns what the loss returns."""

from __future__ import annotations

import pytest

from seedflood.core.config.trainsections import RunConfig
from seedflood.roles import train


def loss(step: int) -> float:
    return 0.5 * step


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(train.time, "sleep", slept.append)
    return slept


def test_every_client_sleeps_before_its_forwards_and_gets_the_same_loss(sleeps):
    paced = train._paced(RunConfig(step_delay_s=0.25), 3, loss)
    assert [paced(s) for s in (2, 4)] == [1.0, 2.0]
    assert sleeps == [0.25, 0.25]


def test_only_the_named_clients_are_slowed(sleeps):
    run = RunConfig(step_delay_s=0.1, slow_nodes=[1])
    assert train._paced(run, 0, loss) is loss
    assert train._paced(run, 1, loss)(6) == 3.0 and sleeps == [0.1]


def test_no_delay_is_the_loss_itself():
    assert train._paced(RunConfig(), 0, loss) is loss
    assert train._paced(RunConfig(slow_nodes=[0]), 0, loss) is loss
