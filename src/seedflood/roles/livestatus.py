"""A launched process's live status record (rundir/status.py), rewritten about once a second.

Owns `StatusLoop` (a daemon thread that reads the process's progress every `interval_s` and
writes its record atomically, then the final record: finished, stopped or failed with one line),
`Reading` (what a role says about where it stands), the two readers of it (`client_reading`,
`evaluator_reading`), `Chain` (the commit chain's digests, computed over the steps a strict
client or the evaluator applies or logs: agreement.step_digest, so every process's digests are
comparable with a churn client's committed ones) and `SentCounter` (a `ByteCounter` that keeps
its running totals, overall and per destination, so a reading costs no pass over the byte table).

Cost: the thread sleeps between records and a reading copies a few ints and at most
DIGEST_WINDOW digests and the per-peer byte counts; the training thread pays one blake2b over a
step's messages per step (strict client, evaluator: `Chain.extend`), one integer add per hop
frame received and a copy of the client's per-peer received counts (a dict of its degree) per
hop. A run directory the process cannot write (a client on a host without it) costs one
warning, then nothing.

May import: seedflood.core, rundir (layout, status), roles' client, churn and evaluator (to read them).

Assumes: readings run on another thread than the one that trains; they read values the
training thread replaces whole (ints, tuples, frozensets) or guard (`Chain`'s lock), and a torn
reading between two of them is harmless (the next record corrects it).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from seedflood.core.churn.agreement import GENESIS, step_digest
from seedflood.core.flood.transport import ByteCounter
from seedflood.core.membership.roster import Change
from seedflood.core.wire.message import Message
from seedflood.roles.churn import Churn
from seedflood.roles.client import Client
from seedflood.roles.evaluator import Evaluator
from seedflood.rundir.layout import RunDir
from seedflood.rundir.status import (
    CLIENT,
    DIGEST_WINDOW,
    EVALUATOR,
    FAILED,
    FINISHED,
    RUNNING,
    Status,
    write_status,
)

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
"""Seconds between two records of one process."""

RATE_SAMPLES = 10
"""Steps/s and bytes/s are measured over the last this many records (about 10 s)."""


def hex_digest(digest: int) -> str:
    return f"{digest:016x}"


class SentCounter(ByteCounter):
    """A `ByteCounter` that also keeps the total it has counted (`sent`, bytes) and the total
    per destination (`sent_to()`: node -> bytes; -1 the evaluator), so a reading costs no pass
    over the (step, src, dst) table."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0
        self._to: dict[int, int] = {}
        self._total_lock = threading.Lock()

    def add(self, step: int, src: int, dst: int, nbytes: int) -> None:
        super().add(step, src, dst, nbytes)
        with self._total_lock:
            self.sent += nbytes
            self._to[dst] = self._to.get(dst, 0) + nbytes

    def add_many(self, step: int, src: int, sizes: Sequence[tuple[int, int]]) -> None:
        super().add_many(step, src, sizes)  # a gloo hop's edges, counted at once
        with self._total_lock:
            for dst, nbytes in sizes:
                self.sent += nbytes
                self._to[dst] = self._to.get(dst, 0) + nbytes

    def totals(self) -> tuple[int, dict[int, int]]:
        """(bytes sent, bytes per destination), read together."""
        with self._total_lock:
            return self.sent, dict(self._to)


class Chain:
    """Digests of the commit chain over steps taken in order (strict client, evaluator): the
    newest DIGEST_WINDOW of them, for readings from another thread."""

    def __init__(self) -> None:
        self.prev = GENESIS
        self.through = -1
        self._recent: deque[tuple[int, str]] = deque(maxlen=DIGEST_WINDOW)
        self._lock = threading.Lock()

    def extend(self, step: int, msgs: Sequence[Message], change: Change | None = None) -> None:
        if step != self.through + 1:
            raise ValueError(f"the chain takes steps in order: expected {self.through + 1}, got {step}")
        self.prev = step_digest(self.prev, step, msgs, change.join if change else ())
        with self._lock:
            self._recent.append((step, hex_digest(self.prev)))
            self.through = step

    def recent(self) -> dict[int, str]:
        with self._lock:
            return dict(self._recent)


@dataclass(frozen=True)
class Reading:
    """Where a process stands (status.Status's fields of the same names)."""

    step: int
    applied: int
    committed: int
    digests: dict[int, str]
    members: list[int] | None
    peers: list[int]
    sent: int
    received: int
    edges: dict[int, tuple[int, int]] = field(default_factory=dict)  # peer -> (sent, received) bytes
    health: dict[str, int] = field(default_factory=dict)  # a churn client's counters (core/churn/health.py)


def client_reading(client: Client, counter: SentCounter, chain: Chain | None) -> Callable[[], Reading]:
    """A client's readings: a churn client's committed chain is its agreement's; a strict
    client's is `chain` (extended by the caller over every step it logs or applies)."""

    def read() -> Reading:
        mode = client.mode
        health: dict[str, int] = {}
        if isinstance(mode, Churn):
            health = mode.health.snapshot()
            agreement = mode.agreement
            through = agreement.through
            window = range(max(0, through - DIGEST_WINDOW + 1), through + 1)
            digests = {s: hex_digest(d) for s in window if (d := agreement.digests.get(s)) is not None}
            members: list[int] | None = sorted(agreement.roster.members)
        else:
            if chain is None:
                raise ValueError(f"node {client.node}: a strict client's reading needs its chain")
            through, digests, members = chain.through, chain.recent(), None
        sent, sent_to = counter.totals()
        return Reading(
            step=client.next_step,
            applied=client.applier.last_step,
            committed=through,
            digests=digests,
            members=members,
            peers=sorted(client.transport.peers),
            sent=sent,
            received=client.received_bytes,
            edges=edge_bytes(sent_to, client.received_from),
            health=health,
        )

    return read


def edge_bytes(sent: Mapping[int, int], received: Mapping[int, int]) -> dict[int, tuple[int, int]]:
    """Per peer (sent, received) bytes of the edges either side has used (-1: the evaluator)."""
    return {p: (sent.get(p, 0), received.get(p, 0)) for p in sorted(set(sent) | set(received))}


def evaluator_reading(
    next_step: Callable[[], int], applied: Callable[[], int], chain: Chain, members: Callable[[], list[int]]
) -> Callable[[], Reading]:
    """The evaluator's readings: the next step it logs, the last it applied, its chain over the
    steps it logged, and the roster it follows."""

    def read() -> Reading:
        return Reading(next_step(), applied(), chain.through, chain.recent(), members(), [], 0, 0)

    return read


class StatusLoop:
    """Writes one process's record every `interval_s` (on a daemon thread) until `end`, which
    writes the final one. A failed write (OSError) is one warning and ends the writing."""

    def __init__(
        self,
        run: RunDir,
        identity: Status,
        read: Callable[[], Reading],
        interval_s: float = INTERVAL_S,
    ) -> None:
        """`identity`: the record's fixed fields (role, node, incarnation, total, neighbours);
        the rest is filled from `read` at each record."""
        self.run = run
        self.identity = replace(identity, pid=os.getpid(), host=socket.gethostname(), started=time.time())
        self.read = read
        self.interval_s = interval_s
        self.samples: deque[tuple[float, int, int]] = deque(maxlen=RATE_SAMPLES)  # (monotonic, step, sent)
        self.t0 = time.monotonic()
        self.first: tuple[int, int] | None = None  # (step, sent) of the first reading
        self.ok = True
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one write at a time (the thread's and `end`'s)
        self._thread = threading.Thread(target=self._loop, name="status-writer", daemon=True)

    def __enter__(self) -> StatusLoop:
        self.write()
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, exc: object, *_: object) -> None:
        """Ends the loop; an exception leaving the block writes `failed` with its first line,
        unless `end` already wrote the final record."""
        if not self._stop.is_set():
            if exc is None:
                self.end(FINISHED)
            else:
                self.end(FAILED, (str(exc).splitlines() or [type(exc).__name__])[0])

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s) and self.ok:
            self.write()

    def record(self, state: str = RUNNING, reason: str | None = None, state_hash: str | None = None) -> Status:
        """The record now (a reading, its rates, the time)."""
        r = self.read()
        now = time.monotonic()
        if self.first is None:
            self.first = (r.step, r.sent)
        self.samples.append((now, r.step, r.sent))
        if state == RUNNING:
            t, step, sent = self.samples[0]
        else:  # a final record: rates over the whole run
            t, (step, sent) = self.t0, self.first
        dt = now - t
        steps_per_s = (r.step - step) / dt if dt > 0 else 0.0
        sent_per_s = (r.sent - sent) / dt if dt > 0 else 0.0
        return replace(
            self.identity,
            step=r.step,
            applied=r.applied,
            committed=r.committed,
            digests=r.digests,
            members=r.members,
            peers=r.peers,
            sent=r.sent,
            received=r.received,
            edges=r.edges,
            health=r.health,
            steps_per_s=round(steps_per_s, 3),
            sent_per_s=round(sent_per_s, 1),
            updated=time.time(),
            state=state,
            reason=reason,
            state_hash=state_hash,
        )

    def write(self, state: str = RUNNING, reason: str | None = None, state_hash: str | None = None) -> None:
        with self._lock:
            if not self.ok:
                return
            try:
                write_status(self.run, self.record(state, reason, state_hash))
            except OSError as e:
                self.ok = False
                log.warning("no live status record (%s): `seedflood status` will not show this process", e)

    def end(self, state: str, reason: str | None = None, state_hash: str | None = None) -> None:
        """Stop the loop and write the final record (FINISHED, STOPPED or FAILED)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.write(state, reason, state_hash)


def client_identity(client: Client, total: int, neighbours: Sequence[int]) -> Status:
    """A client's fixed fields (its incarnation: the churn agreement's, 1 in a strict run)."""
    incarnation = client.mode.agreement.incarnation if isinstance(client.mode, Churn) else 1
    return _blank(CLIENT, client.node, incarnation, total, neighbours)


def evaluator_identity(total: int) -> Status:
    return _blank(EVALUATOR, None, 1, total, ())


def _blank(role: str, node: int | None, incarnation: int, total: int, neighbours: Sequence[int]) -> Status:
    return Status(
        role=role,
        node=node,
        incarnation=incarnation,
        pid=0,
        host="",
        total=total,
        step=0,
        applied=-1,
        committed=-1,
        digests={},
        members=None,
        peers=[],
        neighbours=sorted(neighbours),
        sent=0,
        received=0,
        steps_per_s=0.0,
        sent_per_s=0.0,
        updated=0.0,
    )


def client_status(
    run: RunDir,
    client: Client,
    counter: SentCounter,
    records: Sequence[tuple[int, Sequence[Message]]],
    changes: Mapping[int, Change],
    neighbours: Sequence[int],
) -> StatusLoop:
    """The status loop of a client that has started (resumed or rejoined): a strict client's
    chain runs over the logged `records` (`changes`: their roster changes), then over every step
    it applies after them; a churn client's is its agreement's."""
    chain = None
    if not isinstance(client.mode, Churn):
        chain = strict = Chain()
        for s, msgs in records:
            strict.extend(s, msgs, changes.get(s))
        client.listeners.append(lambda s, msgs: strict.extend(s, msgs))
    identity = client_identity(client, client.protocol.steps, neighbours)
    return StatusLoop(run, identity, client_reading(client, counter, chain))


def evaluator_status(
    run: RunDir,
    evaluator: Evaluator,
    records: Sequence[tuple[int, Sequence[Message]]],
    changes: Mapping[int, Change],
) -> StatusLoop:
    """The evaluator's status loop: its chain runs over the logged `records` it continues from
    (`changes`: their roster changes), then over every step it takes; its members are its
    roster's (a strict run's: every client, always)."""
    chain = Chain()
    for s, msgs in records:
        chain.extend(s, msgs, changes.get(s))
    evaluator.listeners.append(chain.extend)
    read = evaluator_reading(
        lambda: evaluator.next_step,
        lambda: evaluator.applier.last_step,
        chain,
        lambda: sorted(evaluator.roster.members),
    )
    return StatusLoop(run, evaluator_identity(evaluator.protocol.steps), read)
