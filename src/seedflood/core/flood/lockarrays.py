"""The lockstep flood as arrays: `lockstep.Lockstep`'s contract without a Flood or a frame per node.

Owns:
- `ArrayLockstep`: every node of a strict run flooding in the client's schedule (lockstep.Driver),
  with the state as arrays of ids and scalars. The messages a local step originates form a
  *wave*; where a wave's messages are after r hops is fixed by the graph (floodtables.py: the
  routed or full-flooding rule of flooding.Flood), so per hop the frame of every directed edge
  is a reduction over the (origin, edge) pairs of that hop: its message count, largest origin,
  largest k and step span give its exact size by message.encode's width rule (transport.HEADER
  + frame; v1's fixed records too), counted once per directed edge and hop at the hop's local
  step, as Lockstep counts them. Completeness of a step at node u is dist(o, u) <= the hops its
  wave made, for every due origin o; the same `FloodError` (node, missing ids) is raised when a
  node would lack a message. With `wire`, every transmitted message is checked against the
  receivers' limits of that hop (origin, step window, k, scalar, zo.stride, v1's seed); a frame
  holding one that fails, or whose encoding is unusual, is encoded and decoded with the real
  codec, which raises exactly what Lockstep raises. A message whose decoded copy would differ
  from the original (a seed not derived, a scalar not float32) makes the step's nodes disagree,
  as in Lockstep. Per-node `FloodStats` and held counts are kept as arrays (`floods`).
  A wave's step, once applied, is dropped by every node: its pending copies go out one last hop
  and are duplicates at their receivers, as in Flood.
- `make`: the one place that chooses: `ArrayLockstep` unless its tables would not fit
  (`MAX_CELLS`), else the object `Lockstep`.

Assumes: what Lockstep assumes (a strict run: messages only, no churn, no signing). A failing
hop raises before counting it (Lockstep counts the frames before the bad one).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from seedflood.core.flood import arraywire
from seedflood.core.flood.flooding import FloodError, FloodStats, MessageId
from seedflood.core.flood.floodtables import FloodTables
from seedflood.core.flood.lockstep import Apply, Driver, Lockstep
from seedflood.core.flood.transport import ByteCounter
from seedflood.core.topology.graph import Topology
from seedflood.core.wire import message
from seedflood.core.wire.message import Limits, Message

MAX_CELLS = 1 << 25
"""Origin × directed-edge cells (floodtables.FloodTables.cells) up to which `make` picks arrays:
a torus of about 2,900 nodes, whose tables take a few hundred MB while they are built."""

_FAR = np.iinfo(np.int32).max  # the hops a restored message "made": held everywhere


@dataclass(frozen=True)
class NodeView:
    """What a node's Flood reports, read off the arrays (sharedmodel's summary, the scaling bench)."""

    node: int
    stats: FloodStats
    held_count: int


@dataclass(eq=False)
class Wave:
    """Messages of one step originated at once (or restored: held everywhere, never sent)."""

    step: int
    msgs: list[Message]
    n: int
    restored: bool = False
    r: int = 0  # hops made
    applied: bool = False
    origin: np.ndarray = field(init=False)
    k: np.ndarray = field(init=False)
    scalar: np.ndarray = field(init=False)
    count: np.ndarray = field(init=False)  # (n,) messages per origin
    max_k: np.ndarray = field(init=False)  # (n,) largest k per origin (-1: none)
    held: np.ndarray = field(init=False)  # (n,) messages of this wave each node holds
    odd: np.ndarray = field(init=False)  # messages only the real codec may frame (they may raise there)
    checked: dict[str, tuple[object, np.ndarray]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        m = len(self.msgs)
        self.origin = np.fromiter((x.origin for x in self.msgs), dtype=np.int64, count=m)
        self.k = np.fromiter((x.k for x in self.msgs), dtype=np.int64, count=m)
        self.scalar = np.fromiter((x.scalar for x in self.msgs), dtype=np.float64, count=m)
        mine = (self.origin >= 0) & (self.origin < self.n)  # (a resumed log's strays are held, never sent)
        self.count = np.bincount(self.origin[mine], minlength=self.n).astype(np.int64)
        self.max_k = np.full(self.n, -1, dtype=np.int64)
        np.maximum.at(self.max_k, self.origin[mine], self.k[mine])
        self.held = np.full(self.n, m, dtype=np.int64) if self.restored else self.count.copy()
        big = (self.k < 0) | (self.k >= 1 << 16) | (self.step < 0) | (self.step >= 1 << 32)
        usual = [_packs(x.scalar) and 0 <= x.seed < 1 << 64 for x in self.msgs]
        self.odd = big | ~np.array(usual, dtype=bool).reshape(m)


def _packs(x: float) -> bool:
    """Whether struct's float32 packs x (a finite value beyond float32 raises OverflowError there)."""
    return not math.isfinite(x) or abs(x) <= _F32_MAX


_F32_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]


class ArrayLockstep(Driver):
    """lockstep.Lockstep's contract, as arrays (see the module doc)."""

    def __init__(
        self,
        top: Topology,
        perturbations: int,
        hops: int,
        delay: int,
        *,
        overlap: bool = False,
        routed: bool = True,
        wire: Callable[[int], Limits] | None = None,
        version: int = message.VERSION,
        counter: ByteCounter | None = None,
        due: Callable[[int, int], bool] | None = None,
        tables: FloodTables | None = None,
    ) -> None:
        """As lockstep.Lockstep; `tables`: the graph's (floodtables.FloodTables.of(top, routed))."""
        if version not in (message.VERSION_1, message.VERSION_2):
            raise ValueError(f"message.encode: unknown frame version {version}")
        self.top = top
        self.n = top.n
        self.per_origin = perturbations
        self.hops, self.delay, self.overlap = hops, delay, overlap
        self.wire = wire
        self.version = version
        self.due = due
        self.counter = counter if counter is not None else ByteCounter()
        self.tables = tables if tables is not None else FloodTables.of(top, routed)
        self.applied = -1
        """Every step <= this was handed out (at every node)."""
        self._waves: list[Wave] = []
        self._staged: dict[int, list[Message]] = {}  # step -> originated since the last hop
        self._ids: dict[int, set[MessageId]] = {}  # step -> ids held (not applied)
        self._bytes: dict[int, np.ndarray] = {}  # local step -> bytes per directed edge, not yet counted
        n = self.n
        self._originated, self._received, self._new, self._forwarded = (np.zeros(n, np.int64) for _ in range(4))

    # -- views -------------------------------------------------------------------------------------
    @property
    def floods(self) -> list[NodeView]:
        """Each node's stats and held count, as its Flood would report them."""
        self._settle()
        held = np.zeros(self.n, np.int64)
        for w in self._waves:
            if not w.applied:
                held += w.held
        cols = [a.tolist() for a in (self._originated, self._received, self._new, self._forwarded, held)]
        return [
            NodeView(u, FloodStats(o, r, nw, r - nw, f), h)
            for u, (o, r, nw, f, h) in enumerate(zip(*cols, strict=True))
        ]

    # -- resume and originate ----------------------------------------------------------------------
    def restore(self, records: Sequence[tuple[int, Sequence[Message]]]) -> int:
        """lockstep.Lockstep.restore."""
        if self.applied >= 0:
            raise FloodError("lockstep: restore must come before the first step")
        cut = max(0, len(records) - self.delay)
        by_step: dict[int, list[Message]] = {}
        for _, msgs in records[cut:]:
            for m in msgs:
                if m.step <= cut - 1:
                    raise FloodError(f"cannot restore message {m.id}: step {m.step} is already applied")
                ids = self._ids.setdefault(m.step, set())
                if m.id in ids:
                    raise FloodError(f"message {m.id} restored twice")
                ids.add(m.id)
                by_step.setdefault(m.step, []).append(m)
        self._waves += [Wave(s, msgs, self.n, restored=True, r=_FAR) for s, msgs in sorted(by_step.items())]
        self.applied = cut - 1
        return cut

    def originate(self, node: int, msgs: Sequence[Message]) -> None:
        """flooding.Flood.originate at `node` (they leave at the next hop)."""
        for m in msgs:
            if m.origin != node:
                raise FloodError(f"node {node} cannot originate a message of origin {m.origin}")
            ids = self._ids.setdefault(m.step, set())
            if m.step <= self.applied or m.id in ids:
                raise FloodError(f"message {m.id} originated twice")
            ids.add(m.id)
            self._staged.setdefault(m.step, []).append(m)
            self._originated[node] += 1

    def _settle(self) -> None:
        """Staged originations become waves (one per step)."""
        if self._staged:
            self._waves += [Wave(s, msgs, self.n) for s, msgs in sorted(self._staged.items())]
            self._staged = {}

    # -- hops ----------------------------------------------------------------------------------------
    def run_hops(self, t: int) -> None:
        """The hops of local step t, then their bytes to the counter."""
        for _ in range(self.hops):
            self._hop(t)
        self._count()

    def hop(self, t: int) -> None:
        """One hop of local step t (lockstep.Lockstep.hop), counted."""
        self._hop(t)
        self._count()

    def _hop(self, t: int) -> None:
        """Every wave in flight moves one hop: its (origin, edge) pairs of this hop become the
        frames' columns, its first copies become new messages at their receivers; the frames
        are checked (`wire`), sized and their bytes kept for `_count`."""
        self._settle()
        tab, n = self.tables, self.n
        live = [w for w in self._waves if not w.restored and w.r < len(tab.hops)]
        frames = arraywire.Frames.empty(len(tab.src))
        limits = self.wire(t) if self.wire is not None else None
        suspects: list[tuple[Wave, np.ndarray]] = []
        for w in live:
            pairs = tab.hops[w.r]
            per_pair = w.count[pairs.origin]
            frames.add(pairs, per_pair, w.max_k[pairs.origin], w.step)
            if not w.applied:  # a dropped step's copies are never new (flooding.Flood._add)
                got = np.bincount(tab.dst[pairs.edge[pairs.first]], weights=per_pair[pairs.first], minlength=n)
                got = got.astype(np.int64)
                w.held += got
                self._new += got
            sent = pairs.senders[w.origin]
            bad = w.odd & sent
            if limits is not None:
                bad |= sent & ~arraywire.accepted(w, limits, self.version)
            if bad.any():
                suspects.append((w, bad))
        if suspects:
            arraywire.exact(self, live, suspects, limits, t)
        self._bytes.setdefault(t, np.zeros(len(tab.src), np.int64))[:] += frames.sizes(self.version)
        self._forwarded += np.bincount(tab.src, weights=frames.count, minlength=n).astype(np.int64)
        self._received += np.bincount(tab.dst, weights=frames.count, minlength=n).astype(np.int64)
        for w in live:
            w.r += 1
        self._waves = [w for w in self._waves if not (w.applied and w in live)]  # its last copies went out

    def _count(self) -> None:
        """Hand the bytes of the hops run so far to the counter (one add per directed edge and step)."""
        src, dst = self.tables.src.tolist(), self.tables.dst.tolist()
        for t, sizes in sorted(self._bytes.items()):
            per_src: dict[int, list[tuple[int, int]]] = {}
            for a, b, size in zip(src, dst, sizes.tolist()):
                per_src.setdefault(a, []).append((b, size))
            for a, rows in per_src.items():
                self.counter.add_many(t, a, rows)
        self._bytes = {}

    # -- apply ---------------------------------------------------------------------------------------
    def apply_through(self, upto: int, apply: Apply) -> None:
        """lockstep.Lockstep.apply_through: each step complete at every node, held alike, once."""
        self._settle()
        while self.applied < upto:
            s = self.applied + 1
            waves = [w for w in self._waves if w.step == s and not w.applied]
            expected = self._expected(s)
            self._check_complete(s, waves, expected)
            keep = set(expected)
            if self.wire is not None and self.n > 1:
                arraywire.check_alike(self, s, waves, keep)
            msgs = sorted(m for w in waves for m in w.msgs if m.origin in keep)
            for w in waves:
                w.applied = True
            self._waves = [w for w in self._waves if not (w.applied and (w.restored or w.r >= len(self.tables.hops)))]
            self._ids.pop(s, None)
            self.applied = s
            apply(s, msgs)

    def _expected(self, step: int) -> list[int]:
        """flooding.Flood.expected: the origins due at `step`, ascending."""
        due = self.due
        return list(range(self.n)) if due is None else [o for o in range(self.n) if due(o, step)]

    def _check_complete(self, s: int, waves: list[Wave], expected: list[int]) -> None:
        """FloodError (as Lockstep's) naming the first node lacking a due message of step s."""
        k_n = self.per_origin
        reach = np.full((self.n, k_n), -1, dtype=np.int64)  # hops each (origin, k) made; -1: never originated
        for w in waves:
            ok = (w.k >= 0) & (w.k < k_n) & (w.origin >= 0) & (w.origin < self.n)
            reach[w.origin[ok], w.k[ok]] = w.r
        if not expected or not k_n:
            return
        e = np.asarray(expected, dtype=np.int64)
        need = reach[e]  # (|E|, K)
        short = self.tables.dist[e] > need.min(axis=1)[:, None]  # (|E|, n): some k of o not at u
        lacking = short.any(axis=0)
        if not lacking.any():
            return
        u = int(np.argmax(lacking))
        far = self.tables.dist[e, u]
        missing = [(o, s, k) for i, o in enumerate(expected) for k in range(k_n) if far[i] > need[i, k]]
        raise FloodError(f"lockstep: step {s} incomplete at node {u} after its hops (missing {missing[:4]})")


AnyLockstep = Lockstep | ArrayLockstep


def make(
    top: Topology,
    perturbations: int,
    hops: int,
    delay: int,
    *,
    overlap: bool = False,
    routed: bool = True,
    wire: Callable[[int], Limits] | None = None,
    version: int = message.VERSION,
    counter: ByteCounter | None = None,
    due: Callable[[int, int], bool] | None = None,
    arrays: bool | None = None,
) -> AnyLockstep:
    """The lockstep flood of a run (arguments as lockstep.Lockstep): `ArrayLockstep` when
    `arrays` is True, or None and the graph's tables fit in MAX_CELLS; else the object Lockstep."""
    kw = dict(overlap=overlap, routed=routed, wire=wire, version=version, counter=counter, due=due)
    if arrays if arrays is not None else FloodTables.cells(top) <= MAX_CELLS:
        return ArrayLockstep(top, perturbations, hops, delay, **kw)  # type: ignore[arg-type]
    return Lockstep(top, perturbations, hops, delay, **kw)  # type: ignore[arg-type]
