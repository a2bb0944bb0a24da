"""The join rule (core/membership/growth.py; docs/churn-design.md, A new id joins): a new id's edges
are a pure function of the committed changes, it links to the founders with the fewest links
first, and while every founder is a member the graph's diameter stays within the founders'
diameter + 2."""

from __future__ import annotations

from collections import deque

import pytest

from seedflood.core.membership.growth import Growth, members_after
from seedflood.core.membership.roster import Change
from seedflood.core.topology import builders


def diameter(graph: dict[int, frozenset[int]]) -> int:
    """Largest BFS distance; fails on a disconnected graph."""
    worst = 0
    for src in graph:
        dist = {src: 0}
        todo = deque([src])
        while todo:
            x = todo.popleft()
            for y in graph[x]:
                if y not in dist:
                    dist[y] = dist[x] + 1
                    todo.append(y)
        assert len(dist) == len(graph), f"disconnected from {src}"
        worst = max(worst, *dist.values())
    return worst


def ring(n: int) -> dict[int, tuple[int, ...]]:
    return {i: ((i - 1) % n, (i + 1) % n) for i in range(n)}


def test_new_ids_link_to_the_founders_with_the_fewest_links_lowest_id_first():
    g = Growth.of(ring(5), delay=3)
    assert (g.links, g.lag, g.founders) == (2, 8, 5)
    changes = {20: Change(20, join=((5, 0),)), 40: Change(40, join=((6, 0),)), 60: Change(60, join=((7, 0),))}
    assert g.edges(5, 20, changes) == (0, 1)
    assert g.edges(6, 40, changes) == (2, 3)  # 0 and 1 have three links now
    assert g.edges(7, 60, changes) == (0, 4)  # 4 has two; then the lowest of the founders with three
    graph = g.graph(changes, 60)
    assert graph[5] == {0, 1} and graph[0] == {1, 4, 5, 7} and graph[7] == {0, 4}


def test_the_edges_depend_only_on_what_was_committed_lag_steps_before():
    """A join at step e reads the graph and roster after step e − lag: a change committed later
    (even at e − 1) does not move its edges, so every client that committed e − lag agrees."""
    g = Growth.of(ring(5), delay=3)
    base = {20: Change(20, join=((5, 0),))}
    assert g.edges(6, 40, base) == (2, 3)
    late = {**base, 39: Change(39, leave=(2,))}  # after 40 − lag: not seen by the join at 40
    assert g.edges(6, 40, late) == (2, 3)
    early = {**base, 32: Change(32, leave=(2,))}  # at 40 − lag: node 2 is no member to link to
    assert g.edges(6, 40, early) == (3, 4)
    # a join committed after `through` is not in the graph yet; a founder's rejoin adds nothing
    assert 5 not in g.graph(base, 19) and g.graph(base, 20)[5] == {0, 1}
    rejoined = {**base, 25: Change(25, leave=(2,)), 30: Change(30, join=((2, 1),))}
    assert g.graph(rejoined, 30)[2] == {1, 3}


def test_a_new_id_that_joins_again_keeps_its_edges():
    g = Growth.of(ring(5), delay=3)
    changes = {20: Change(20, join=((5, 0),)), 30: Change(30, leave=(5,)), 50: Change(50, join=((5, 1),))}
    assert g.edges(5, 50, changes) == (0, 1)
    assert g.graph(changes, 50)[5] == {0, 1}


def test_members_after_replays_the_changes():
    changes = {3: Change(3, leave=(1,)), 7: Change(7, join=((5, 0), (1, 1)))}
    assert members_after(4, changes, -1) == {0, 1, 2, 3}
    assert members_after(4, changes, 3) == {0, 2, 3}
    assert members_after(4, changes, 7) == {0, 1, 2, 3, 5}


def test_the_spread_is_the_widest_part_of_the_members_graph_with_the_pending_newcomers():
    """`Growth.spread` (how long a voter waits in a ballot's view, `Voter.pace`): the largest
    diameter of a connected part of the committed graph over the members, with the rule's edges
    of each newcomer whose JOIN note is held and whose edges can be computed (JOIN step within
    `lag` of what is committed); a member that left takes its edges with it."""
    g = Growth.of(ring(5), delay=3)  # lag 8
    assert g.spread({}, 0, {}) == 2
    assert g.spread({}, 0, {5: 8}) == 3  # 5 - 0 - 4 - 3 (5 links to 0 and 1)
    assert g.spread({}, 0, {5: 9}) == 2  # its edges are not computable yet (9 - lag > 0)
    joined = {20: Change(20, join=((5, 0),))}
    assert g.spread(joined, 19, {}) == 2 and g.spread(joined, 20, {}) == 3
    left = {**joined, 24: Change(24, leave=(2, 4))}  # no repair: {0, 1, 5} and {3} apart
    assert g.spread(left, 24, {}) == 1
    k4 = Growth.of({i: tuple(q for q in range(4) if q != i) for i in range(4)}, delay=2)
    assert k4.spread({}, 0, {}) == 1 and k4.spread({}, 0, {4: 6}) == 2  # 4 links to 0, 1, 2: 4 - 0 - 3


@pytest.mark.parametrize(
    "top",
    [
        builders.ring(5),
        builders.ring(8),
        builders.torus(8, 2),
        builders.grid(9, 3),
        builders.complete(4),
        builders.star(6),
    ],
    ids=["ring5", "ring8", "torus2x4", "grid3x3", "complete4", "star6"],
)
def test_many_new_ids_keep_the_graph_connected_within_the_founders_diameter_plus_two(top):
    adj = {n: top.neighbors(n) for n in top.nodes}
    g = Growth.of(adj, delay=2)
    d0 = diameter({n: frozenset(ps) for n, ps in adj.items()})
    changes: dict[int, Change] = {}
    for i in range(12):  # one new id every few steps, some closer together than the lag
        e = 3 * i + 5
        changes[e] = Change(e, join=((g.founders + i, 0),))
    graph = g.graph(changes, max(changes))
    assert len(graph) == g.founders + 12
    assert all(len(graph[j]) == min(g.links, g.founders) for j in range(g.founders, g.founders + 12))
    assert all(q < g.founders for j in range(g.founders, g.founders + 12) for q in graph[j])  # founders first
    assert diameter(graph) <= d0 + 2
