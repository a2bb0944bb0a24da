"""Verification by recomputation: a client recomputes peers' scalars (docs/trust.md).

Owns one client's side of `trust.audit`:
- at local step t, right after its own estimate and on the same bits (every client holds the
  same state when it estimates step t), it recomputes the K scalars of step t of each origin the
  draw gives it (`core/flood/audits.py`): that origin's batch (`loss_of(origin, t)`) and
  direction, through `zo.two_point`, the code path of its own estimate (2 forwards a scalar);
- when that origin's message arrives it compares the scalars (`audits.agrees`): f32 equality
  (same hardware and software give the same bits), or, with `trust.audit_tolerance` (a run
  mixing kinds of hardware), agreement within `Protocol.scalar_tolerance`. A mismatch stops a strict run with one line naming the origin
  and the step; under churn the origin becomes this client's evidence (`liars`, which the
  voter proposes against, exactly as two copies of one id) and a RECOMPUTE note floods;
- under churn, on a RECOMPUTE note, it re-checks: it recomputes the scalar itself on its
  snapshot of the state step s was estimated on (a CPU copy of the trainable parameters and the
  direction's extra state, kept for the last `keep` steps only while trust.audit > 0), and takes
  the evidence only if its own recomputation agrees with the note's and not with the scalar the
  origin sent (`audits.confirms`; without a tolerance: equals and differs); otherwise the note is dropped and counted against its signer (`stats.false`), and
  that signer's later notes are dropped unchecked (so false notes cost each client at most one
  re-check, 2 forwards, per sender; true ones one per accused origin).

Assumes: `loss_of(origin, step)` is origin's batch of `step` under the active perturbation (the
data every client can rebuild; a client with private data cannot be audited); the client calls
`step` inside its estimate and `received` after each frame is taken; in a strict run with
overlap `received` runs on the hop thread, hence the lock.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from seedflood.core.flood import audits
from seedflood.core.flood.flooding import Flood, FloodError
from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.signing import Signing
from seedflood.core.membership.notes import RECOMPUTE, Note, recompute_note, recomputed
from seedflood.core.wire.message import Message
from seedflood.core.zo import estimate as zo
from seedflood.core.zo.directions import Direction
from seedflood.core.zo.replay import Applier

log = logging.getLogger(__name__)

Id = tuple[int, int, int]  # (origin, step, k)


class AuditError(FloodError):
    """A strict run's peer sent a scalar that does not recompute (strict has no exclusion)."""


@dataclass
class AuditStats:
    recomputed: int = 0
    """Peers' scalars recomputed as an auditor (2 forwards each)."""
    rechecked: int = 0
    """Scalars recomputed to re-check another client's evidence (2 forwards each)."""
    seconds: float = 0.0
    """Wall time of those forwards (and of snapshots)."""
    found: dict[int, tuple[int, int]] = field(default_factory=dict)
    """origin -> (its step whose scalar did not recompute, local step at which this client took
    the evidence: its own recomputation or a re-checked note), the first time only."""
    sent: int = 0
    """RECOMPUTE notes this client originated."""
    false: Counter[int] = field(default_factory=Counter)
    """signer -> its RECOMPUTE notes that did not re-check here (dropped)."""
    stale: int = 0
    """RECOMPUTE notes of a step this client holds no snapshot of any more (dropped, not counted)."""

    @property
    def forwards(self) -> int:
        return 2 * (self.recomputed + self.rechecked)

    def report(self) -> dict[str, object]:
        """JSON-ready, for a launched client's final report."""
        return {
            "recomputed": self.recomputed,
            "rechecked": self.rechecked,
            "forwards": self.forwards,
            "seconds": round(self.seconds, 3),
            "found": {str(o): list(st) for o, st in sorted(self.found.items())},
            "sent": self.sent,
            "false": {str(o): c for o, c in sorted(self.false.items())},
            "stale": self.stale,
        }


@dataclass(frozen=True)
class _Snapshot:
    params: tuple[torch.Tensor, ...]  # CPU copies of the trainable tensors
    extra: dict[str, torch.Tensor]  # the direction's extra state (subcge: its pending core)


class Auditor:
    """One client's recomputation of its peers' scalars (module docstring)."""

    def __init__(
        self,
        node: int,
        protocol: Protocol,
        direction: Direction,
        loss_of: Callable[[int, int], float],
        flood: Flood,
        applier: Applier,
        *,
        churn: bool,
        targets: Callable[[], Collection[int]],
        signing: Signing | None = None,
        liars: dict[int, str] | None = None,
    ) -> None:
        self.node = node
        self.protocol = protocol
        self.direction = direction
        self.loss_of = loss_of
        self.flood = flood
        self.applier = applier
        self.churn = churn
        self.targets = targets  # origins that count now (churn: the committed roster)
        self.signing = signing
        self.keep = 2 * (protocol.delay + 1)
        """Steps a recomputation, a received scalar and (churn) a snapshot are kept: a message
        arrives within delay + 1 steps of its step, and the evidence about it as long again."""
        self.liars: dict[int, str] = {} if liars is None else liars  # under churn: the voter's evidence
        """origin -> the one line of evidence against it held here (the voter proposes against it)."""
        self.stats = AuditStats()
        self._due: dict[Id, float] = {}  # recomputed here, the message not yet seen
        self._sent: dict[Id, float] = {}  # the scalar each origin sent (first copy), recent steps
        self._snapshots: dict[int, _Snapshot] = {}  # churn: step -> the state it was estimated on
        self._waiting: list[Note] = []  # RECOMPUTE notes whose message has not arrived yet
        self._lock = threading.Lock()

    # -- at local step t ------------------------------------------------------------------------
    def step(self, t: int, own: Sequence[Message]) -> None:
        """Right after this client's own estimate of step t (the same bits): recompute the
        drawn origins' scalars of step t, compare those already here, and (churn) keep a
        snapshot of the state for re-checks."""
        p = self.protocol
        began = time.perf_counter()
        basis = audits.basis(self.applier.last_messages)
        secret = audits.private(self.signing, t)
        due: dict[Id, float] = {}
        for o in sorted(o for o in self.targets() if o not in self.liars):
            if audits.chosen(basis, secret, self.node, o, t, p.audit):
                for k in range(p.perturbations):
                    due[(o, t, k)] = self._scalar(o, t, k)
                    self.stats.recomputed += 1
        if self.churn:
            self._snapshots[t] = _Snapshot(
                tuple(q.detach().to("cpu", copy=True) for q in self.direction.params), self.direction.extra_state()
            )
        self.stats.seconds += time.perf_counter() - began
        with self._lock:
            for m in own:
                self._sent[m.id] = m.scalar
            for key in [k for k in self._due if k[1] < t - self.keep]:
                del self._due[key]  # its message never came: the message rule's business
            for key in [k for k in self._sent if k[1] < t - self.keep]:
                del self._sent[key]
            for s in [s for s in self._snapshots if s < t - self.keep]:
                del self._snapshots[s]
            self._due.update(due)
            for key in [k for k in due if k in self._sent]:  # a churn peer ahead of this client
                self._compare(key, self._sent[key], t)
        self._recheck_waiting(t)

    # -- on a frame -----------------------------------------------------------------------------
    def received(self, items: Sequence[object], t: int) -> None:
        """The items a frame brought that were new here (the flood checked them), at local step t."""
        notes = []
        with self._lock:
            for m in items:
                if isinstance(m, Message):
                    if m.id not in self._sent and m.step >= t - self.keep:
                        self._sent[m.id] = m.scalar
                    if m.id in self._due:
                        self._compare(m.id, m.scalar, t)
                elif isinstance(m, Note) and m.kind == RECOMPUTE and self.churn:
                    notes.append(m)
        self._waiting += notes
        if notes or self._waiting:
            self._recheck_waiting(t)

    def _compare(self, key: Id, scalar: float, t: int) -> None:
        """The origin's scalar against this client's recomputation of it (lock held)."""
        mine = self._due.pop(key)
        tolerance = self.protocol.scalar_tolerance
        if audits.agrees(scalar, mine, tolerance):
            return
        o, s, k = key
        beyond = f" ({abs(scalar - mine):.3g} apart, the audit tolerance is {tolerance:.3g})" if tolerance else ""
        line = (
            f"node {o}'s scalar of step {s} (k {k}) is {scalar!r}, node {self.node} recomputed {mine!r} "
            f"on the same state and batch{beyond}: it did not follow the estimator"
        )
        if not self.churn:
            raise AuditError(f"{line}; a strict run has no exclusion, so it stops")
        self._take(o, s, t, line)
        self.flood.originate_notes([recompute_note(self.node, o, s, k, mine)])
        self.stats.sent += 1

    def _take(self, origin: int, step: int, t: int, line: str) -> None:
        if origin not in self.liars:
            self.liars[origin] = line
            self.stats.found[origin] = (step, t)

    # -- re-checking another client's evidence (churn) --------------------------------------------
    def _recheck_waiting(self, t: int) -> None:
        """Re-check every held RECOMPUTE note whose origin's message is here; keep the others
        while their step is recent."""
        waiting, self._waiting = self._waiting, []
        for note in waiting:
            accused, k, claimed = recomputed(note)
            key = (accused, note.step, k)
            if accused in self.liars or accused == self.node:
                continue  # already evidence here; or about this client, which knows what it sent
            if self.stats.false[note.origin]:
                self.stats.false[note.origin] += 1  # a sender of false evidence is not re-checked again:
                continue  # one re-check per sender bounds what its notes can cost this client
            if note.step not in self._snapshots:
                if note.step > t:
                    self._waiting.append(note)  # this client has not estimated that step yet
                else:
                    self.stats.stale += 1
                continue
            if key not in self._sent:
                self._waiting.append(note)  # its message is still on its way
                continue
            began = time.perf_counter()
            with self._state(self._snapshots[note.step]):
                mine = self._scalar(accused, note.step, k)
            self.stats.rechecked += 1
            self.stats.seconds += time.perf_counter() - began
            sent = self._sent[key]
            if audits.confirms(sent, claimed, mine, self.protocol.scalar_tolerance):
                self._take(
                    accused,
                    note.step,
                    t,
                    f"node {accused}'s scalar of step {note.step} (k {k}) is {sent!r}; node {note.origin} "
                    f"recomputed {claimed!r} and so did node {self.node}: it did not follow the estimator",
                )
            else:
                if not self.stats.false[note.origin]:
                    log.error(
                        "node %d: node %d's evidence against node %d (step %d, k %d: %r) does not re-check "
                        "(recomputed %r, sent %r): dropped, counted against node %d",
                        self.node,
                        note.origin,
                        accused,
                        note.step,
                        k,
                        claimed,
                        mine,
                        sent,
                        note.origin,
                    )
                self.stats.false[note.origin] += 1

    # -- the estimator on a peer's batch --------------------------------------------------------
    def _scalar(self, origin: int, step: int, k: int) -> float:
        """origin's scalar of (step, k) on the current bits, as f32 (as it travels)."""
        p = self.protocol
        seed = p.seed(origin, step, k)
        scalar = zo.two_point(lambda: self.loss_of(origin, step), self.direction, seed, step, p.eps)
        return Message.make(origin, step, seed, scalar, k).scalar

    @contextlib.contextmanager
    def _state(self, snap: _Snapshot) -> Iterator[None]:
        """Forwards inside see the snapshot's bits; the live tensors are only swapped out (their
        storage untouched) and the direction's extra state is restored after."""
        params = self.direction.params
        live = [q.data for q in params]
        extra = self.direction.extra_state()
        try:
            for q, saved in zip(params, snap.params):
                q.data = saved.to(q.device)
            self.direction.load_extra_state(snap.extra)
            yield
        finally:
            for q, orig in zip(params, live):
                q.data = orig
            self.direction.load_extra_state(extra)
