"""The flood state machine on many graphs, driven hop by hop in lockstep (no processes)."""

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seedflood.core.config import rng
from seedflood.core.flood.flooding import Flood, FloodError
from seedflood.core.membership.notes import Note
from seedflood.core.topology import builders
from seedflood.core.wire.message import Message


def graphs():
    out = []
    for n in (2, 3, 5, 8, 16, 33, 64):
        out += [builders.ring(n), builders.complete(n), builders.star(n), builders.tree(n)]
    out += [
        builders.grid(16),
        builders.grid(12, rows=3),
        builders.torus(16),
        builders.torus(64),
        builders.random_regular(16, 3, seed=1),
        builders.erdos_renyi(32, 0.15, seed=2),
        builders.watts_strogatz(40, 4, 0.1, seed=3),
        builders.grid(7),
    ]
    return out


def msg(origin, step, k=0):
    return Message.make(origin, step, rng.derive(0, origin, step, k), 0.25 + origin, k)


class Lockstep:
    """Every node of a graph flooding in synchronous hops; records first arrivals per message."""

    def __init__(self, top, per_origin=1, routed=False):
        self.top = top
        self.nodes = {
            i: Flood(i, top.neighbors(i), range(top.n), per_origin, routes=top.routes(i) if routed else None)
            for i in top.nodes
        }
        self.arrivals: Counter = Counter()  # (node, id) -> times it was new
        self.first_hop: dict = {}  # (node, id) -> hop (1-based) at which it first arrived
        self.hops = 0
        self.sent = 0

    def originate(self, step, per_origin=1):
        for i, f in self.nodes.items():
            f.originate([msg(i, step, k) for k in range(per_origin)])

    def hop(self):
        outs = {i: f.outbox() for i, f in self.nodes.items()}
        for src, per_peer in outs.items():
            for dst, msgs in per_peer.items():
                self.sent += len(msgs)
                for m in self.nodes[dst].receive(src, msgs):
                    self.arrivals[(dst, m.id)] += 1
                    self.first_hop.setdefault((dst, m.id), self.hops + 1)
        self.hops += 1


@pytest.mark.parametrize("routed", [False, True], ids=["all", "routed"])
@pytest.mark.parametrize("top", graphs(), ids=lambda t: f"{t.name}-{t.n}")
def test_full_flood_delivers_everything_exactly_once_within_diameter(top, routed):
    net = Lockstep(top, routed=routed)
    net.originate(step=0)
    for _ in range(top.diameter):
        net.hop()
    for i, f in net.nodes.items():
        assert f.is_complete(0), f"node {i} incomplete after {top.diameter} hops"
    # Every node got every foreign message exactly once.
    assert all(c == 1 for c in net.arrivals.values())
    assert len(net.arrivals) == top.n * (top.n - 1)
    # Each message crosses each edge at most once per direction; a flood needs at least n-1 sends.
    assert top.n - 1 <= net.sent / top.n <= 2 * len(top.edges)
    # ...and the diameter is tight: with one hop fewer some node is incomplete (n > 1).
    if top.diameter > 0:
        net2 = Lockstep(top, routed=routed)
        net2.originate(step=0)
        for _ in range(top.diameter - 1):
            net2.hop()
        assert not all(f.is_complete(0) for f in net2.nodes.values())
    # Further hops carry nothing: the flood is quiescent.
    net.hop()
    assert all(f.idle for f in net.nodes.values())


@pytest.mark.parametrize(
    "top",
    [
        builders.ring(16),
        builders.torus(64),
        builders.tree(31),
        builders.grid(16),
        builders.watts_strogatz(40, 4, 0.1, seed=3),
    ],
    ids=lambda t: f"{t.name}-{t.n}",
)
@pytest.mark.parametrize("hops", [1, 2, 3])
@pytest.mark.parametrize("routed", [False, True], ids=["all", "routed"])
def test_delayed_flooding_completes_within_ceil_diameter_over_h_steps(top, hops, routed):
    steps, delay = 12, math.ceil(top.diameter / hops)
    net = Lockstep(top, per_origin=2, routed=routed)
    for t in range(steps + delay):
        if t < steps:
            net.originate(t, per_origin=2)
        for _ in range(hops):
            net.hop()
        due = t - delay + 1  # a step originated at t is complete after its delay-th step
        for f in net.nodes.values():
            for s in range(f.applied_through + 1, min(due, steps - 1) + 1):
                got = f.pop_step(s)
                assert [m.id for m in got] == sorted((o, s, k) for o in range(top.n) for k in range(2))
    assert all(f.applied_through == steps - 1 for f in net.nodes.values())
    assert all(c == 1 for c in net.arrivals.values())


@pytest.mark.parametrize("top", graphs(), ids=lambda t: f"{t.name}-{t.n}")
def test_routed_flood_arrives_at_the_same_hop_as_full_flooding_with_fewer_copies(top):
    full, routed = Lockstep(top), Lockstep(top, routed=True)
    for net in (full, routed):
        net.originate(step=0)
        for _ in range(top.diameter + 1):
            net.hop()
    # Each message reaches node v at hop dist(origin, v) either way: the schedule is unchanged.
    dist = top.distances
    assert routed.first_hop == full.first_hop
    assert all(h == dist[mid[0]][v] for (v, mid), h in routed.first_hop.items())
    assert routed.sent <= full.sent
    # Only shortest-path edges carry a message: on a complete graph that is one copy per node.
    if top.name.startswith("complete"):
        assert routed.sent == top.n * (top.n - 1)


def test_routes_must_name_neighbours():
    with pytest.raises(FloodError, match="non-neighbours"):
        Flood(0, [1], range(3), routes={0: (1, 2)})


@given(st.integers(2, 24), st.integers(0, 10**6), st.integers(1, 4))
@settings(max_examples=60, deadline=None)
def test_random_graphs_flood_exactly_once(n, seed, hops):
    top = builders.erdos_renyi(n, 0.3, seed=seed)
    net = Lockstep(top)
    net.originate(0)
    for _ in range(hops * math.ceil(top.diameter / hops)):
        net.hop()
    assert all(f.is_complete(0) for f in net.nodes.values())
    assert all(c == 1 for c in net.arrivals.values())


def test_steps_pop_in_order_and_old_ids_are_forgotten():
    f = Flood(0, [1], members=[0, 1])
    f.originate([msg(0, 0), msg(0, 1)])
    f.receive(1, [msg(1, 1)])
    assert not f.is_complete(0)
    with pytest.raises(FloodError, match="in order"):
        f.pop_step(1)
    with pytest.raises(FloodError, match="not complete"):
        f.pop_step(0)
    f.receive(1, [msg(1, 0)])
    assert [m.id for m in f.pop_step(0)] == [(0, 0, 0), (1, 0, 0)]
    assert 0 not in f._store and all(i[1] != 0 for i in f._known)
    # A late copy of an applied step is a duplicate, never new.
    assert f.receive(1, [msg(1, 0)]) == []
    assert [s for s, _ in f.pop_ready(5)] == [1]


def test_outbox_skips_the_sender_and_known_peers():
    f = Flood(0, [1, 2, 3], members=range(4))
    f.receive(1, [msg(1, 0)])
    f.receive(2, [msg(1, 0)])  # the same message also came from 2
    out = f.outbox()
    assert out[1] == [] and out[2] == [] and [m.id for m in out[3]] == [(1, 0, 0)]
    assert f.outbox() == {1: [], 2: [], 3: []}


def test_conflicting_copies_and_foreign_peers_are_errors():
    f = Flood(0, [1], members=range(2))
    f.receive(1, [msg(1, 0)])
    evil = Message.make(1, 0, msg(1, 0).seed, 99.0)
    with pytest.raises(FloodError, match="conflicting"):
        f.receive(1, [evil])
    with pytest.raises(FloodError, match="not a neighbour"):
        f.receive(5, [msg(1, 1)])
    with pytest.raises(FloodError, match="cannot originate"):
        f.originate([msg(1, 2)])


def test_restored_messages_complete_a_step_and_are_never_sent():
    f = Flood(0, [1, 2], members=range(3))
    f.applied_through = 1
    f.restore([msg(o, 2) for o in range(3)])
    assert f.is_complete(2) and f.idle
    assert f.outbox() == {1: [], 2: []}
    assert f.receive(1, [msg(1, 2)]) == []  # a copy from a neighbour is a duplicate
    assert [m.origin for m in f.pop_step(2)] == [0, 1, 2]
    with pytest.raises(FloodError, match="already applied"):
        f.restore([msg(0, 2)])
    with pytest.raises(FloodError, match="restored twice"):
        f.restore([msg(0, 3), msg(0, 3)])


def test_under_churn_two_copies_of_one_id_are_evidence_against_their_origin_not_a_crash():
    """F7: a receiver that gets two different messages under one id keeps the first, names the
    origin (the agreement leaves it out of what this node proposes) and goes on."""
    f = Flood(0, [1, 2], range(3), tolerate_conflicts=True)
    a = Message.make(2, 4, 77, 0.5)
    b = Message.make(2, 4, 77, 0.25)
    assert f.receive(1, [a]) == [a]
    assert f.receive(2, [b]) == []
    assert f.messages(4, [2]) == [a] and 2 in f.conflicts and "two copies of (2, 4, 0)" in f.conflicts[2]
    strict = Flood(0, [1, 2], range(3))
    strict.receive(1, [a])
    with pytest.raises(FloodError, match="conflicting copies"):
        strict.receive(2, [b])


def test_a_node_that_sees_two_copies_floods_both_as_copy_notes_so_every_node_holds_the_evidence():
    """Equivocation as evidence that travels: a frame carries one copy per id, so the node that
    sees a second copy floods both as COPY notes, to every neighbour (the one that sent the other
    copy too, which would never see the first as a message). A path 1 - 0 - 2 where origin 3's
    two copies reach 0 from both sides: afterwards 1 and 2, each of which held one copy, name
    origin 3 too and hold both copies."""
    from seedflood.core.membership.notes import COPY, copied

    a = Message.make(3, 4, 77, 0.5)
    b = Message.make(3, 4, 77, 0.25)
    mid = Flood(0, [1, 2], range(4), tolerate_conflicts=True)
    left = Flood(1, [0], range(4), tolerate_conflicts=True)
    right = Flood(2, [0], range(4), tolerate_conflicts=True)
    assert mid.receive(1, [a]) == [a] and mid.receive(2, [b]) == []
    assert "two copies of (3, 4, 0): scalars 0.5 and 0.25" == mid.conflicts[3]
    out = mid.outbox()
    for peer, flood in ((1, left), (2, right)):
        notes = [n for n in out[peer] if isinstance(n, Note) and n.kind == COPY]
        assert sorted(copied(n).scalar for n in notes) == [0.25, 0.5]  # both copies, to both sides
        flood.receive(0, [a] if peer == 1 else [b])  # what each side held before
        flood.receive(0, out[peer])
        assert 3 in flood.conflicts and sorted(m.scalar for m in flood.copies(4, [3])[0]) == [0.25, 0.5]


def test_copies_of_one_id_are_bounded_and_a_committed_copy_is_chosen_before_the_step_is_taken():
    """An origin that sends many copies costs every node at most MAX_COPIES of them (a third is
    dropped, never forwarded); `choose` makes the flood hand out the copy the client picked."""
    from seedflood.core.flood.flooding import MAX_COPIES
    from seedflood.core.membership.notes import copy_note

    copies = [Message.make(1, 0, 5, 0.125 * (i + 1)) for i in range(4)]
    f = Flood(0, [1, 2], range(2), tolerate_conflicts=True)
    f.receive(1, [copies[0]])
    f.receive(1, [copy_note(c) for c in copies[1:]])
    assert MAX_COPIES == 2 and f.copies(0, [1]) == [copies[:2]]
    sent = [n for n in f.outbox()[2] if isinstance(n, Note)]
    assert sorted(n.body for n in sent) == sorted(copy_note(c).body for c in copies[:2])  # never copies 2, 3
    f.receive(2, [Message.make(0, 0, 9, 1.0)])
    f.choose([copies[1]])
    assert f.take_step(0, [0, 1]) == [Message.make(0, 0, 9, 1.0), copies[1]]
    assert f.copies(0, [1]) == []  # forgotten with the step


def test_a_leave_note_travels_one_hop_from_its_origin_and_is_owed_to_nobody():
    from seedflood.core.membership.notes import leave_note

    leaver = Flood(1, [0, 2], range(4), 1)
    note = leave_note(3, 1, 40)
    leaver.originate_notes([note])
    assert leaver.outbox() == {0: [note], 2: [note]}  # its own goes straight to every neighbour
    relay = Flood(2, [1, 3], range(4), 1)
    assert relay.receive(1, [note]) == [note]  # taken (its neighbour acts on it) ...
    assert relay.notes(3, note.kind) == [note] and relay.outbox() == {1: [], 3: []}  # ... never relayed
    relay.add_peer(0)
    assert relay.outbox()[0] == []  # nor owed to a neighbour that connects later
    leaver.drop_peer(0)
    leaver.add_peer(0)
    assert leaver.outbox()[0] == [note]  # its origin owes it to a reconnected neighbour


def test_the_sorted_notes_cache_forgets_every_step_past_the_horizon():
    """`notes` of kinds a step never held are cached too (empty): they go with the horizon, so a
    long run's cache stays bounded by it."""
    from seedflood.core.membership.notes import JOIN

    f = Flood(0, [1], range(2), note_horizon=2)
    for s in range(20):
        assert f.notes(s, JOIN) == []
        f.receive(1, [Message.make(0, s, 9, 1.0), Message.make(1, s, 9, 1.0)])
        assert len(f.take_step(s, [0, 1])) == 2
    assert {k[0] for k in f._sorted} <= set(range(17, 20))


def test_owed_messages_of_an_applied_step_go_to_that_peer_only_and_the_newcomer_takes_what_it_lacks():
    """`owe`: a member that applied (and forgot) step 0 sends a newcomer its committed messages;
    nothing is held by the member, other neighbours get nothing, and the newcomer takes only the
    ones it lacks (those it holds count as duplicates), so it can then apply the step."""
    member = Flood(1, [0, 2], range(3), 1, tolerate_conflicts=True)
    step0 = [msg(0, 0), msg(1, 0), msg(2, 0)]
    member.receive(2, [step0[0], step0[2]])
    member.originate([step0[1]])
    member.outbox()
    assert member.take_step(0, range(3)) == step0
    member.owe(0, step0)
    assert member.outbox() == {0: step0, 2: []}
    assert member.messages(0, range(3)) == []  # nothing held again: the step stays applied
    newcomer = Flood(0, [1], range(3), 1, tolerate_conflicts=True)
    newcomer.restore([step0[0]])  # from its catch-up; its sponsor never relayed the rest
    assert newcomer.receive(1, step0) == step0[1:]
    assert newcomer.stats.duplicates == 1 and newcomer.is_complete(0)
    with pytest.raises(FloodError, match="not connected"):
        member.owe(5, step0)


def test_the_lockstep_refuses_to_frame_a_note():
    """The lockstep counts message frames only: a note in an outbox is a FloodError, also on the
    byte projection's path, which sizes a frame by its ids once and then reuses that size."""
    from seedflood.core.flood.lockstep import Lockstep as Real
    from seedflood.core.membership.notes import join_note

    net = Real(builders.ring(4), 1, hops=1, delay=1)
    net.floods[0].originate([msg(0, 0)])
    net.hop(0)  # a message alone: framed, its frame's size cached
    net.floods[0].originate_notes([join_note(0, 0, 1, 0)])
    with pytest.raises(FloodError, match="node 0 has a note to send"):
        net.hop(0)
