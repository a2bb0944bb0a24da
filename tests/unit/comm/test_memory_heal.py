"""The in-memory transport's healed edges and sponsor choice (docs/churn-design.md, Healed edges;
Sponsor, JOIN and catch-up): the heal negotiation hands both ends one exchange index or none,
whatever order they ask in; a cut link refuses it until it heals; a restarted process is never
healed into as its old incarnation; and a revived neighbour is sponsored only over a link that
works."""

from __future__ import annotations

import threading

from seedflood.comm.memory import InMemoryNetwork, MemoryTransport
from seedflood.core.flood.transport import Healing


def pair() -> tuple[InMemoryNetwork, MemoryTransport, MemoryTransport]:
    """Two neighbours whose edge went down (each dropped the other)."""
    net = InMemoryNetwork({0: [1], 1: [0]}, timeout_s=1.0, tolerate=True)
    a, b = net.endpoint(0), net.endpoint(1)
    a.drop(1, "test")
    b.drop(0, "test")
    return net, a, b


def exchange_both(a: MemoryTransport, b: MemoryTransport) -> dict[int, dict[int, bytes]]:
    out: dict[int, dict[int, bytes]] = {}
    t = threading.Thread(target=lambda: out.__setitem__(1, b.exchange({0: b"from 1"}, 0)))
    t.start()
    out[0] = a.exchange({1: b"from 0"}, 0)
    t.join(5)
    return out


def test_both_ends_get_one_index_ahead_of_their_clocks_and_the_edge_carries_frames_again():
    net, a, b = pair()
    assert isinstance(a, Healing)
    assert a.heal({1: None}, 10) == {}  # asks; nobody else does yet
    assert b.heal({0: None}, 12) == {}  # both ask: b proposes 12 + HEAL_AHEAD
    assert a.heal({1: None}, 11) == {1: 14}  # a takes it before its clock gets there
    assert b.heal({0: None}, 13) == {0: 14}  # b hears of it on its next ask
    a.restore(1)
    b.restore(0)
    assert a.peers == (1,) and b.peers == (0,)
    assert exchange_both(a, b) == {0: {1: b"from 1"}, 1: {0: b"from 0"}}


def test_a_proposal_not_taken_before_its_index_is_withdrawn_and_proposed_again():
    net, a, b = pair()
    a.heal({1: None}, 10)
    assert b.heal({0: None}, 12) == {}  # proposes 14
    assert b.heal({0: None}, 14) == {}  # reached 14 untaken: withdrawn, proposed again at 16
    assert a.heal({1: None}, 15) == {1: 16}
    assert b.heal({0: None}, 15) == {0: 16}


def test_a_cut_link_refuses_to_heal_until_it_is_healed():
    net, a, b = pair()
    net.cut(0, 1)
    net.cut(1, 0)
    for hop in range(10, 20):
        assert a.heal({1: None}, hop) == {} and b.heal({0: None}, hop) == {}
    net.heal(0, 1)
    a.heal({1: None}, 20)
    b.heal({0: None}, 20)
    assert a.heal({1: None}, 21) == {1: 22} and b.heal({0: None}, 21) == {0: 22}


def test_a_restarted_process_is_never_healed_into_as_its_old_incarnation():
    net, a, b = pair()
    net.kill(1)
    net.revive(1)
    b2 = net.endpoint(1)  # incarnation 1, waiting for a sponsor
    assert not a.healable(1, None) and a.healable(1, 1)
    for hop in range(10, 14):
        assert a.heal({1: None}, hop) == {}  # the roster still admits incarnation 0
        assert b2.heal({0: None}, hop) == {}
    assert not b2.peers and not a.peers


def test_a_revived_neighbour_is_sponsored_only_over_a_link_that_works():
    """Line 0 - 1 - 2; node 1 restarts while its link to 0 is cut: node 0 neither sees it nor can
    claim it (it could not reach it), node 2 does; once the link heals node 0 sees it too."""
    net = InMemoryNetwork({0: [1], 1: [0, 2], 2: [1]}, timeout_s=1.0, tolerate=True)
    e0, _, e2 = net.endpoint(0), net.endpoint(1), net.endpoint(2)
    net.kill(1)
    net.cut(0, 1)
    net.cut(1, 0)
    net.revive(1)
    assert e0.revived() == [] and e0.claim(1) is None
    assert e2.revived() == [1] and e2.claim(1) == 1
    net.heal(0, 1)
    assert e0.revived() == [1] and e0.claim(1) is None  # reported once the link works; 2 won the claim


def test_a_proposer_that_no_longer_wants_the_edge_learns_it_was_taken_or_withdraws_it():
    """Seen in CI (chaos seed 1): node 1 proposed a heal to a stalled node 0, committed 0 out
    before its next ask and stopped asking; node 0 took the proposal, connected and waited the
    late bound on an edge node 1 never connected. The proposer's next ask hands the index back
    (it connects and closes the edge at once), or withdraws the proposal nobody took."""
    net, a, b = pair()
    a.heal({1: None}, 10)
    assert b.heal({0: None}, 12) == {}  # b proposes 14
    assert a.heal({1: None}, 11) == {1: 14}  # a takes it
    assert b.heal({}, 13) == {0: 14}  # b wants it no more: told it was taken all the same
    b.restore(0)
    assert b.heal({}, 14) == {}  # connected: not handed back again
    # withdrawn when not taken: the other end's later asks can no longer take it
    net, a, b = pair()
    a.heal({1: None}, 10)
    assert b.heal({0: None}, 12) == {}  # b proposes 14
    assert b.heal({}, 13) == {}  # withdrawn
    assert a.heal({1: None}, 13) == {}  # nothing to take: a proposes itself (b no longer asks)
    assert a.heal({1: None}, 14) == {}
