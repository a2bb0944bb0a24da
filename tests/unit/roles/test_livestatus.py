"""roles.livestatus: the chain a strict client and the evaluator compute equals a churn client's
committed chain on the same steps; the status loop rewrites its record while the process works
and leaves a final state (finished, stopped, failed with one line); a run directory it cannot
write costs one warning, never the run.

Values and files under tmp_path; a fraction of a second (the loop runs at 20 ms), no model.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from seedflood.core.churn.agreement import Agreement
from seedflood.core.membership.roster import Change
from seedflood.core.wire.message import Message
from seedflood.roles.livestatus import Chain, Reading, SentCounter, StatusLoop, edge_bytes, evaluator_identity
from seedflood.rundir.layout import RunDir
from seedflood.rundir.status import FAILED, FINISHED, RUNNING, STOPPED, read_status


def steps(n: int, origins: range = range(3)) -> list[tuple[int, list[Message]]]:
    return [(s, [Message.make(o, s, 1000 * s + o, 0.5 + o, 0) for o in origins]) for s in range(n)]


def test_the_chain_is_the_churn_commit_chain() -> None:
    """Digests computed over logged or applied steps (strict client, evaluator) equal the ones a
    churn client's agreement commits for the same steps and changes, so `watch` compares them."""
    records = steps(40)
    records[5] = (5, [m for m in records[5][1] if m.origin != 2])  # node 2 left at step 5, back at 6
    changes = {5: Change(5, leave=(2,)), 6: Change(6, join=((2, 2),))}
    agreement = Agreement(0, 3, 1)
    chain = Chain()
    for s, msgs in records:
        agreement.extend(s, msgs, changes.get(s))
        chain.extend(s, msgs, changes.get(s))
    assert chain.through == agreement.through == 39
    recent = chain.recent()
    assert sorted(recent) == list(range(8, 40))  # the newest DIGEST_WINDOW
    assert recent == {s: f"{agreement.digests[s]:016x}" for s in recent}
    no_join = Chain()
    for s, msgs in records[:7]:
        no_join.extend(s, msgs)  # the same messages without the join: another history from step 6
    assert no_join.recent()[5] == f"{agreement.digests[5]:016x}"
    assert no_join.recent()[6] != f"{agreement.digests[6]:016x}"
    with pytest.raises(ValueError, match="in order"):
        chain.extend(41, [])


def test_the_sent_counter_keeps_the_total_of_its_table() -> None:
    c = SentCounter()
    c.add(0, 1, 2, 100)
    c.add(1, 1, -1, 23)
    assert c.sent == 123 == c.total()
    c.add_many(2, 1, [(2, 7), (3, 9)])  # a gloo hop counts its edges at once
    assert c.sent == 139 == c.total() and c.totals()[1] == {2: 107, -1: 23, 3: 9}


def test_the_bytes_per_edge_join_what_was_sent_to_and_received_from_each_peer() -> None:
    c = SentCounter()
    c.add(0, 1, 2, 100)
    c.add(1, 1, 2, 50)
    c.add(1, 1, -1, 23)  # the stream to the evaluator
    assert c.totals() == (173, {2: 150, -1: 23})
    assert edge_bytes(c.totals()[1], {2: 140, 3: 7}) == {-1: (23, 0), 2: (150, 140), 3: (0, 7)}


class Progress:
    """A process whose reading moves on each time it is read."""

    def __init__(self) -> None:
        self.step = 0

    def __call__(self) -> Reading:
        self.step += 1
        return Reading(self.step, self.step - 1, self.step - 1, {self.step - 1: "ab" * 8}, None, [], 10 * self.step, 0)


def loop(tmp_path: Path, interval_s: float = 0.02) -> StatusLoop:
    return StatusLoop(RunDir(tmp_path), evaluator_identity(100), Progress(), interval_s=interval_s)


def test_the_loop_rewrites_the_record_while_running_then_writes_the_final_state(tmp_path: Path) -> None:
    path = tmp_path / "status" / "evaluator.json"
    with loop(tmp_path) as status:
        first = read_status(path)  # written on entry, before any work
        assert first.state == RUNNING and first.pid > 0 and first.host and first.total == 100
        deadline = time.monotonic() + 5
        while read_status(path).step < first.step + 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert read_status(path).step >= first.step + 3  # rewritten by the thread meanwhile
        status.end(FINISHED, state_hash="cd" * 32)
    final = read_status(path)
    assert final.state == FINISHED and final.state_hash == "cd" * 32 and final.reason is None
    assert final.steps_per_s > 0 and final.sent_per_s > 0 and final.digest == "ab" * 8
    time.sleep(0.1)
    assert read_status(path) == final  # nothing writes after the final record


def test_an_error_leaving_the_loop_is_its_final_state_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), loop(tmp_path, interval_s=10):
        raise RuntimeError("peer 3 failed at step 4\nTraceback detail")
    got = read_status(tmp_path / "status" / "evaluator.json")
    assert (got.state, got.reason) == (FAILED, "peer 3 failed at step 4")


def test_a_stop_by_the_churn_rules_stays_stopped(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), loop(tmp_path, interval_s=10) as status:
        status.end(STOPPED, "node 1: excluded at step 7")
        raise RuntimeError("node 1: excluded at step 7")  # re-raised by the client after its record
    got = read_status(tmp_path / "status" / "evaluator.json")
    assert (got.state, got.reason) == (STOPPED, "node 1: excluded at step 7")


def test_a_run_directory_it_cannot_write_costs_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    status = StatusLoop(RunDir(blocker), evaluator_identity(3), Progress(), interval_s=0.01)
    # its own logger: a bench run earlier in this process may have set "seedflood" to ERROR
    with caplog.at_level(logging.WARNING, logger="seedflood.roles.livestatus"), status:
        time.sleep(0.05)
    assert not status.ok
    assert sum("no live status record" in r.message for r in caplog.records) == 1
