"""rundir.status: a process's live status record — round trip, atomic rewrite (a reader never sees
a torn record), and every unreadable file (missing, torn, foreign, another version) as one line.

Files of a few hundred bytes under tmp_path; milliseconds (the concurrent rewrite: well under a
second), no processes, no model.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest

from seedflood.rundir.layout import CheckpointError, RunDir
from seedflood.rundir.status import (
    FINISHED,
    Status,
    StatusError,
    read_status,
    read_statuses,
    status_name,
    write_status,
)


def record(node: int | None = 0, **changes: object) -> Status:
    base = Status(
        role="client" if node is not None else "evaluator",
        node=node,
        incarnation=2,
        pid=1234,
        host="h1",
        total=6,
        step=4,
        applied=2,
        committed=3,
        digests={2: "00000000000000aa", 3: "00000000000000bb"},
        members=[0, 1, 3],
        peers=[1],
        neighbours=[1, 3],
        sent=1000,
        received=900,
        steps_per_s=2.5,
        sent_per_s=250.0,
        updated=1_700_000_000.5,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_a_record_round_trips_through_its_file(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    for s in (record(), record(None, members=None), record(2, state=FINISHED, state_hash="ab" * 32)):
        path = write_status(run, s)
        assert path == run.status / f"{status_name(s.node)}.json"
        assert read_status(path) == s
    got, problems = read_statuses(run)
    assert problems == [] and [s.name for s in got] == ["node-0", "node-2", "evaluator"]
    assert record().digest == "00000000000000bb"  # the committed step's


def test_bytes_per_edge_round_trip_and_a_record_from_before_them_reads_without(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    s = record(edges={1: (600, 500), 3: (300, 400), -1: (100, 0)})
    assert read_status(write_status(run, s)) == s
    old = json.loads(s.to_json())
    del old["edges"]  # a record written before per-edge counts
    (run.status / "node-0.json").write_text(json.dumps(old))
    assert read_status(run.status / "node-0.json") == dataclasses.replace(s, edges={})


def test_a_rewrite_is_atomic_a_reader_sees_one_whole_record_or_the_next(tmp_path: Path) -> None:
    """Many rewrites while another thread reads: every read is a whole record (a plain
    open-and-write would hand the reader an empty or half-written file), and no temp file is left."""
    run = RunDir(tmp_path)
    write_status(run, record(step=0))
    done = threading.Event()
    seen: list[int] = []
    errors: list[str] = []

    def read() -> None:
        while not done.is_set():
            try:
                seen.append(read_status(run.status / "node-0.json").step)
            except StatusError as e:
                errors.append(str(e))

    reader = threading.Thread(target=read)
    reader.start()
    for step in range(1, 200):
        write_status(run, record(step=step, digests={step: f"{step:016x}"}))
    done.set()
    reader.join()
    assert errors == [] and seen and seen == sorted(seen)  # whole records, never going back
    assert [p.name for p in run.status.iterdir()] == ["node-0.json"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"version": 1, "role": "cli', "not JSON"),  # torn mid-write (what a non-atomic write leaves)
        ("", "not JSON"),
        ("[1, 2]", "not a status record (a JSON list)"),
        ('{"version": 99}', "version 99"),
        ('{"version": 1, "role": "client"}', "lacks"),
    ],
)
def test_a_torn_or_foreign_file_is_one_line_naming_it(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "status" / "node-1.json"
    path.parent.mkdir()
    path.write_text(text)
    with pytest.raises(StatusError) as e:
        read_status(path)
    assert says in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_record_with_a_bad_value_is_one_line(tmp_path: Path) -> None:
    d = json.loads(record().to_json())
    path = tmp_path / "x.json"
    for bad in ({"digests": [1]}, {"state": "dancing"}):
        path.write_text(json.dumps({**d, **bad}))
        with pytest.raises(StatusError, match="malformed|unknown state"):
            read_status(path)


def test_a_missing_record_and_a_directory_without_records(tmp_path: Path) -> None:
    with pytest.raises(StatusError, match="no status record"):
        read_status(tmp_path / "node-9.json")
    assert read_statuses(RunDir(tmp_path)) == ([], [])  # no status/ yet: nothing, no error
    run = RunDir(tmp_path)
    write_status(run, record(1))
    (run.status / "node-0.json").write_text('{"vers')
    got, problems = read_statuses(run)
    assert [s.node for s in got] == [1] and len(problems) == 1 and "node-0.json" in problems[0]


def test_watch_takes_a_live_run_directory_and_refuses_anything_else(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such directory"):
        RunDir.watched(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="is not a run directory"):
        RunDir.watched(tmp_path)
    write_status(RunDir(tmp_path), record())  # clients write records before the evaluator's log exists
    assert RunDir.watched(tmp_path).root == tmp_path
