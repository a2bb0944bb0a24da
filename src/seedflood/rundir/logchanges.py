"""A log's roster history, read without decoding its steps: for live views of a run.

Owns `Membership` (the first roster, each committed change with its step, the roster after the
last whole step) and `read_membership`, which walks log.bin's record headers (logrecords.py's
format: u32 step with CHANGE_FLAG or SEAL_FLAG, u32 length, payload), seeks over every step
and seal payload and parses only the membership records. It opens the file read-only and
never locks, truncates or rewrites it, so the evaluator appending to it is not disturbed: a
record being written (a torn tail) is where the walk stops, and a change whose step record is
not there yet is left out, as `LogReader` leaves it out.

It checks only what the walk needs (each record's step in sequence, a change's CRC and that it
applies to the roster); `seedflood check` is the log's full verification.

Cost: one 8-byte read (buffered) and one seek per step record, so a 10,000-step log takes a
few tens of milliseconds whatever its number of clients.

May import: rundir's logheader, logrecords and layout; core.membership (no torch).

Assumes: the header's trajectory records "topology.nodes" (every roster starts as 0..N-1) and,
for an open run, "churn.max_nodes".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from seedflood.core.membership.roster import Change, Roster
from seedflood.rundir.layout import CheckpointError
from seedflood.rundir.logheader import read_header_at
from seedflood.rundir.logrecords import CHANGE_FLAG, MAX_CHANGE_BYTES, REC, SEAL_FLAG


@dataclass(frozen=True)
class Membership:
    """The roster history of the whole steps of a log."""

    start: list[int]  # the roster of step 0 (topology.nodes' ids)
    members: list[int]  # the roster of the last whole step (start with every change applied)
    steps: int  # whole step records in the log
    changes: list[Change] = field(default_factory=list)  # committed changes, by step

    @property
    def joins(self) -> int:
        return sum(len(c.join) for c in self.changes)

    @property
    def leaves(self) -> int:
        return sum(len(c.leave) for c in self.changes)

    def to_dict(self) -> dict[str, object]:
        return {
            "start": self.start,
            "members": self.members,
            "steps": self.steps,
            "joins": self.joins,
            "leaves": self.leaves,
            "changes": [
                {"step": c.step, "leave": list(c.leave), "join": [list(j) for j in c.join], "audit": list(c.audit)}
                for c in self.changes
            ],
        }


def read_membership(path: Path) -> Membership:
    """The roster history of the log at `path`; CheckpointError (one line) when it is not a
    log, its header records no roster, or a record the walk reads is out of sequence or corrupt."""
    with open(path, "rb") as f:
        header, off, _ = read_header_at(f, path)
        traj = header.get("trajectory") or {}
        nodes, most = traj.get("topology.nodes"), traj.get("churn.max_nodes")
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
            raise CheckpointError(f"{path}: the log header records no topology.nodes")
        most = most if isinstance(most, int) and not isinstance(most, bool) else 0
        roster = Roster(max(nodes, most), frozenset(range(nodes)))
        size = os.fstat(f.fileno()).st_size
        steps, pending, changes = 0, None, []
        while off + REC.size <= size:
            f.seek(off)
            rstep, n = REC.unpack(f.read(REC.size))
            if off + REC.size + n > size:  # being written: the torn tail
                break
            if rstep & CHANGE_FLAG:
                if rstep & ~CHANGE_FLAG != steps or pending is not None or n > MAX_CHANGE_BYTES:
                    raise CheckpointError(f"{path}: membership record at byte offset {off} out of sequence")
                try:
                    pending = Change.from_bytes(steps, f.read(n))
                except ValueError as e:  # FrameError is one
                    raise CheckpointError(f"{path}: membership record of step {steps}: {e}") from None
            elif not rstep & SEAL_FLAG:  # a step record (a seal record is skipped)
                if rstep != steps:
                    raise CheckpointError(f"{path}: record at byte offset {off} holds step {rstep}, expected {steps}")
                if pending is not None:
                    try:
                        roster.apply(pending)
                    except ValueError as e:  # FrameError is one
                        raise CheckpointError(f"{path}: membership record of step {steps}: {e}") from None
                    changes.append(pending)
                    pending = None
                steps += 1
            off += REC.size + n
    return Membership(list(range(nodes)), sorted(roster.members), steps, changes)
