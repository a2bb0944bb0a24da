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
from seedflood.core.churn import loop
from seedflood.core.churn.member import Member
from seedflood.core.flood.flooding import Flood
from seedflood.core.flood.hop import outbox_frames
from seedflood.core.flood.protocol import Protocol
from seedflood.core.wire.message import Message


class Node:
    """One member and what its host would hold: the hop clock, the steps applied, its trace."""

    def __init__(self, i: int, p: Protocol, peers: list[int]) -> None:
        self.i, self.p = i, p
        self.flood = Flood(i, peers, range(p.ids), 1, None, p.step_window, tolerate_conflicts=True)
        self.member = Member(p, self.flood, i, incarnation=0, attach=0, neighbours=peers, healing=False)
        self.applied: list[tuple[int, list[Message]]] = []
        self.trace: list[str] = []
        self.lost: dict[int, str] = {}
        self.frames: dict[int, bytes] = {}
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
            if isinstance(cmd, c.Exchange):
                yield "hop"  # the world exchanges every member's outbox
                result, self.frames, self.lost = c.Exchanged(self.frames, self.lost), {}, {}
            elif isinstance(cmd, c.Neighbours):
                result = (self.member.neighbours, True)
            elif isinstance(cmd, c.Estimate):
                result = [Message.make(self.i, cmd.t, self.p.seed(self.i, cmd.t), 0.5 + self.i + cmd.t)]
            elif isinstance(cmd, c.Apply):
                self.applied.append((cmd.step, cmd.msgs))
            elif isinstance(cmd, c.Revived | c.Newcomers):
                result = []
            elif isinstance(cmd, c.Now):
                result = float(self.member.clock)
            elif isinstance(cmd, c.Connect):
                result = list(cmd.peers)

    def program(self) -> Generator[str, None, None]:
        """What roles/churn.py runs: every step, then the drain."""
        for t in range(self.p.steps):
            yield from self.run(loop.step(self.member, t))
        yield from self.run(loop.drain(self.member))


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
        out = {i: outbox_frames(nodes[i].flood) for i in sorted(live)}
        for i in sorted(live):
            for q, frame in sorted(out[i].items()):
                if q in live and i in nodes[q].flood.peers:
                    nodes[q].frames[i] = frame
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
