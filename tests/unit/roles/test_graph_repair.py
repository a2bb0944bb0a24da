"""Graph repair after leaves, in process (docs/churn-design.md, Graph repair): with churn.repair a
committed step that leaves members out adds the edges the rule (core/membership/repair.py) gives the
committed graph; both ends grow them and heal them at an agreed exchange, and the run trains on
where, without them, the leaves would have split it or left a member alone.

Every case runs the real client loop over the in-memory network with the debug model, as
test_leave.py does (churn.settle=1, transport.timeout_s=1), and checks the survivors' bits after
every step against a replay of the decided steps and the log written from them
(`check_survivors`); each has its control without churn.repair, which stops."""

from __future__ import annotations

import logging
import re

import pytest
from test_churn import cfg_for, check_survivors, left, protocol_of

from seedflood.core import config
from seedflood.core.config.configerror import ConfigError
from seedflood.core.flood.protocol import trajectory
from seedflood.core.membership.growth import Growth
from seedflood.core.topology import resolve as topo
from seedflood.roles.inprocess import Event, SimResult, simulate

RING6 = ("topology.kind=ring", "topology.nodes=6")
LINE6 = ("topology.kind=grid", "topology.nodes=6", "topology.rows=1")  # 0 - 1 - 2 - 3 - 4 - 5
STOPPED = "no reachable majority agrees"


@pytest.fixture
def linked(caplog):
    """The edges the clients said graph repair gave them: {(low, high): {the ends that said so}}."""
    caplog.set_level(logging.WARNING, logger="seedflood.roles")

    def said() -> dict[tuple[int, int], set[int]]:
        out: dict[tuple[int, int], set[int]] = {}
        for rec in caplog.records:
            if m := re.fullmatch(r"node (\d+): graph repair after step \d+ links node (\d+)", rec.getMessage()):
                a, b = int(m[1]), int(m[2])
                out.setdefault((min(a, b), max(a, b)), set()).add(a)
        return out

    return said


def repaired(cfg: config.Config, r: SimResult) -> set[tuple[int, int]]:
    """The rule's edges for the committed changes, as every client computes them."""
    top = topo.build(cfg.topology)
    g = Growth.of({i: top.neighbors(i) for i in top.nodes}, protocol_of(cfg).delay, repair=True)
    return {e for s in r.changes for e in g.repaired(r.changes, s)}


@pytest.mark.parametrize("action", ["leave", "kill"])
def test_two_leaves_that_split_a_ring_of_six_in_halves_are_repaired_and_the_four_train_on(action, tmp_path, linked):
    """Nodes 1 then 4 leave (gracefully, or killed): without repair the ring falls into 2-3 and
    5-0, two of four members each, and every client stops; with it, 0-2 after the first leave
    and 3-5 after the second keep one ring, and the four finish on one history."""
    events = [Event(3, 1, action), Event(8, 4, action)]
    cfg = cfg_for(*RING6, "churn.repair=true", steps=14)
    r = simulate(cfg, events=events)
    assert sorted(r.hashes) == [0, 2, 3, 5] and len(set(r.hashes.values())) == 1, r.exits
    assert left(r) == {1: 3, 4: 8}
    assert repaired(cfg, r) == {(0, 2), (3, 5)} and linked() == {(0, 2): {0, 2}, (3, 5): {3, 5}}
    check_survivors(cfg, r, tmp_path)
    control = simulate(cfg_for(*RING6, steps=14), events=events)
    assert control.hashes == {} and all(STOPPED in control.exits[n] for n in (0, 2, 3, 5)), control.exits


def test_a_member_that_a_leave_leaves_alone_is_linked_and_trains_on(tmp_path, linked):
    """A line of 6: node 1 leaving leaves node 0 without an edge, node 4 leaving then node 5.
    With repair each is linked to the members with the fewest links (0 to 2 and 5, then 5 to 3)
    and all four finish; without it both are committed out and stop."""
    events = [Event(3, 1, "leave"), Event(8, 4, "leave")]
    cfg = cfg_for(*LINE6, "churn.repair=true", steps=14)
    r = simulate(cfg, events=events)
    assert sorted(r.hashes) == [0, 2, 3, 5] and len(set(r.hashes.values())) == 1, r.exits
    assert left(r) == {1: 3, 4: 8}
    assert repaired(cfg, r) == {(0, 2), (0, 5), (3, 5)} == set(linked())
    check_survivors(cfg, r, tmp_path)
    control = simulate(cfg_for(*LINE6, steps=14), events=events)
    assert STOPPED in control.exits[0] and STOPPED in control.exits[5], control.exits


def test_repair_needs_churn_and_is_not_in_the_trajectory():
    """churn.repair changes the graph, never how a committed step is applied: a log written with
    it resumes and replays without it (the trajectory is the same); a strict run refuses it.
    (Launched: tests/dist/test_repair_gloo.py.)"""
    on, off = cfg_for(*RING6, "churn.repair=true"), cfg_for(*RING6)
    p = protocol_of(on)
    assert trajectory(on, p, "digest") == trajectory(off, p, "digest")
    with pytest.raises(ConfigError, match=r"churn.repair: needs churn.settle >= 1"):
        cfg_for(*RING6, "churn.repair=true", "churn.settle=0")


def test_the_centre_of_a_star_leaves_and_the_five_left_alone_are_linked_into_a_ring(tmp_path, linked):
    """Star of 6: the centre leaving leaves every other member alone. Each commits the leave
    (the centre's goodbye brought it the votes), adds the rule's edges (a ring of 5, diameter 2,
    the star's), and heals them while alone, each with two heals to agree at once: all five
    finish on one history. (Before a lone client told the negotiation the clock it jumps to, a
    proposal of its own could be taken after its jump and both ends waited; 2 runs in 11.)"""
    cfg = cfg_for("topology.kind=star", "topology.nodes=6", "churn.repair=true", steps=10)
    r = simulate(cfg, events=[Event(3, 0, "leave")])
    assert sorted(r.hashes) == [1, 2, 3, 4, 5] and len(set(r.hashes.values())) == 1, r.exits
    assert left(r) == {0: 3}
    assert repaired(cfg, r) == {(1, 2), (1, 3), (2, 4), (3, 5), (4, 5)} == set(linked())
    check_survivors(cfg, r, tmp_path)
