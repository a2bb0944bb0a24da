"""rundir.liveview.merge: the records of a run as one view — stale rows, and processes whose
chain digests disagree with the majority flagged at a step they share.

Values only; milliseconds.
"""

from __future__ import annotations

import dataclasses

from seedflood.rundir.liveview import merge
from seedflood.rundir.status import FAILED, FINISHED, STOPPED, Status

NOW = 1_000_000.0


def rec(node: int | None, digests: dict[int, str], age: float = 0.5, **changes: object) -> Status:
    base = Status(
        role="client" if node is not None else "evaluator",
        node=node,
        incarnation=1,
        pid=1,
        host="h",
        total=10,
        step=max(digests, default=-1) + 1,
        applied=max(digests, default=-1),
        committed=max(digests, default=-1),
        digests=digests,
        members=None,
        peers=[],
        neighbours=[],
        sent=0,
        received=0,
        steps_per_s=1.0,
        sent_per_s=0.0,
        updated=NOW - age,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


CHAIN = {s: f"{s:016x}" for s in range(10)}


def window(lo: int, hi: int, chain: dict[int, str] = CHAIN) -> dict[int, str]:
    return {s: chain[s] for s in range(lo, hi + 1)}


def test_records_at_different_steps_agree_on_the_newest_step_all_hold() -> None:
    view = merge([rec(0, window(2, 7)), rec(1, window(4, 9)), rec(None, window(0, 5))], [], NOW)
    assert view.agree is True and view.odd == [] and view.step == 5 and view.digest == CHAIN[5]
    assert [r.agrees for r in view.rows] == [True, True, True]
    assert view.readable


def test_a_process_with_another_digest_is_flagged_and_the_majority_wins() -> None:
    forked = {**CHAIN, **{s: f"{s + 100:016x}" for s in range(6, 10)}}  # a chain that parted at step 6
    view = merge([rec(0, window(3, 8)), rec(1, window(4, 9, forked)), rec(2, window(5, 9))], [], NOW)
    assert view.agree is False and view.odd == ["node-1"]
    assert [r.agrees for r in view.rows] == [True, False, True]
    assert view.step == 8 and view.digest == CHAIN[8]  # the majority's digest at the newest shared step


def test_a_running_record_older_than_the_bound_is_stale_and_not_compared() -> None:
    forked = {s: "f" * 16 for s in range(10)}
    rows = [
        rec(0, window(0, 5)),
        rec(1, window(0, 5, forked), age=30.0),  # went silent: its digests may be a lost history
        rec(2, window(0, 5), age=30.0, state=FINISHED),  # a final record never goes stale
    ]
    view = merge(rows, [], NOW, stale_s=10.0)
    assert [r.stale for r in view.rows] == [False, True, False]
    assert [r.shown_state for r in view.rows] == ["running", "stale", "finished"]
    assert view.agree is True and view.rows[1].agrees is None
    assert merge(rows, [], NOW, stale_s=60.0).odd == ["node-1"]  # within the bound it is compared


def test_stopped_and_failed_processes_are_shown_not_compared() -> None:
    other = {s: "e" * 16 for s in range(10)}
    rows = [
        rec(0, window(0, 5)),
        rec(1, window(0, 5)),
        rec(2, window(0, 3, other), state=STOPPED, reason="excluded"),
        rec(3, window(0, 2, other), state=FAILED, reason="boom"),
    ]
    view = merge(rows, ["status/node-4.json: not JSON"], NOW)
    assert view.agree is True and [r.agrees for r in view.rows] == [True, True, None, None]
    assert not view.readable and view.to_dict()["problems"] == ["status/node-4.json: not JSON"]


def test_nothing_to_compare() -> None:
    assert merge([], [], NOW).agree is None
    one = merge([rec(0, window(0, 3))], [], NOW)
    assert one.agree is None and one.step is None and one.rows[0].agrees is None
    apart = merge([rec(0, window(0, 3)), rec(1, window(5, 9))], [], NOW)  # windows that do not overlap
    assert apart.agree is None and apart.step is None


def test_two_processes_that_differ_are_both_flagged_no_majority() -> None:
    other = {s: "e" * 16 for s in range(10)}
    view = merge([rec(0, window(0, 5)), rec(1, window(0, 5, other))], [], NOW)
    assert view.agree is False and view.odd == ["node-0", "node-1"] and view.digest is None


def test_a_process_that_committed_nothing_yet_does_not_hide_the_shared_step() -> None:
    view = merge([rec(0, window(0, 5)), rec(1, window(2, 7)), rec(2, {})], [], NOW)
    assert (view.agree, view.step, view.digest) == (True, 5, CHAIN[5]) and view.rows[2].agrees is None
