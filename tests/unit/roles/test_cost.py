"""roles/cost.py: a client's forwards are timed on their thread, held messages sampled after hops."""

import time

from seedflood.roles.cost import Cost


class _Flood:
    held_count = 0


class _Client:
    def __init__(self) -> None:
        self.flood = _Flood()
        self.ran: list[int] = []

    def hops(self, t: int) -> None:
        self.ran.append(t)
        self.flood.held_count = [3, 7, 2][t]


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_forwards_count_their_cpu_and_a_sleep_counts_none():
    cost = Cost()
    loss = cost.loss(lambda step: (_spin(0.05), float(step))[1])
    assert loss(2) == 2.0
    assert 0.05 <= cost.forwards_s < 0.5
    cost.loss(lambda step: (time.sleep(0.1), 0.0)[1])(0)  # a paced client's sleep
    assert cost.forwards_s < 0.05 + 0.05


def test_the_run_cpu_excludes_what_came_before_start():
    cost = Cost()
    _spin(0.1)  # start-up
    cost.start()
    _spin(0.05)
    cost.stop()
    r = cost.report()
    assert 0.05 <= r["run_cpu_s"] < 0.1 <= r["process_cpu_s"]


def test_held_is_the_peak_right_after_each_steps_hops():
    cost, client = Cost(), _Client()
    cost.watch(client)
    for t in range(3):
        client.hops(t)
    assert client.ran == [0, 1, 2] and cost.report()["held_peak"] == 7
