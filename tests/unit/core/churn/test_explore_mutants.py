"""The explorer catches a wrong member: each decision of the shipped churn member, switched off
(a mutant), makes a schedule the real member finishes fail in the explorer. The explorer runs the
member's own code (tests/explorer.py), so these are mutants of `src`, not of a model of it."""

from __future__ import annotations

from collections.abc import Callable

import networkx as nx
import pytest

import explorer as ex
from seedflood.core.churn import edges, joining, loop
from seedflood.core.churn.agreement import Agreement
from seedflood.core.churn.member import Member
from seedflood.core.membership.growth import Growth


def _nothing(*_args, **_kwargs):
    """A decision that does nothing: a generator that yields no command."""
    yield from ()


def restart() -> tuple[nx.Graph, ex.Protocol, list[ex.Fault], dict]:
    g = nx.cycle_graph(4)
    return g, ex.protocol_for(g, steps=8), [ex.Fault(2, "crash", 1), ex.Fault(4, "restart", 1)], {}


def join() -> tuple[nx.Graph, ex.Protocol, list[ex.Fault], dict]:
    g = nx.cycle_graph(4)
    return g, ex.protocol_for(g, steps=14, max_nodes=5), [ex.Fault(0, "join", 4)], {}


def heal() -> tuple[nx.Graph, ex.Protocol, list[ex.Fault], dict]:
    g = nx.cycle_graph(5)
    cut = frozenset({(0, 1), (2, 3)})  # splits 2-3: nobody has a majority until it heals
    return g, ex.protocol_for(g, steps=8), [ex.Fault(3, "cut", edges=cut), ex.Fault(6, "heal", edges=cut)], {}


def leave() -> tuple[nx.Graph, ex.Protocol, list[ex.Fault], dict]:
    g = nx.path_graph(5)  # node 2's leave splits the line: repair links the halves
    return g, ex.protocol_for(g, steps=10), [ex.Fault(0, "leave", 2)], {"repair": True}


def wake() -> tuple[nx.Graph, ex.Protocol, list[ex.Fault], dict]:
    g = nx.cycle_graph(4)  # node 3 wakes as the others finish the run
    return g, ex.protocol_for(g, steps=3), [ex.Fault(7, "stall", 3), ex.Fault(10, "heal", 3)], {}


def woken_sponsor() -> tuple[nx.Graph, ex.Protocol, list[ex.Fault], dict]:
    g = nx.cycle_graph(6)  # node 0 stalls; the newcomer knocks while it sleeps; it wakes alone, behind
    p = ex.protocol_for(g, steps=24, max_nodes=7)
    return g, p, [ex.Fault(15, "stall", 0), ex.Fault(17, "join", 6), ex.Fault(23, "heal", 0)], {}


def split() -> tuple[nx.Graph, ex.Protocol, list[ex.Fault], dict]:
    g = nx.cycle_graph(5)  # node 3 committed out, two cuts healed: the four left are a line 2-1-0-4
    p = ex.protocol_for(g, steps=13, hops=1, max_nodes=7)
    four, two = frozenset({(0, 4), (1, 2), (2, 3), (3, 4)}), frozenset({(0, 1), (1, 2)})
    faults = [ex.Fault(7, "cut", edges=four), ex.Fault(17, "cut", edges=two), ex.Fault(18, "heal", edges=two)]
    return g, p, [*faults, ex.Fault(29, "heal", edges=four)], {}


def _all_done(w: ex.World, out: ex.Outcome) -> bool:
    return out.safe and out.live and {s for i, s in out.states.items() if i in w.base} <= {"done", "left", "dead"}


def _four_done(w: ex.World, out: ex.Outcome) -> bool:
    return out.safe and out.live and all(out.states[i] == "done" for i in (0, 1, 2, 4))


MUTANTS: list[tuple[str, Callable, object, str, Callable, Callable[[ex.World, ex.Outcome], bool]]] = [
    # (decision, schedule, where, name, mutant, what the real member achieves there)
    ("sponsor a restart", restart, joining, "boundary", _nothing, lambda w, o: w.nodes[1].incarnation == 1),
    ("sponsor a newcomer", join, joining, "knock", _nothing, lambda w, o: o.states.get(4) == "done"),
    ("heal a down edge", heal, edges, "heal_ok", lambda m: {}, _all_done),
    ("leave", leave, Member, "leave", lambda self: None, lambda w, o: o.states[2] == "left"),
    ("repair", leave, Growth, "repaired", lambda self, changes, step: [], _all_done),
    ("admit", join, joining, "sponsor", None, lambda w, o: 4 in w.nodes[0].member.roster.members),
    ("wait for a heal after the run", wake, loop, "drain", None, _all_done),
    ("claim only while connected", woken_sponsor, joining, "knock", None, lambda w, o: o.states.get(6) == "done"),
    ("wait longer each ballot", split, Agreement, "wait", lambda self, ballot: self.quiet, _four_done),
]


def _admit_nobody(m, t, p, inc, have, hop):
    """The sponsor's catch-up without flooding the JOIN note: the voters never admit it."""
    blob = joining.catch_up(m, t, t + m.protocol.delay + 1, inc, hop, have)
    yield from ()
    return blob


def _drain_at_once(m):
    """The drain without waiting for a down edge to heal: apply every step, hop a spread, exit."""
    p = m.protocol
    t = max(m.next_step, p.steps)
    while m.applied < p.steps - 1:
        yield from loop.step_hops(m, t)
        yield from loop.agree(m, t)
        yield from loop.apply_through(m, min(t - p.delay, p.steps - 1), t)
        t += 1
    for _ in range((p.delay - p.vote_lag) * p.hops):
        yield from loop.hop(m, t)


def _knock_alone_too(m, t, hop):
    """`joining.knock` in which a member with no edge up claims at once."""
    for j in (yield from joining.look(m, t, hop)):
        if hop - m.edges.seen[j] > 2 * m.agreement.quiet or not m.flood.peers:
            if (inc := (yield ex.c.Claim(j))) is not None:
                yield ex.c.Sponsor(t, j, inc)


_REPLACE = {
    "admit": _admit_nobody,
    "wait for a heal after the run": _drain_at_once,
    "claim only while connected": _knock_alone_too,
}


@pytest.mark.parametrize("decision, schedule, where, name, mutant, achieved", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_switching_a_member_decision_off_makes_the_explorer_fail(
    decision, schedule, where, name, mutant, achieved, monkeypatch
):
    g, p, faults, kw = schedule()
    w = ex.World(g, p, faults, **kw)
    out = w.run()
    assert achieved(w, out), (decision, out.states, out.why)
    monkeypatch.setattr(where, name, _REPLACE.get(decision, mutant))
    w = ex.World(g, p, faults, **kw)
    out = w.run()
    assert not achieved(w, out), f"the mutant of '{decision}' went unnoticed: {out.states}"
