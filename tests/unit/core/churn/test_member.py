"""The churn member (core/churn/member.py) as a deterministic state machine: members of a ring driven
through a fault schedule on a simulated network and hop clock in one thread (no transport, no
time, no threads), twice, give byte-identical command traces, and the run they make is the one
the agreement promises (the survivors commit every step, on one history, the crashed node left
out). The driver here plays roles/churn.py's part: it runs each command and sends its result."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import networkx as nx

import explorer
from seedflood.core.churn import commands as c
from seedflood.core.churn import edges, joining
from seedflood.core.churn.member import Member
from seedflood.core.flood.flooding import Flood
from seedflood.core.flood.protocol import Protocol
from seedflood.core.wire.message import Message


class Node:
    """One member and what its host would hold: the hop clock, the steps applied, its trace."""

    def __init__(self, i: int, p: Protocol, peers: list[int]) -> None:
        self.i, self.p = i, p
        self.flood = Flood(i, peers, range(p.ids), 1, None, p.step_window, tolerate_conflicts=True)
        self.member = Member(p, self.flood, i, incarnation=0, attach=0, neighbours=peers, healing=False)
        self.hops_run = 0
        self.applied: list[tuple[int, list[Message]]] = []
        self.trace: list[str] = []
        self.lost: dict[int, str] = {}
        self.stopped: str | None = None

    def run(self, steps: Generator[c.Command, Any, Any]) -> Generator[str, None, Any]:
        """Run the member's commands, yielding "hop" to the world at each exchange."""
        result: Any = None
        while True:
            try:
                cmd = steps.send(result)
            except StopIteration as done:
                return done.value
            self.trace.append(repr(cmd))
            result = None
            if isinstance(cmd, c.Hop):
                yield from self.hop()
                result = self.hops_run
            elif isinstance(cmd, c.Apply):
                self.applied.append((cmd.step, cmd.msgs))
            elif isinstance(cmd, c.Revived | c.Newcomers):
                result = []
            elif isinstance(cmd, c.Now):
                result = float(self.hops_run)
            elif isinstance(cmd, c.Connect):
                result = list(cmd.peers)

    def hop(self) -> Generator[str, None, None]:
        m = self.member
        yield from self.run(edges.unlink(m, self.hops_run))
        yield from self.run(edges.link(m, self.hops_run))
        yield "hop"  # the world exchanges every member's outbox and counts the clock
        yield from self.run(m.after_exchange(0, self.lost))
        self.lost = {}

    def program(self) -> Generator[str, None, None]:
        """Roles/churn.py's `step` and `drain` over the member."""
        p, m = self.p, self.member
        for t in range(p.steps):
            yield from self.run(joining.boundary(m, t))
            if m.originates(t):
                self.flood.originate([Message.make(self.i, t, p.seed(self.i, t), 0.5 + self.i + t)])
            for _ in range(p.hops - self.hops_run % p.hops):
                yield from self.hop()
            yield from self.run(m.agree(t, self.hops_run))
            while len(self.applied) <= t - p.delay:
                yield from self.run(m.apply_committed(len(self.applied), t, 0))
        t = p.steps
        while len(self.applied) < p.steps:
            for _ in range(p.hops - self.hops_run % p.hops):
                yield from self.hop()
            yield from self.run(m.agree(t, self.hops_run))
            while len(self.applied) <= min(t - p.delay, p.steps - 1):
                yield from self.run(m.apply_committed(len(self.applied), t, 0))
            t += 1
        for _ in range((p.delay - p.vote_lag) * p.hops):
            yield from self.hop()


def simulate(n: int, steps: int, crash: tuple[int, int]) -> dict[int, Node]:
    """A ring of n members; node crash[0] stops dead at exchange crash[1]."""
    g = nx.cycle_graph(n)
    p = explorer.protocol_for(g, steps=steps)
    nodes = {i: Node(i, p, sorted(g.neighbors(i))) for i in g.nodes}
    programs = {i: nodes[i].program() for i in nodes}
    live = set(nodes)
    for exchange in range(100_000):
        if exchange == crash[1]:
            live.discard(crash[0])
            for q in g.neighbors(crash[0]):
                nodes[q].lost[crash[0]] = "crashed"
        for i in sorted(live):
            try:
                next(programs[i])
            except StopIteration:
                live.discard(i)
            except Exception as e:  # a member's stop (MembershipError): recorded, never raised here
                nodes[i].stopped = str(e)
                live.discard(i)
        if not live:
            return nodes
        out = {i: nodes[i].flood.outbox() for i in sorted(live)}
        for i in sorted(live):
            for q, items in sorted(out[i].items()):
                if q in live and i in nodes[q].flood.peers:
                    new = nodes[q].flood.receive(i, items)
                    # notes: the member's bookkeeping (a ring without joins or leaves: nothing to run)
                    list(nodes[q].run(nodes[q].member.on_notes(new, nodes[q].hops_run, i)))
        for i in live:
            nodes[i].hops_run += 1
    raise AssertionError("the simulation did not end")


def test_a_recorded_schedule_replays_to_byte_identical_command_traces():
    first = simulate(5, steps=8, crash=(2, 7))
    second = simulate(5, steps=8, crash=(2, 7))
    assert {i: n.trace for i, n in first.items()} == {i: n.trace for i, n in second.items()}
    assert {i: n.applied for i, n in first.items()} == {i: n.applied for i, n in second.items()}
    survivors = [first[i] for i in (0, 1, 3, 4)]
    assert all(n.stopped is None and [s for s, _ in n.applied] == list(range(8)) for n in survivors)
    assert len({repr(n.applied) for n in survivors}) == 1  # one history
    assert all(2 in n.member.roster.changes[min(n.member.roster.changes)].leave for n in survivors)
    assert any("Say" in line and "membership" in line for line in first[0].trace)
