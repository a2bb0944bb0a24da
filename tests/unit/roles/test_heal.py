"""Healed edges (docs/churn-design.md, Healed edges): a churn client's dropped edge to a live member
comes back, a stalled client that wakes still a member rejoins through its neighbours without a
restart, and a cut link that heals carries frames again; one history throughout.

Every case runs the real client loop over the in-memory network with the debug model, as
test_churn.py does, and checks every client's bits after every step against a replay of the
decided steps."""

from __future__ import annotations

import logging
import re

import pytest
from test_churn import PACED, RING8_1HOP, cfg_for, check_one_history, check_survivors, joined, left, protocol_of

from seedflood.core.churn import edges
from seedflood.roles.churn import Churn
from seedflood.roles.inprocess import Event, simulate


class Lines(logging.Handler):
    """The log lines of the churn strategy (who healed which edge, at which hop)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def lines():
    watch = Lines()
    logger = logging.getLogger("seedflood.roles.churn")
    level = logger.level  # its own: a bench run earlier in this worker may set "seedflood" to ERROR
    logger.setLevel(logging.WARNING)
    logger.addHandler(watch)
    try:
        yield watch.lines
    finally:
        logger.removeHandler(watch)
        logger.setLevel(level)


def test_a_stalled_bridge_after_a_cut_wakes_heals_its_edges_and_all_eight_train_on(tmp_path, lines):
    """The ring of 8 (one hop a step) loses link 0-1, then node 4 stalls past the timeout: its
    neighbours drop it and the ring falls into {1, 2, 3}, {4} and {5, 6, 7, 0}, no part a majority,
    before step 0 could commit (its ballot-0 votes were still crossing the cut ring). Without
    healing every client stopped ("step 0 was not committed within 36 extra hops"). Node 4 wakes
    still a member; its edges to 3 and 5 heal, and all eight finish on one hash, nobody left."""
    cfg = cfg_for(*RING8_1HOP, PACED, steps=24)
    r = simulate(cfg, events=[Event(3, 0, "cut", 1), Event(6, 4, "stall", 1.3)])
    assert r.exits == {} and sorted(r.hashes) == list(range(8)), r.exits
    assert len(set(r.hashes.values())) == 1 and r.changes == {}
    healed = {
        tuple(map(int, m.groups())) for line in lines if (m := re.match(r"node (\d+): edge to node (\d+) healed", line))
    }
    assert {(4, 3), (3, 4), (4, 5), (5, 4)} <= healed, lines  # (node, peer): both ends of both edges
    check_one_history(r)
    check_survivors(cfg, r, tmp_path)


def test_control_stall_without_heals_stops_all(monkeypatch):
    """The control: with `edges.heal_ok` offering no edge to heal, the same cut and stall leave
    every client stopped (node 4 wakes to no edge)."""
    monkeypatch.setattr(edges, "heal_ok", lambda m: {})
    r = simulate(cfg_for(*RING8_1HOP, PACED, steps=24), events=[Event(3, 0, "cut", 1), Event(6, 4, "stall", 1.3)])
    assert r.hashes == {} and sorted(r.exits) == list(range(8)), r.exits


def test_a_cut_link_that_heals_carries_frames_again_and_changes_no_bit(tmp_path, lines):
    """A cut on a connected graph costs copies, not bits; healed, the link carries hops again
    from the exchange index both ends agreed on (byte counts on it after the heal step)."""
    cfg = cfg_for(*RING8_1HOP, steps=16)
    r = simulate(cfg, events=[Event(3, 0, "cut", 1), Event(6, 0, "heal", 1)])
    assert r.exits == {} and r.changes == {}
    after = {(a, b) for s, a, b, n in r.counter.rows() if s >= 7 and {a, b} == {0, 1}}
    assert after == {(0, 1), (1, 0)}
    assert any("node 0: edge to node 1 healed" in line for line in lines), lines
    assert r.hashes == simulate(cfg).hashes
    check_survivors(cfg, r, tmp_path)


def test_an_even_split_whose_cut_heals_trains_on_as_one(tmp_path):
    """Cutting 0-1 and 4-5 splits the ring of 8 in two halves, neither a majority (without a
    heal everyone stops: test_churn.py, test_an_even_split_stops_everyone); the link 0-1 comes
    back two steps later, while the halves wait, and all eight finish on one history."""
    cfg = cfg_for(*RING8_1HOP, steps=16)
    r = simulate(cfg, events=[Event(4, 0, "cut", 1), Event(4, 4, "cut", 5), Event(6, 0, "heal", 1)])
    assert r.exits == {} and sorted(r.hashes) == list(range(8)), r.exits
    assert left(r) == {}
    check_one_history(r)
    check_survivors(cfg, r, tmp_path)


def test_control_split_without_heals_stops_all(monkeypatch):
    """The control: with `edges.heal_ok` offering no edge to heal, link 0-1 works again but
    nobody reconnects it, and both halves stop as without the heal."""
    monkeypatch.setattr(edges, "heal_ok", lambda m: {})
    cfg = cfg_for(*RING8_1HOP, steps=16)
    r = simulate(cfg, events=[Event(4, 0, "cut", 1), Event(4, 4, "cut", 5), Event(6, 0, "heal", 1)])
    assert r.hashes == {} and sorted(r.exits) == list(range(8)), r.exits


def test_a_restarted_client_cut_off_from_two_neighbours_is_sponsored_by_the_one_it_can_reach(tmp_path):
    """Node 5 of the 2×4 torus (neighbours 1, 4, 6) dies, its links to 1 and 4 are cut, and it
    restarts: a sponsor across a cut would win the claim, fail to reach it and end its life; only
    node 6 may sponsor it, and it joins and counts again."""
    cfg = cfg_for(PACED, steps=20)
    events = [Event(3, 5, "kill"), Event(4, 1, "cut", 5), Event(4, 4, "cut", 5), Event(8, 5, "restart")]
    r = simulate(cfg, events=events)
    assert r.exits == {} and sorted(r.hashes) == list(range(8)), r.exits
    assert left(r) == {5: 3} and 5 in joined(r)
    check_survivors(cfg, r, tmp_path)


def test_clients_that_waited_a_hop_through_a_cut_step_on_the_hop_clocks_phase_again(monkeypatch):
    """The ring of 8 at 4 hops a step (diameter 4): while link 0-1 is cut the ring is a line of
    diameter 7, and the clients near the cut wait a hop for the votes of the far end before they
    apply a step. Each then begins its next step a hop off the shared hop clock's phase, and
    before `loop.step_hops` it stayed off for the rest of the run: its forwards ran while its
    neighbours waited in an exchange, and theirs while it waited, every later step slower
    (1.8x, docs/benchmarks.md). Now each step's hops end on the phase: once the link is back
    every client begins every step on it."""
    starts: dict[int, list[tuple[int, int]]] = {}
    step = Churn.step

    def watched(self: Churn, t: int) -> None:
        starts.setdefault(self.host.node, []).append((t, self.host.hops_run))
        step(self, t)

    monkeypatch.setattr(Churn, "step", watched)
    cfg = cfg_for("topology.kind=ring", "topology.nodes=8", steps=12)
    hops = protocol_of(cfg).hops
    r = simulate(cfg, hash_every_step=False, events=[Event(2, 0, "cut", 1), Event(4, 0, "heal", 1)])
    assert r.exits == {} and len(set(r.hashes.values())) == 1
    off = {n: [t for t, at in s if at % hops] for n, s in starts.items()}
    assert any(off.values()), "no client waited a hop: the run does not show the drift"
    assert all(t < 9 for ts in off.values() for t in ts), off
