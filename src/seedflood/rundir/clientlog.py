"""The clients' own logs of a churn run (eval.client_logs): each client's copy of the agreed log.

Owns, under `RunDir.clients` (`node-N/`: config.yaml, log.bin, report.json):
- `ClientLog`: one client's writer of its copy, and of its final report beside it;
- `client_report`: the report a node left there (what the evaluator reads when the store does
  not hold it);
- `steps_from_clients`: the longest client log on this disk that belongs to the run and agrees
  with its log;
- `complete_from_clients`: rank 0 appends to the run's log what only they hold, before it resumes.
So no agreed step depends on the evaluator being up when it is decided (docs/churn-design.md, Client logs).

May import: seedflood.core; rundir's atomic, layout, logfile, logheader.

Assumes: the log is the source of truth, and an agreed step is final: two logs of one run never
hold different records at one step (a difference is cut, keeping a copy, never merged).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seedflood.core.churn.certificate import StepVerifier
from seedflood.core.config import runconfig as config_mod
from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.stepstream import decode_seals, encode_seals
from seedflood.core.membership.roster import Change
from seedflood.core.wire.message import Message
from seedflood.rundir.atomic import atomic_write_text
from seedflood.rundir.layout import CONFIG, LOG, CheckpointError, RunDir
from seedflood.rundir.logfile import LogReader, LogWriter, Records
from seedflood.rundir.logheader import header_mismatch, read_header

log = logging.getLogger(__name__)

REPORT = "report.json"


class ClientLog:
    """One client's own copy of the agreed log, on its own disk: a directory `seedflood replay`
    reads like a run directory (config.yaml, log.bin in logfile.py's format, CRC-checked
    records, membership records before their steps) plus the client's final report.

    `extend(history, changes)` appends every decided step it lacks (flushed per step, fsynced
    by `close`). A restarted incarnation (or a relaunch) reopens the log its predecessor left;
    its records are compared with the history as the history reaches them, and a difference
    (never expected: agreed steps are final) cuts the log there after keeping a copy: never two
    histories in one file. One process writes a node's log at a time (an flock; a second one keeps none and says
    so). Never raises into training: a disk failure is one warning and the copy stops.

    Assumes: the caller hands the same `history` (Churn.history: every decided step from 0);
    `header` is the run's (logheader.log_header): its config is what config.yaml records."""

    def __init__(self, run: RunDir, protocol: Protocol, header: dict[str, Any], node: int) -> None:
        self.node = node
        self.dir = run.client(node)
        self.writer: LogWriter | None = None
        self._lock: Any = None
        self._held: Records | None = None  # the records a reopened log held (read at the first extend)
        self._verified = 0  # of them, those found equal to the history so far
        self._owned = False  # this process took the node's directory (its flock)
        if self.dir is None:
            return
        try:
            import fcntl

            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock = open(self.dir / ".lock", "w")
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                self._lock.close()
                self._lock = None
                log.warning("node %d: %s is held by another process of this node: no client log here", node, self.dir)
                return
            self._owned = True
            (self.dir / REPORT).unlink(missing_ok=True)  # a report left by an earlier launch is not this one's
            atomic_write_text(self.dir / CONFIG, config_mod.dump(header["config"]))
            try:
                self.writer = LogWriter(self.dir / LOG, header, check=protocol.check_step)
            except CheckpointError as e:  # another run's or a damaged log: keep it aside, start anew
                aside = self.dir / f"{LOG}.{int(time.time())}.bad"
                (self.dir / LOG).rename(aside)
                log.warning("node %d: client log %s set aside (%s)", node, aside, e)
                self.writer = LogWriter(self.dir / LOG, header, check=protocol.check_step)
        except OSError as e:
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        log.warning("node %d: client log in %s stopped: %s", self.node, self.dir, e)
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError:
                pass
        self.writer = None

    def extend(
        self,
        history: Sequence[tuple[int, list[Message]]],
        changes: dict[int, Change],
        certificates: Mapping[int, bytes] | None = None,
    ) -> None:
        """Append the steps of `history` the log lacks; steps the log already held (a reopened
        log) are compared with the history as it reaches them (see the class docstring).
        `certificates` (a signed run): each step is logged with its seals, its messages'
        signatures and the certificate of its commit where this client holds one."""
        w = self.writer
        if w is None:
            return
        try:
            if self._held is None:
                self._held = LogReader(w.path).read()[1] if w.next_step else []
            while self._verified < min(len(history), len(self._held)):
                s = self._verified
                if sorted(history[s][1]) != sorted(self._held[s][1]):
                    self._cut(s)
                    break
                self._verified += 1
            for s, msgs in history[w.next_step :]:
                seals = None if certificates is None else encode_seals(msgs, certificates.get(s, b""))
                w.append(s, msgs, changes.get(s), seals)
        except (OSError, CheckpointError) as e:
            self._fail(e)

    def _cut(self, step: int) -> None:
        """The reopened log differs from the history at `step` (never expected: agreed steps are
        final): keep a copy, cut the log there."""
        w = self.writer
        assert w is not None and self._held is not None
        aside = w.path.with_name(f"{LOG}.{int(time.time())}.old")
        shutil.copyfile(w.path, aside)
        log.warning(
            "node %d: client log differs from the decided steps at step %d: cut there (the old log is kept as %s)",
            self.node,
            step,
            aside,
        )
        w.truncate_to(step)
        del self._held[step:]

    def report(self, value: dict[str, Any]) -> None:
        """Leave the final (or stop) report next to the log, for an evaluator that reads this disk
        (after `close` too: the report comes once training and the transport are done)."""
        if self.dir is None or not self._owned:
            return
        try:
            atomic_write_text(self.dir / REPORT, json.dumps(value))
        except OSError as e:
            log.warning("node %d: could not write %s: %s", self.node, self.dir / REPORT, e)

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError as e:
                log.warning("node %d: client log close failed: %s", self.node, e)
            self.writer = None
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None


def client_report(run: RunDir, node: int, since: float | None = None) -> dict[str, Any] | None:
    """The final report node `node` left next to its client log, if this disk holds one
    (written at or after `since`, a time.time(), when given: not one an earlier launch left)."""
    d = run.client(node)
    try:
        if d is None or (since is not None and (d / REPORT).stat().st_mtime < since):
            return None
        return json.loads((d / REPORT).read_text())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Found:
    """A client log's steps: its path, records, membership changes and (a signed run) seals."""

    path: Path
    records: Records
    changes: dict[int, Change]
    seals: dict[int, bytes]


def steps_from_clients(run: RunDir, protocol: Protocol, header: dict[str, Any]) -> Found | None:
    """The longest client log readable on this disk (under `run.clients`) that belongs to this
    run (its header's settings and base model equal `header`'s), reads whole (CRC and every step
    checked as from the wire) and agrees with the run directory's own log on every step both
    hold; with its records, changes and seals. None when no client log qualifies (each refusal
    is one warning), or client logs are off."""
    root, own = run.clients, run.log
    if root is None or not root.is_dir():
        return None
    mine_reader = LogReader(own)
    _, mine = mine_reader.read() if own.is_file() else ({}, [])
    best: Found | None = None
    for path in sorted(root.glob(f"node-*/{LOG}")):
        try:
            if diff := header_mismatch(read_header(path), header):
                raise CheckpointError(f"settings differ: {', '.join(diff)}")
            reader = LogReader(path)
            _, records = reader.read(check=protocol.check_step)
        except (OSError, CheckpointError) as e:
            log.warning("client log %s not used: %s", path, e)
            continue
        differs = next(
            (
                s
                for (s, a), (_, b) in zip(mine, records)
                if sorted(a) != sorted(b) or mine_reader.changes.get(s) != reader.changes.get(s)
            ),
            None,
        )
        if differs is not None:
            log.warning("client log %s not used: it differs from %s at step %d", path, own, differs)
            continue
        if best is None or len(records) > len(best.records):
            best = Found(path, records, reader.changes, reader.seals)
    return best


def complete_from_clients(
    run: RunDir, protocol: Protocol, header: dict[str, Any], records: Records, verifier: StepVerifier | None = None
) -> Records:
    """Rank 0 before a churn run (re)starts: append to the run directory's log the steps that
    only a client log on this disk holds (`steps_from_clients`), so that neither a restarted
    evaluator nor a whole relaunch continues from less than what was agreed. Returns the
    records, extended. `verifier` (a signed run): each step is taken only if its seals prove it,
    as a streamed one; the first that fails ends what is taken (one warning line)."""
    own = run.log
    found = steps_from_clients(run, protocol, header)
    if found is None or len(found.records) <= len(records):
        return records
    path, theirs, changes = found.path, found.records, found.changes
    if verifier is not None:
        theirs = _proven(found, len(records), protocol, verifier)
        if len(theirs) <= len(records):
            return records
    writer = LogWriter(own, header, check=protocol.check_step)
    try:
        writer.truncate_to(len(records))  # a torn or unchecked tail past the records resumed from
        for s, msgs in theirs[len(records) :]:
            writer.append(s, msgs, changes.get(s), found.seals.get(s))
    finally:
        writer.close()
    log.warning("evaluator: took steps %d..%d from the client log %s", len(records), len(theirs) - 1, path)
    return list(theirs)


def _proven(found: Found, start: int, protocol: Protocol, verifier: StepVerifier) -> Records:
    """`found`'s records up to the first from `start` on that its seals do not prove (the steps
    before `start`, the run's own log holds: they chain the certificates)."""
    roster = protocol.roster()
    for s, msgs in found.records:
        change = found.changes.get(s)
        if s < start:
            verifier.extend(s, msgs, change)
        else:
            seals = found.seals.get(s)
            signed, certificate = decode_seals(seals, msgs) if seals is not None else (msgs, None)
            if (refusal := verifier.check(s, signed, change, certificate, roster)) is not None:
                log.warning("evaluator: client log %s: step %d is not taken: %s", found.path, s, refusal.reason)
                return found.records[:s]
        if change:
            roster.apply(change)
    return found.records
