"""run.step_delay_s / run.slow_nodes: a client's loss (launched or in process) is slowed by a
sleep before its forwards, only on the clients named (all if none), and returns what the loss returns."""

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


def test_a_client_with_its_own_delay_sleeps_that_in_place_of_the_common_one(sleeps):
    """Unequal devices: run.node_delay_s gives a client its own sleep; the others keep
    run.step_delay_s (or none where run.slow_nodes leaves them out)."""
    run = RunConfig(step_delay_s=0.1, node_delay_s={2: 0.3})
    train._paced(run, 2, loss)(1)
    train._paced(run, 0, loss)(1)
    assert sleeps == [0.3, 0.1]
    assert train._paced(RunConfig(slow_nodes=[1], node_delay_s={0: 0.0}), 0, loss) is loss


def test_no_delay_is_the_loss_itself():
    assert train._paced(RunConfig(), 0, loss) is loss
    assert train._paced(RunConfig(slow_nodes=[0]), 0, loss) is loss


def test_in_process_clients_are_paced_like_launched_ones_and_keep_their_bits(monkeypatch):
    """simulate takes its clients' loss through the same pacing: only node 1 sleeps, before each
    of its two forwards a step, and the run ends on the bits of an unpaced one."""
    import threading
    from pathlib import Path

    from seedflood.core.config import runconfig
    from seedflood.roles import pace
    from seedflood.roles.inprocess import simulate

    debug = Path(__file__).resolve().parents[3] / "launch" / "configs" / "debug.yaml"
    sets = ["run.steps=2", "task.batch_size=2"]
    plain = simulate(runconfig.load(debug, sets))
    slept: list[tuple[str, float]] = []
    real = pace.time.sleep

    def sleep(s: float) -> None:
        slept.append((threading.current_thread().name, s))
        real(s)

    monkeypatch.setattr(pace.time, "sleep", sleep)
    r = simulate(runconfig.load(debug, [*sets, "run.step_delay_s=0.03", "run.slow_nodes=[1]"]))
    assert [x for x in slept if x[1] == 0.03] == [("client-1", 0.03)] * 2 * 2  # 2 steps
    assert r.hashes == plain.hashes and r.step_hashes == plain.step_hashes
