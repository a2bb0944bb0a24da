"""Graph repair (core/membership/repair.py, growth.Growth with repair; docs/churn-design.md, Graph
repair): after a committed step leaves members out, the same edges from the same history at
every client; every member ends with at least min(k, members - 1) links; the members' graph is
connected and within the starting topology's diameter, on rings, tori, stars and lines after
chosen leaves; nothing is added where nothing is under-linked, split or too wide."""

from __future__ import annotations

import itertools
import random

import pytest

from seedflood.core.membership.growth import Growth
from seedflood.core.membership.repair import diameter, parts, repair
from seedflood.core.membership.roster import Change
from seedflood.core.topology import builders


def adjacency(kind: str, n: int, **kw: int) -> dict[int, tuple[int, ...]]:
    top = getattr(builders, kind)(n, **kw)
    return {i: tuple(top.neighbors(i)) for i in top.nodes}


LINE6 = adjacency("grid", 6, rows=1)  # 0 - 1 - 2 - 3 - 4 - 5: diameter 5
RING6 = adjacency("ring", 6)
TORUS = adjacency("torus", 8, rows=2)  # 2x4: diameter 3, degree 3
STAR6 = adjacency("star", 6)  # centre 0: diameter 2


def grown(base: dict[int, tuple[int, ...]], changes: dict[int, Change]) -> tuple[Growth, dict[int, frozenset[int]]]:
    g = Growth.of(base, delay=2, repair=True)
    return g, g.graph(changes, max(changes))


def members(g: Growth, changes: dict[int, Change]) -> set[int]:
    out = set(range(g.founders))
    for s in sorted(changes):
        out = (out - set(changes[s].leave)) | {j for j, _ in changes[s].join}
    return out


def check(g: Growth, graph: dict[int, frozenset[int]], live: set[int]) -> None:
    """What repair promises after every leave: links, one part, the diameter bound."""
    want = min(g.links, len(live) - 1)
    assert all(len(graph[m] & live) >= want for m in live), {m: sorted(graph[m] & live) for m in live}
    assert len(parts(graph, live)) == 1
    assert (diameter(graph, live) or 0) <= g.bound


def test_a_line_whose_members_leave_is_linked_into_a_ring_and_never_splits():
    """Line of 6 (D = 5, k = 2): node 1 leaving would isolate node 0, node 4 then node 5."""
    changes = {4: Change(4, leave=(1,))}
    g, graph = grown(LINE6, changes)
    assert (g.links, g.bound) == (2, 5)
    assert g.repaired(changes, 4) == ((0, 2), (0, 5))  # 0 alone: the fewest-linked founders, lowest id first
    check(g, graph, {0, 2, 3, 4, 5})
    changes[9] = Change(9, leave=(4,))
    g, graph = grown(LINE6, changes)
    assert g.repaired(changes, 9) == ((3, 5),)  # 3 and 5 lost node 4: they link to each other
    check(g, graph, {0, 2, 3, 5})
    assert graph[0] == {1, 2, 5}  # edges to a non-member stay in the graph; they carry nothing


def test_a_ring_cut_twice_into_halves_becomes_one_ring_of_the_four_left():
    changes = {3: Change(3, leave=(1,)), 8: Change(8, leave=(4,))}
    g, graph = grown(RING6, changes)
    assert g.repaired(changes, 3) == ((0, 2),) and g.repaired(changes, 8) == ((3, 5),)
    check(g, graph, {0, 2, 3, 5})


def test_the_centre_of_a_star_leaves_and_the_leaves_are_linked_within_its_diameter():
    changes = {5: Change(5, leave=(0,))}
    g, graph = grown(STAR6, changes)
    assert g.bound == 2
    check(g, graph, {1, 2, 3, 4, 5})
    assert len(g.repaired(changes, 5)) >= 5  # a ring of 5 at least (diameter 2)


@pytest.mark.parametrize("base", [LINE6, RING6, TORUS, STAR6], ids=["line", "ring", "torus", "star"])
def test_every_order_of_two_leaves_keeps_the_promises(base):
    """Every pair of founders leaving one after the other, on every example graph."""
    for a, b in itertools.permutations(range(len(base)), 2):
        changes = {4: Change(4, leave=(a,)), 9: Change(9, leave=(b,))}
        g, graph = grown(base, changes)
        check(g, graph, members(g, changes))


def test_random_histories_of_leaves_and_joins_keep_the_promises_and_read_the_same_at_every_client():
    """Seeded histories on a torus of 8 open to 4 new ids: after each leave the promises hold;
    the edges are a function of the changes alone (the dict's order, a copy, or holding later
    changes too changes nothing about step s's repair)."""
    rng = random.Random(7)
    for _ in range(30):
        changes: dict[int, Change] = {}
        live, fresh, step = set(range(8)), iter(range(8, 12)), 0
        for _ in range(6):
            step += rng.randint(1, 8)
            if len(live) > 3 and rng.random() < 0.6:
                changes[step] = Change(step, leave=(rng.choice(sorted(live)),))
            elif (j := next(fresh, None)) is not None:
                changes[step] = Change(step, join=((j, 0),))
            else:
                continue
            live = members(Growth.of(TORUS, 2), changes)
            g, graph = grown(TORUS, changes)
            if changes[step].leave:
                check(g, graph, live)
        shuffled = dict(rng.sample(sorted(changes.items()), len(changes)))
        g = Growth.of(TORUS, delay=2, repair=True)
        for s in changes:
            assert g.repaired(changes, s) == g.repaired(shuffled, s) == g.repaired(dict(changes), s)
            assert g.repaired({t: c for t, c in changes.items() if t <= s}, s) == g.repaired(changes, s)


def test_nothing_is_added_where_a_leave_leaves_everyone_linked_and_without_repair_nothing_ever():
    changes = {4: Change(4, leave=(2,))}  # complete graph of 5: the 4 left keep min(k, 3) = 3 links
    g, _ = grown(adjacency("complete", 5), changes)
    assert g.links == 4 and g.repaired(changes, 4) == ()
    changes = {4: Change(4, leave=(5,))}  # the torus (k = 3): 1, 4, 6 lost a link each
    g, _ = grown(TORUS, changes)
    assert g.repaired(changes, 4) == ((1, 4), (0, 6))
    off = Growth.of(LINE6, delay=2)
    line = {4: Change(4, leave=(1,))}
    assert off.repaired(line, 4) == () and off.graph(line, 4) == {n: frozenset(ps) for n, ps in LINE6.items()}


def test_a_split_the_links_pass_leaves_is_joined_and_a_wide_graph_is_narrowed():
    """Two triangles: every member has k = 2 links, but they are two parts: one edge joins them
    (the first of each part), and a bound of 2 then needs more edges; a bound below 1 is a bug."""
    graph = {0: {1, 2}, 1: {0, 2}, 2: {0, 1}, 3: {4, 5}, 4: {3, 5}, 5: {3, 4}}
    assert parts(graph, graph) == [frozenset({0, 1, 2}), frozenset({3, 4, 5})]
    assert repair(graph, graph, 2, 3, lambda n: False) == [(0, 3)]
    wide = repair(graph, graph, 2, 2, lambda n: False)
    joined = {n: set(ps) for n, ps in graph.items()}
    for a, b in wide:
        joined[a].add(b)
        joined[b].add(a)
    assert wide[0] == (0, 3) and diameter(joined, joined) == 2
    assert diameter(graph, graph) is None and diameter({}, ()) == 0
    with pytest.raises(ValueError, match="at least 1"):
        repair(graph, graph, 2, 0, lambda n: False)


def test_a_new_ids_edges_count_as_links():
    """A new id 6 on a line of 6 (linked to 0 and 5 by the join rule); node 1 leaves: 0 keeps
    its link to 6, so it needs one more, the fewest-linked founder."""
    g = Growth.of(LINE6, delay=1, repair=True)
    changes = {10: Change(10, join=((6, 0),)), 20: Change(20, leave=(1,))}
    assert g.graph(changes, 10)[6] == {0, 5}
    assert g.repaired(changes, 20) == ((0, 2),)
