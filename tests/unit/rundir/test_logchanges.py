"""rundir.logchanges: a log's roster history read from its record headers alone, as `seedflood
status` reads a log the evaluator is still appending to: every prefix of the file (a record
torn mid-write) reads as its whole steps, never an error; a record out of sequence is one line.
Logs of a few steps written here; milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from churnlog import CHANGES, write_log
from seedflood.rundir.layout import CheckpointError
from seedflood.rundir.logchanges import read_membership
from seedflood.rundir.logrecords import CHANGE_FLAG, REC


def test_the_changes_and_the_roster_after_the_last_step(tmp_path: Path) -> None:
    m = read_membership(write_log(tmp_path / "log.bin"))
    assert (m.start, m.members, m.steps) == ([0, 1, 2, 3], [0, 1, 2, 3, 4], 6)
    assert m.changes == [CHANGES[2], CHANGES[4]] and (m.joins, m.leaves) == (2, 1)
    assert m.to_dict()["changes"][1] == {"step": 4, "leave": [], "join": [[3, 2], [4, 1]], "audit": []}


def test_every_prefix_of_a_log_being_written_reads_as_its_whole_steps(tmp_path: Path) -> None:
    whole = write_log(tmp_path / "log.bin").read_bytes()
    ends = {}  # the file's length after each step: what a reader sees between two appends
    for s in range(1, 7):
        ends[len(write_log(tmp_path / f"{s}.bin", s).read_bytes())] = s
    header = len(write_log(tmp_path / "0.bin", 0).read_bytes())
    cut = tmp_path / "cut.bin"
    last = 0
    for n in range(header, len(whole) + 1):
        cut.write_bytes(whole[:n])
        m = read_membership(cut)
        last = ends.get(n, last)
        assert m.steps == last, n  # a torn record is not a step yet
        assert m.changes == [c for s, c in CHANGES.items() if s < last], n  # nor is its change


def test_a_record_out_of_sequence_is_one_line(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.bin", 3)
    with open(path, "ab") as f:
        f.write(REC.pack(CHANGE_FLAG | 7, 4) + b"\0" * 4)
    with pytest.raises(CheckpointError, match="membership record at byte offset .* out of sequence"):
        read_membership(path)
    (tmp_path / "junk.bin").write_bytes(b"not a log at all")
    with pytest.raises(CheckpointError, match="not a SeedFlood message log"):
        read_membership(tmp_path / "junk.bin")
