"""lockarrays.ArrayLockstep equals the object lockstep.Lockstep: same steps handed to apply in the
same order, the same ByteCounter rows, per-node FloodStats and held counts after every step, and
the same error (type and text) when a node would lack a message or a frame fails the receivers'
limits, on random small graphs (ring, torus, random regular, complete, path, star) under random
K, hops, delay, overlap, routing, frame version, zo.stride, resume and injected faults."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from seedflood.core.config import rng
from seedflood.core.flood import lockarrays
from seedflood.core.flood.floodtables import FloodTables
from seedflood.core.flood.lockarrays import ArrayLockstep
from seedflood.core.flood.lockstep import Lockstep
from seedflood.core.flood.protocol import schedule
from seedflood.core.topology import builders
from seedflood.core.topology.graph import Topology
from seedflood.core.wire.message import Limits, Message

FAULTS = ("none", "drop", "big_scalar", "bad_seed", "stray", "not_f32", "short_delay")


def path(n: int) -> Topology:
    return Topology("path", n, tuple((i, i + 1) for i in range(n - 1)))


def graph(kind: str, n: int, seed: int) -> Topology:
    if kind == "random_regular":
        return builders.random_regular(max(n, 4) + max(n, 4) % 2, 3, seed=seed)  # n * degree even
    if kind == "torus":
        return builders.torus(max(n, 4))
    return {"ring": builders.ring, "complete": builders.complete, "path": path, "star": builders.star}[kind](n)


@dataclass(frozen=True)
class Case:
    top: Topology
    k: int
    hops: int
    extra_delay: int
    overlap: bool
    routed: bool
    version: int
    wire: bool
    stride: bool
    steps: int
    fault: str
    resume: int  # logged steps to resume from (0: a fresh run)
    window: int = 4  # steps either side of the hop's that a receiver takes

    def due(self, o: int, s: int) -> bool:
        return (o + s) % 2 == 0

    def limits(self, t: int) -> Limits:
        return Limits(
            self.top.n,
            t - self.window,
            t + self.window,
            self.k,
            100.0,
            seed_of=lambda o, s, k: rng.derive(7, o, s, k),
            due=self.due if self.stride else None,
        )

    def estimate(self, t: int) -> dict[int, list[Message]]:
        out = {}
        for i in self.top.nodes:
            if self.stride and not self.due(i, t):
                continue
            out[i] = [Message.make(i, t, rng.derive(7, i, t, k), 0.25 + i - 0.5 * k, k) for k in range(self.k)]
        n, f = self.top.n, self.fault
        victim = (t * 3 + 1) % n
        if t == 1 and victim in out:
            msgs = out[victim]
            if f == "drop":
                msgs.pop()
            elif f == "big_scalar":
                msgs[0] = Message.make(victim, t, msgs[0].seed, 1e4, msgs[0].k)
            elif f == "bad_seed":
                msgs[0] = Message.make(victim, t, msgs[0].seed + 1, msgs[0].scalar, msgs[0].k)
            elif f == "not_f32":
                msgs[0] = Message(t, victim, msgs[0].k, msgs[0].seed, 0.1)
        if f == "stray" and t == 1:
            stray = next((i for i in self.top.nodes if i not in out), victim)
            out.setdefault(stray, []).append(Message.make(stray, t, rng.derive(7, stray, t, self.k), 1.0, self.k))
        return out


def outcome(cls: type, case: Case) -> tuple:
    """Everything observable of one run, or the error it raised (type and text)."""
    hops = case.hops or max(1, case.top.diameter)
    delay = schedule(case.top.diameter, hops)[1] + case.overlap + case.extra_delay
    if case.fault == "short_delay":
        delay = max(0, delay - 1)
    lock = cls(
        case.top,
        case.k,
        hops,
        delay,
        overlap=case.overlap,
        routed=case.routed,
        wire=case.limits if case.wire else None,
        version=case.version,
        due=case.due if case.stride else None,
    )
    applied: list = []
    seen: list = []

    def after(t: int) -> None:
        seen.append((t, [dict(vars(f.stats)) for f in lock.floods], [f.held_count for f in lock.floods]))

    try:
        start = 0
        if case.resume:
            logged = [(s, [m for ms in case.estimate(s).values() for m in ms]) for s in range(case.resume)]
            logged = [(s, sorted(m for m in ms if not case.stride or case.due(m.origin, s))) for s, ms in logged]
            cut = lock.restore(logged)
            applied.append(("restored", cut))
            start = case.resume
        lock.run(case.steps, case.estimate, lambda s, m: applied.append((s, m)), start=start, after_step=after)
    except Exception as e:  # noqa: BLE001 (the error is part of what must be equal)
        return ("error", type(e).__name__, str(e), applied)
    return ("ok", applied, lock.counter.rows(), seen)


cases = st.builds(
    Case,
    top=st.builds(
        graph,
        st.sampled_from(["ring", "torus", "random_regular", "complete", "path", "star"]),
        st.integers(2, 12),
        st.integers(0, 3),
    ),
    k=st.integers(1, 3),
    hops=st.integers(0, 3),
    extra_delay=st.integers(0, 1),
    overlap=st.booleans(),
    routed=st.booleans(),
    version=st.sampled_from([1, 2]),
    wire=st.booleans(),
    stride=st.booleans(),
    steps=st.integers(1, 5),
    fault=st.sampled_from(FAULTS),
    resume=st.integers(0, 2),
)


@settings(max_examples=300, deadline=None)
@given(cases)
def test_arrays_equal_the_object_lockstep(case):
    case = case if case.resume < case.steps else Case(**{**vars(case), "resume": 0})
    want = outcome(Lockstep, case)
    got = outcome(ArrayLockstep, case)
    event(f"{want[0]} {want[1] if want[0] == 'error' else ''}")
    assert got == want


@pytest.mark.parametrize(
    "fault,wire,version,kind",
    [
        ("none", True, 2, "ok"),
        ("drop", False, 2, "FloodError"),
        ("short_delay", True, 2, "FloodError"),
        ("big_scalar", True, 2, "FrameError"),
        ("bad_seed", True, 1, "FrameError"),
        ("bad_seed", True, 2, "FloodError"),
        ("not_f32", True, 2, "FloodError"),
        ("stray", True, 2, "FrameError"),
        ("stray", False, 2, "ok"),
    ],
)
def test_each_fault_is_met_alike(fault, wire, version, kind):
    """Every injected fault is exercised (the property above could draw them all 'ok'): each ends
    as the object lockstep ends, with the error text it raises."""
    case = Case(builders.torus(9), 2, 1, 0, False, True, version, wire, False, 4, fault, 0)
    want = outcome(Lockstep, case)
    assert (want[0] if want[0] == "ok" else want[1]) == kind
    assert outcome(ArrayLockstep, case) == want


def test_the_comparison_can_fail():
    """Control: arrays driven by full-flooding tables on a routed run count other bytes (a 3×3
    torus has edges within a BFS layer, where full flooding echoes; a 4×4 one has none)."""
    case = Case(builders.torus(9), 1, 0, 0, False, True, 2, True, False, 3, "none", 0)
    wrong = FloodTables.of(case.top, routed=False)

    class Misrouted(ArrayLockstep):
        def __init__(self, *a, **k) -> None:
            super().__init__(*a, **k, tables=wrong)

    want = outcome(Lockstep, case)
    got = outcome(Misrouted, case)
    assert got[0] == want[0] == "ok" and got[1] == want[1]
    assert got[2] != want[2]


def test_make_chooses_arrays_where_the_tables_fit(monkeypatch):
    top = builders.torus(16)
    assert isinstance(lockarrays.make(top, 1, 1, 3), ArrayLockstep)
    monkeypatch.setattr(lockarrays, "MAX_CELLS", FloodTables.cells(top) - 1)
    assert isinstance(lockarrays.make(top, 1, 1, 3), Lockstep)
    assert isinstance(lockarrays.make(top, 1, 1, 3, arrays=True), ArrayLockstep)


@pytest.mark.parametrize("top", [builders.torus(63), builders.random_regular(64, 3, seed=5)], ids=lambda t: t.name)
@pytest.mark.parametrize("hops,stride,version", [(0, False, 2), (1, True, 2), (2, False, 1)])
def test_arrays_equal_the_object_lockstep_on_larger_graphs(top, hops, stride, version):
    """Beyond the small graphs: a 7×9 torus (edges within BFS layers) and a random 3-regular
    graph of 64, with the receivers' limits, K = 2, every hop count and zo.stride. (10 steps: a
    run shorter than its delay fails in the drain, in both, when hops < diameter.)"""
    case = Case(top, 2, hops, 0, hops == 1, True, version, True, stride, 10, "none", 0, window=12)
    want = outcome(Lockstep, case)
    assert want[0] == "ok" and len(want[1]) == 10
    assert outcome(ArrayLockstep, case) == want
