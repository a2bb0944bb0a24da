"""Graceful leave (docs/churn-design.md, Graceful leave): a churn client asked to leave stops
originating, hops on until a committed step leaves it out, then closes its edges with its
neighbours at the hop its LEAVE note names and stops with one line; nobody drops it as failed.

Every case runs the real client loop over the in-memory network with the debug model, as
test_churn.py does, and checks the survivors' bits after every step against a replay of the
decided steps and the log written from them."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Iterator

import pytest
from test_churn import PACED, RING8_1HOP, cfg_for, check_survivors, joined, left, protocol_of

from seedflood.comm import identity
from seedflood.core.config import runconfig as config
from seedflood.core.flood.hop import decode_hop, encode_hop
from seedflood.core.membership.notes import LEAVE, leave_note
from seedflood.roles.inprocess import Event, SimResult, simulate


class Lines(logging.Handler):
    """Every log record of the roles (churn, in-process) and the in-memory transport."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lost(self, node: int) -> list[str]:
        """The failure path's lines about `node`: a neighbour lost it, or dropped it. (A client
        that finishes closes its edges, which a neighbour still draining logs as a lost peer:
        that end of a run is not what these tests look at.)"""
        return [m for r in self.records if f"lost peer {node} " in (m := r.getMessage()) or f"dropped node {node}" in m]

    def errors(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= logging.ERROR]


@contextlib.contextmanager
def watching() -> Iterator[Lines]:
    """Every record of the roles and the in-memory transport, from INFO up, while inside."""
    watch = Lines()
    loggers = [logging.getLogger(n) for n in ("seedflood.roles", "seedflood.comm")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(watch)
        lg.setLevel(logging.INFO)
    try:
        yield watch
    finally:
        for lg, level in zip(loggers, levels):
            lg.removeHandler(watch)
            lg.setLevel(level)


@pytest.fixture
def lines():
    with watching() as watch:
        yield watch


@dataclasses.dataclass(frozen=True)
class LeaveRun:
    """Node 5 asked to leave before step 4, with the log lines and the frames on its edges."""

    cfg: config.Config
    r: SimResult
    lines: Lines
    seen: list[tuple[int, int, int, int]]  # (src, dst, hop, unlink hop) of frames carrying node 5's LEAVE
    after: list[tuple[int, int, int]]  # (src, dst, hop) of every frame on node 5's edges


@functools.cache
def leave_run(*topology: str) -> LeaveRun:
    """One run per topology (the torus without overrides), shared by the tests that check
    different things of the same leave: each asserts on the result, none changes it."""
    cfg = cfg_for(*topology)
    limits = protocol_of(cfg).limits(0, 2**32 - 1)
    seen: list[tuple[int, int, int, int]] = []
    after: list[tuple[int, int, int]] = []

    def watch(src: int, dst: int, hop: int, frame: bytes) -> bytes:  # looks, changes nothing
        if dst >= 0 and 5 in (src, dst):
            after.append((src, dst, hop))
            if frame and src == 5:
                _, notes = decode_hop(frame, limits)
                seen.extend((src, dst, hop, n.value) for n in notes if n.kind == LEAVE)
        return frame

    with watching() as lines:
        r = simulate(cfg, events=[Event(4, 5, "leave")], mutate=watch)
    return LeaveRun(cfg, r, lines, seen, after)


@pytest.mark.parametrize("topology", [("torus",), RING8_1HOP], ids=["torus", "ring"])
def test_a_client_that_leaves_is_committed_out_and_nobody_drops_it(topology, tmp_path):
    """Node 5 is asked to leave before step 4: step 4 commits without it at every client, the
    survivors finish on one hash equal to a replay of the log (which records the leave at step
    4), node 5 stops with its one line, and no client lost or dropped a peer or logged an error:
    the edges closed by agreement, not by failure."""
    run = leave_run(*(() if topology == ("torus",) else topology))
    cfg, r, lines = run.cfg, run.r, run.lines
    assert r.exits == {5: "node 5 left at step 4"}, r.exits
    assert sorted(r.hashes) == [0, 1, 2, 3, 4, 6, 7] and len(set(r.hashes.values())) == 1
    assert left(r) == {5: 4} and r.changes[4].leave == (5,) and r.changes[4].audit == ()
    assert len(r.step_hashes[5]) >= 3  # it applied steps while it hopped on towards its leave
    check_survivors(cfg, r, tmp_path)
    assert lines.lost(5) == [] and lines.errors() == []
    parted = [r.getMessage() for r in lines.records if "left gracefully" in r.getMessage()]
    neighbours = {1, 4, 6} if topology == ("torus",) else {4, 6}
    assert {int(m.split()[1].rstrip(":")) for m in parted} == neighbours, parted


def test_a_crash_on_the_same_footing_is_a_lost_peer(lines, tmp_path):
    """The control for the test above: the same node killed at the same step leaves at the same
    step, but through the failure path, which its neighbours log as a lost peer."""
    cfg = cfg_for()
    r = simulate(cfg, events=[Event(4, 5, "kill")])
    assert left(r) == {5: 4}
    assert lines.lost(5), "a crash must show as a lost peer"
    check_survivors(cfg, r, tmp_path)


def test_the_leave_note_is_the_last_frame_the_leaver_sends(tmp_path):
    """The LEAVE note names the hop after the one that carries it, straight from the leaver to
    each neighbour, and nothing travels on the leaver's edges after it."""
    run = leave_run()  # the torus's run of test_a_client_that_leaves_is_committed_out_and_nobody_drops_it
    cfg, r, seen, after = run.cfg, run.r, run.seen, run.after
    assert r.exits == {5: "node 5 left at step 4"}
    assert sorted(d for _, d, _, _ in seen) == [1, 4, 6]
    ((hop, unlink),) = {(h, u) for _, _, h, u in seen}
    assert unlink == hop + 1
    assert max(h for _, _, h in after) == hop  # its edges carry nothing after the note's exchange
    check_survivors(cfg, r, tmp_path)


def test_a_leave_and_a_crash_in_one_run(lines, tmp_path):
    """Node 5 leaves before step 4 while node 2 is killed before step 6: both changes are
    committed at their steps, the six others finish on one history, and only the crash is a
    lost peer."""
    cfg = cfg_for(steps=12)
    r = simulate(cfg, events=[Event(4, 5, "leave"), Event(6, 2, "kill")])
    assert r.exits[5] == "node 5 left at step 4" and r.exits[2] == "killed at step 6"
    assert left(r) == {5: 4, 2: 6}
    assert sorted(r.hashes) == [0, 1, 3, 4, 6, 7]
    check_survivors(cfg, r, tmp_path)
    assert lines.lost(2) and lines.lost(5) == []
    assert lines.errors() == []


@pytest.mark.parametrize("cut,leave", [(0, 1), (1, 3), (2, 3)], ids=["cut0-leave1", "cut1-leave3", "cut2-leave3"])
def test_a_leave_after_its_link_was_cut_and_healed_leaves_the_other_two_training(cut, leave, tmp_path):
    """A line of 3 (1 - 0 - 2), one hop a step: link 0-2 is cut and heals two steps later, and
    node 2 leaves. The two left had both voted a guess with node 2 in it and a pipelined vote
    on that guess; the guess lost, and their two void votes were a quorum of the roster of 2.
    Each took them for a majority on another history and stopped (found by the schedule
    explorer; each case here stopped both). Now they vote again and finish on one history."""
    cfg = cfg_for("topology.kind=tree", "topology.nodes=3", "flood.hops_per_step=1", steps=12)
    r = simulate(cfg, events=[Event(cut, 0, "cut", 2), Event(cut + 2, 0, "heal", 2), Event(leave, 2, "leave")])
    assert r.exits == {2: f"node 2 left at step {leave}"} and left(r) == {2: leave}, r.exits
    assert sorted(r.hashes) == [0, 1]
    check_survivors(cfg, r, tmp_path)


def test_a_signed_run_signs_the_leave_note_and_its_neighbours_take_it(tmp_path, lines):
    """With trust.sign the LEAVE note is signed by its origin like any note of its own: the
    neighbours authenticate it (no forgery counted) and close their edges without a lost peer,
    and the survivors end on the bits of the unsigned run with the same leave."""
    keys = tmp_path / "keys"
    identity.write_keys(keys, 8)
    r = simulate(cfg_for("trust.sign=true", f"trust.keys={keys}"), events=[Event(4, 5, "leave")])
    assert r.exits == {5: "node 5 left at step 4"} and left(r) == {5: 4}
    assert all(s.forged == 0 for s in r.flood.values())
    assert lines.lost(5) == [] and lines.errors() == []
    plain = leave_run().r  # the same leave unsigned (the torus's run above)
    assert r.hashes == plain.hashes and r.records == plain.records


def test_a_leave_note_relayed_by_another_closes_no_edge(lines, tmp_path):
    """Node 0 slips a LEAVE note in node 5's name into its frame to node 4 (an unsigned run: a
    relay can make one up), naming the next exchange: node 4 takes only the leaver's own frame's
    note as a leave, so it keeps its edge to node 5, nobody is lost or parted, nothing changes."""
    cfg = cfg_for()
    limits = protocol_of(cfg).limits(0, 2**32 - 1)

    def forge(src: int, dst: int, hop: int, frame: bytes) -> bytes:
        if (src, dst, hop) != (0, 4, 9) or not frame:
            return frame
        msgs, notes = decode_hop(frame, limits)
        return encode_hop(msgs, [*notes, leave_note(2, 5, hop + 1)])

    r = simulate(cfg, events=[], mutate=forge)
    assert r.exits == {} and r.changes == {} and len(set(r.hashes.values())) == 1
    assert not [x for x in lines.records if "left gracefully" in x.getMessage() or "parted" in x.getMessage()]
    assert lines.lost(5) == [] and lines.lost(4) == [] and lines.errors() == []
    check_survivors(cfg, r, tmp_path)


def test_a_client_that_left_is_started_again_and_rejoins_by_replay(lines, tmp_path):
    """Node 5 leaves before step 4 and is started again once the others reach step 6 (a new
    incarnation, as SLURM's requeue restarts a task it sent SIGTERM): a neighbour sponsors it, it
    replays the log, and all eight finish on one history; its earlier life's LEAVE note (which
    its sponsor holds) closes none of its new edges."""
    cfg = cfg_for(PACED, steps=30)
    r = simulate(cfg, events=[Event(4, 5, "leave"), Event(6, 5, "restart")])
    assert r.exits == {} and sorted(r.hashes) == list(range(8)), r.exits
    assert left(r) == {5: 4} and joined(r)[5] > 6
    assert [c.join for c in r.changes.values() if c.join] == [((5, 1),)]
    assert lines.lost(5) == [] and lines.errors() == []
    check_survivors(cfg, r, tmp_path)
