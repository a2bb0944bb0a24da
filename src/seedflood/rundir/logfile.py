"""The message log file: reading it whole, and appending to it one step at a time.

Owns `LogReader` (header + every whole record; a torn tail is not returned but measured in
`torn`, which replay, eval and check report: torntail.py) and `LogWriter` (a new log
is created with its header by temp-then-rename; an existing one is checked against the resuming
run's settings and every record before a byte changes, its torn tail cut off, then appended to).

Durability: log appends are flushed per step (a process crash loses at most the record being
written: a torn tail) and fsynced by `LogWriter.sync` (at each checkpoint) and `close`. After a
power loss the steps since the last sync may be missing; on a filesystem that then shows them
as zeros or garbage the reader reports corruption, and the checkpoint's own log.bin copy is the
synced prefix to fall back to.

Assumes: one writer per log (the evaluator); readers may run at any time. The header is
logheader.py's, the records logrecords.py's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from seedflood.core.flood.columns import StepColumns
from seedflood.core.membership.roster import Change
from seedflood.core.wire import message
from seedflood.core.wire.message import Message
from seedflood.rundir.atomic import atomic_write_bytes
from seedflood.rundir.layout import CheckpointError
from seedflood.rundir.logheader import LogFormat, encode_header, header_mismatch, read_header_at
from seedflood.rundir.logrecords import CHANGE_FLAG, REC, SEAL_FLAG, RecordCheck, StepsCheck, scan_records

Records = list[tuple[int, list[Message]]]
"""A log's whole step records, in order: (step, the step's messages)."""


@dataclass
class LogReader:
    """Reads a message log; `read` sets `torn` to the bytes of a torn tail past the last whole
    record (0: none), so a caller that shows the log can say it ends torn (torntail.py)."""

    path: Path
    torn: int = field(default=0, init=False)
    changes: dict[int, Change] = field(default_factory=dict, init=False)
    """Set by `read`: the membership change of each step that has one."""
    seals: dict[int, bytes] = field(default_factory=dict, init=False)
    """Set by `read`: a signed run's seals of each step (logrecords.py, seal records)."""

    def read(self, check: RecordCheck | StepsCheck | None = None) -> tuple[dict[str, Any], Records]:
        """The header and every whole step record (steps 0, 1, ...); a torn tail is left out and
        its length set in `torn`.

        `check(step, messages)` is called for each whole record; a ValueError from it, or any
        corruption, raises CheckpointError naming the record's byte offset and step. A
        `StepsCheck` (the run's Protocol) checks them all at once, to the same effect.
        """
        header, cols = self.read_columns(check)
        return header, list(cols)

    def read_columns(self, check: RecordCheck | StepsCheck | None = None) -> tuple[dict[str, Any], StepColumns]:
        """`read`, the records as arrays (no Python object per message until one is indexed):
        what replay and catch-up apply (`Applier.apply_all` takes them as they are)."""
        if not self.path.is_file():
            raise CheckpointError(f"message log {self.path} does not exist")
        with open(self.path, "rb") as f:
            header, start, version = read_header_at(f, self.path)
            scan = scan_records(f, self.path, start, LogFormat.of(version, header, self.path), check)
        self.torn = scan.torn
        self.changes = scan.changes
        self.seals = scan.seals
        return header, scan.records


class LogWriter:
    """Appends one record per complete step: flushed per step, fsynced by `sync` and `close`.

    On an existing log it first checks the settings fingerprint and every record (with `check`)
    and raises CheckpointError without touching the file if either fails; then it cuts off a
    torn tail (`dropped_tail` bytes) and continues at step `next_step`, in the log's own frame
    version (`version`: 1 for a log begun before frame v2). A new log is v2; its header must hold
    the integer trajectory "run.seed" the reader derives seeds from.
    """

    def __init__(self, path: Path, header: dict[str, Any], check: RecordCheck | StepsCheck | None = None) -> None:
        self.path = path
        self.dropped_tail = 0
        if path.exists():
            with open(path, "rb") as f:
                old, start, version = read_header_at(f, path)
                if "trajectory" not in old:
                    raise CheckpointError(
                        f"{path} was written by an older SeedFlood (its header has no settings fingerprint); "
                        "use a new run.out_dir or delete the directory"
                    )
                if not isinstance(header.get("trajectory"), dict):
                    raise CheckpointError(f"{path}: the header to resume with has no 'trajectory' dict of settings")
                diffs = header_mismatch(old, header)
                if diffs:
                    raise CheckpointError(
                        f"{path} belongs to a different run: settings differ: {', '.join(diffs)}; "
                        "use a new run.out_dir or delete the directory"
                    )
                self._fmt = LogFormat.of(version, old, path)
                scan = scan_records(f, path, start, self._fmt, check)
            self._start, self._ends = scan.start, scan.ends
            self.changes = scan.changes
            end = self._ends[-1] if self._ends else self._start
            self._f: IO[bytes] = open(path, "r+b")
            if scan.torn:
                self._f.truncate(end)  # drop the torn tail a crash left mid-append
                os.fsync(self._f.fileno())
                self.dropped_tail = scan.torn
            self._f.seek(end)
        else:
            self._fmt = LogFormat.of(message.VERSION_2, header, path)  # refuses a header without run.seed
            path.parent.mkdir(parents=True, exist_ok=True)
            head = encode_header(header)
            atomic_write_bytes(path, head)
            self._start, self._ends = len(head), []
            self.changes = {}
            self._f = open(path, "r+b")
            self._f.seek(0, os.SEEK_END)

    @property
    def next_step(self) -> int:
        """The step the next `append` must carry (= records in the log)."""
        return len(self._ends)

    @property
    def version(self) -> int:
        """The frame version of this log's records."""
        return self._fmt.version

    def append(self, step: int, msgs: list[Message], change: Change | None = None, seals: bytes | None = None) -> int:
        """Write step `step` (must be the next one), preceded by its membership record when it
        has a change and by its seal record when `seals` is given (a signed run:
        `stepstream.encode_seals`); flushed not fsynced; returns the bytes written."""
        if step != self.next_step:
            raise CheckpointError(f"{self.path}: appending step {step}, expected {self.next_step}")
        seed_of = self._fmt.seed_of
        if seed_of is not None:  # v2 stores no seeds: refuse what the reader would not reproduce
            if not msgs:
                raise CheckpointError(f"{self.path}: appending step {step} with no messages")
            for m in msgs:
                if m.step != step or seed_of(m.origin, m.step, m.k) != m.seed:
                    raise CheckpointError(
                        f"{self.path}: appending step {step}: message {m.id} is of another step or its seed "
                        "is not the run's derivation"
                    )
        frame = message.encode(sorted(msgs), version=self._fmt.version)
        rec = REC.pack(step, len(frame)) + frame
        if seals is not None:
            rec = REC.pack(SEAL_FLAG | step, len(seals)) + seals + rec
        if change:
            if change.step != step:
                raise CheckpointError(f"{self.path}: appending step {step} with the change of step {change.step}")
            data = change.to_bytes()
            rec = REC.pack(CHANGE_FLAG | step, len(data)) + data + rec
            self.changes[step] = change
        self._f.write(rec)  # one write: a crash leaves at most a torn tail
        self._f.flush()
        self._ends.append((self._ends[-1] if self._ends else self._start) + len(rec))
        return len(rec)

    def sync(self) -> None:
        """fsync what was appended (called at each checkpoint)."""
        self._f.flush()
        os.fsync(self._f.fileno())

    def truncate_to(self, steps: int) -> None:
        """Keep only the first `steps` records (used when resuming from an older checkpoint)."""
        if steps < 0:
            raise ValueError(f"{self.path}: truncate_to({steps}): steps must be >= 0")
        if steps >= len(self._ends):
            return
        end = self._ends[steps - 1] if steps else self._start
        self._f.flush()
        self._f.truncate(end)
        self._f.seek(end)
        os.fsync(self._f.fileno())
        del self._ends[steps:]
        self.changes = {s: c for s, c in self.changes.items() if s < steps}

    def close(self) -> None:
        if self._f.closed:
            return
        self.sync()
        self._f.close()
