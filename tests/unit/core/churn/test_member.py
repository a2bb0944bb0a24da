"""The churn member (core/churn/member.py, loop.py) as a deterministic state machine: a ring of
members driven through a fault schedule on the explorer's simulated network and clock (one
thread, no transport, no time), twice, gives byte-identical command traces, and the run is the
one the agreement promises (the survivors commit every step on one history, the crashed node
left out by a committed step)."""

from __future__ import annotations

import networkx as nx

import explorer as ex


def run() -> ex.World:
    g = nx.cycle_graph(5)
    w = ex.World(g, ex.protocol_for(g, steps=8), [ex.Fault(7, "crash", 2)])
    w.tracing = True
    w.run()
    return w


def test_a_recorded_schedule_replays_to_byte_identical_command_traces():
    first, second = run(), run()
    assert {i: n.trace for i, n in first.nodes.items()} == {i: n.trace for i, n in second.nodes.items()}
    assert {i: n.applied for i, n in first.nodes.items()} == {i: n.applied for i, n in second.nodes.items()}
    survivors = [first.nodes[i] for i in (0, 1, 3, 4)]
    assert all(n.state == "done" and [s for s, _ in n.applied] == list(range(8)) for n in survivors)
    assert len({repr(n.applied) for n in survivors}) == 1  # one history
    assert all(2 in n.member.roster.changes[min(n.member.roster.changes)].leave for n in survivors)
    assert any("Say" in line and "membership" in line for line in first.nodes[0].trace)
