"""The schedule explorer: fault schedules of small graphs, run on the shipped churn member.

Owns `World`: N clients, each a real `core.churn.member.Member` running the real schedule
(`core.churn.loop.step` for every step, then `loop.drain`; a newcomer first `joining.rejoin`s
from its sponsor's catch-up): the generators roles/churn.py runs in every client. The world
only executes the commands they yield, on a simulated network and clock, in one thread, so
every run is deterministic and a failure repeats from its schedule. It decides nothing a
client decides: votes, commits, sponsoring, joins, leaves, heals, links and repair are the
member's; the heal negotiation and the sponsor claim are the in-process transport's
(`comm.memorywires.Wires`). Faults are data (`Fault`), so a program can enumerate them.

The network. A round is one unit of time (`Now` reads round × ROUND_S s). In each round every
running client runs until it waits in an exchange (`Exchange`) or a meeting (`Connect`), then
every meeting whose two ends both asked connects, then every exchange that can complete does.
An exchange at hop clock k sends the client's frames (`hop.outbox_frames`) into one FIFO queue
per edge end it holds up, tagged k, and completes once each such peer's frame tagged k is
there, or the peer is lost: dead, asleep (a stall), finished, across a cut, its end closed
(a `Drop`, a `Part`, a lost edge), or not there within LATE_ROUNDS rounds (a live peer on
another clock). Clients of one connected part share the clock, so in a run without faults every
client exchanges once a round (the lockstep the paper's flooding assumes); a client alone holds
its clock (edges.heal) and a healed edge connects at one agreed index at both ends, as the
transports do. A meeting waits MEET_ROUNDS rounds for its other end.

Faults (`Fault.kind`), each at a round:
- `crash`: the node's frames of that round reach only the neighbours in `reach`; then it is dead.
- `stall`: the node stops answering at that round: its neighbours lose it. A later `heal` of the
  node wakes it (until then it runs nothing), and its edges are gone (gloo closes a timed-out
  pair for good): they may heal. A stall without one cuts its links for good.
- `cut`: the links in `edges` lose frames both ways (a partition is a cut of every link across it).
- `heal`: the links in `edges` (cut earlier) work again, or stalled `node` wakes; a down edge
  comes back only through the members' heal negotiation (edges.heal over `Wires.heal`).
- `restart`: a dead node's supervisor starts it again as a new incarnation: its neighbours'
  transports report it revived (`Revived`), one claims it (`Claim`) and sponsors it.
- `join` (a protocol with `max_nodes`): brand-new id `node` knocks from that round on
  (`Newcomers`); a member the join rule links it to claims and sponsors it.
- `leave`: the node is asked to leave gracefully (`Member.leave`).
- `equivocate`: the node's frames of that round carry another copy (another scalar) of each of
  its own messages to the neighbours in `reach`, the first copy to the others.
- Byzantine voters (a signed world: every item carries its origin's seal), from that round on,
  about each vote the node originates: `double` (another signed value to `reach`), `bogus` (a
  value it does not hold), `mute` (no vote), `split` (a two-faced bridge: it relays nothing but
  its own messages and tells each neighbour it voted what that neighbour voted).
The sponsor's handshake (meeting, a signed challenge, the newcomer's word of what it holds) is
the transport's and the driver's: here a claimed newcomer is met at once and holds nothing.

Checks (`Outcome`): safety — every client's applied (step, digest) list is a prefix of one
history, and so is the evaluator's log (it follows whichever client is the attach node, through
the real `stepstream.StepSequence`, which refuses two contents for one step); liveness — where
the final graph has a connected part holding a strict majority (of every client, or with
membership changes of the roster its least advanced laggard had to commit with), all of its
clients finish. A client the finishing majority committed out while it was away is not
expected to finish (it stops; a restart rejoins it).
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
import random
import re
import shlex
import sys
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from seedflood.comm.memorywires import Faults as WireFaults
from seedflood.comm.memorywires import Wires
from seedflood.core.churn import commands as c
from seedflood.core.churn import joining, loop, prefix
from seedflood.core.churn.agreement import Value, Vote, step_digest
from seedflood.core.churn.member import Left, Member
from seedflood.core.churn.voter import Voter
from seedflood.core.flood.flooding import Flood
from seedflood.core.flood.hop import decode_hop, encode_hop, outbox_frames
from seedflood.core.flood.protocol import Protocol, schedule
from seedflood.core.flood.signing import Signing
from seedflood.core.flood.stepstream import StepSequence
from seedflood.core.membership.growth import Growth
from seedflood.core.membership.notes import VOTE, Note
from seedflood.core.membership.roster import ExcludedError, JoinMissedError, MembershipError
from seedflood.core.wire.message import FrameError, Message

Edge = tuple[int, int]
Program = Generator[c.Command, Any, None]

ROUND_S = 1.0  # simulated seconds per round: what `Now` reads
MEET_ROUNDS = 2  # a meeting (`Connect`) waits this many rounds for its other end
LATE_ROUNDS = 64  # a live peer whose frame has not come is waited for this many rounds, then lost
RESTARTS = 5  # a newcomer whose JOIN step committed without it is started again at most this often
PARK = object()  # `_do`'s answer for a command the client waits in (an exchange, a meeting)


def edge(a: int, b: int) -> Edge:
    return (min(a, b), max(a, b))


def graphs(max_nodes: int = 5) -> dict[str, nx.Graph]:
    """The named graphs the explorer covers: line, ring, star, complete, wheel, 2×2 torus, and a
    ring with a chord, for every size that makes them distinct up to `max_nodes`."""
    out: dict[str, nx.Graph] = {}
    for n in range(3, max_nodes + 1):
        out[f"line{n}"] = nx.path_graph(n)
        out[f"star{n}"] = nx.star_graph(n - 1)
        out[f"complete{n}"] = nx.complete_graph(n)
        if n >= 4:
            out[f"ring{n}"] = nx.cycle_graph(n)
    if max_nodes >= 5:
        out["wheel5"] = nx.wheel_graph(5)
        chord = nx.cycle_graph(5)
        chord.add_edge(0, 2)
        out["chord5"] = chord
    out["torus2x2"] = nx.convert_node_labels_to_integers(nx.grid_2d_graph(2, 2, periodic=False))
    return out


def larger_graphs() -> dict[str, nx.Graph]:
    """The graphs of 6-8 nodes the random deeper schedules run on: a ring of 8, a 2×4 torus, a
    wheel of 7 and a line of 6."""
    return {
        "ring8": nx.cycle_graph(8),
        "torus2x4": nx.convert_node_labels_to_integers(nx.grid_2d_graph(2, 4, periodic=True)),
        "wheel7": nx.wheel_graph(7),
        "line6": nx.path_graph(6),
    }


def protocol_for(g: nx.Graph, steps: int, hops: int = 0, settle: int = 1, max_nodes: int = 0) -> Protocol:
    """The churn protocol a run on `g` would use (full flooding unless `hops`), K = 1; with
    `max_nodes` (churn.max_nodes) new ids N..max_nodes-1 may join."""
    diameter = nx.diameter(g)
    hops = hops or max(1, diameter)
    vote_lag, delay = schedule(diameter, hops, settle=settle)
    return Protocol(
        run_seed=0,
        n_origins=g.number_of_nodes(),
        perturbations=1,
        steps=steps,
        lr=1.0,
        schedule="constant",
        warmup_steps=0,
        weight=1.0,
        eps=1e-3,
        hops=hops,
        delay=delay,
        max_scalar=1e6,
        step_window=64,
        settle=settle,
        vote_lag=vote_lag,
        max_nodes=max_nodes,
    )


@dataclass(frozen=True)
class Fault:
    round: int
    kind: str  # crash | stall | cut | heal | restart | join | leave | equivocate | double | bogus | mute | split
    node: int = -1
    reach: frozenset[int] = frozenset()
    edges: frozenset[Edge] = frozenset()

    def __str__(self) -> str:
        if self.kind in ("crash", "equivocate", "double"):
            return f"r{self.round}:{self.kind} {self.node}→{sorted(self.reach)}"
        if self.kind in ("cut", "heal") and self.edges:
            return f"r{self.round}:{self.kind} {sorted(self.edges)}"
        return f"r{self.round}:{self.kind} {self.node}"


# -- signatures --------------------------------------------------------------------------------------
def _mac(node: int, payload: bytes) -> bytes:
    """A stand-in for node's Ed25519 signature (the core injects sign/verify): 64 bytes only
    node's key makes, here a keyed hash — the explorer checks the protocol, not the crypto."""
    return hashlib.blake2b(payload, key=b"explorer-%d" % node, digest_size=64).digest()


def signing(node: int) -> Signing:
    """Node's seal and check in a signed world (flood.signing, as comm/identity.py backs it)."""
    return Signing(
        node, b"explorer-run-tag", lambda payload: _mac(node, payload), lambda o, pl, sig: _mac(o, pl) == sig
    )


# -- one client --------------------------------------------------------------------------------------
@dataclass
class Node:
    """One client: its member, the program it runs and what its transport holds."""

    i: int
    member: Member
    program: Program
    incarnation: int = 0
    state: str = "run"  # run | asleep (a stall a heal wakes) | left | done | stopped | dead
    why: str = ""
    applied: list[tuple[int, int]] = field(default_factory=list)  # (step, digest), as it applied them
    excluded: bool = False  # stopped because the others committed a step without it
    waiting: c.Command | None = None  # the exchange or meeting it waits in
    since: int = 0  # the round it began waiting
    result: Any = None  # what its program is sent next
    ends: set[int] = field(default_factory=set)  # peers whose edge is up at this end
    neighbours: set[int] = field(default_factory=set)  # its transport's neighbours, up or not
    lost: dict[int, str] = field(default_factory=dict)  # edges gone at this end since its last exchange
    met: set[int] = field(default_factory=set)  # a meeting's peers met so far
    trace: list[str] = field(default_factory=list)  # every command its member yielded (`World.tracing`)

    @property
    def running(self) -> bool:
        return self.state == "run"

    @property
    def flood(self) -> Flood:
        return self.member.flood

    @property
    def voter(self) -> Voter:
        return self.member.voter

    @property
    def history(self) -> list[tuple[int, list[Message]]]:
        return self.member.history

    @property
    def clock(self) -> int:
        return self.member.clock


# -- the world --------------------------------------------------------------------------------------
@dataclass
class Outcome:
    histories: dict[int, list[tuple[int, int]]]
    states: dict[int, str]
    why: dict[int, str]
    log: list[tuple[int, int]]
    lied: set[int]
    safe: bool
    live: bool
    problem: str = ""
    laggards: set[int] = field(default_factory=set)  # the connected majority's clients that did not finish
    repro: str = ""  # the one command that runs this schedule again (`main`)


BYZANTINE = ("double", "bogus", "mute", "split")
"""Fault kinds of a lying voter (a signed world)."""
FAULTY = ("equivocate", *BYZANTINE)
"""Fault kinds whose node the liveness check leaves out (the others finish without it)."""
MEMBERSHIP = ("join", "leave")
"""Fault kinds that change the roster through a committed step."""


class World:
    def __init__(
        self, g: nx.Graph, protocol: Protocol, faults: Sequence[Fault] = (), signed: bool = False, repair: bool = False
    ) -> None:
        self.base = g  # the starting topology (the founders' edges)
        self.g = nx.Graph(g)  # every link there ever was: the topology, a join's and a repair's edges
        self.p = protocol
        self.signed = signed
        self.faults = sorted(faults, key=lambda f: f.round)
        if not signed and any(f.kind in BYZANTINE for f in self.faults):
            raise ValueError("a lying voter needs a signed world (its lies are its own signed votes)")
        joins = [f.node for f in self.faults if f.kind == "join"]
        if any(not g.number_of_nodes() <= j < protocol.ids for j in joins) or len(set(joins)) < len(joins):
            raise ValueError(f"joins {joins}: each a new id once, in {g.number_of_nodes()}..{protocol.ids - 1}")
        base = {i: sorted(g.neighbors(i)) for i in g.nodes}
        self.growth = Growth.of(base, protocol.delay, repair=repair) if joins or repair else None
        # its down edges heal (the in-process transport): a world with a heal, a join or repair
        self.healing = any(f.kind in ("heal", "join") for f in self.faults) or repair
        self.membership = repair or any(f.kind in MEMBERSHIP for f in self.faults)
        self.wires = Wires(base, 1.0, WireFaults())  # the heal negotiation and the sponsor claim
        self.round = 0  # the round being run
        self.nodes: dict[int, Node] = {}
        self.queues: dict[tuple[int, int], list[tuple[int, bytes]]] = {}  # (src, dst) -> (clock, frame), FIFO
        self.sponsored: dict[int, tuple[int, int, int]] = {}  # new id -> (sponsor, round, JOIN step)
        self.linked: list[tuple[int, Edge]] = []  # (round, link) of each rejoin or join edge that connected
        self.healed: list[tuple[int, Edge]] = []  # (round, link) of each heal that connected
        self.closed_at: dict[int, int] = {}  # node -> round its client exited, stopped, left or died
        self.revived: dict[int, int] = {}  # restarted node waiting for a sponsor -> its incarnation
        self.told: dict[int, set[int]] = {}  # revived node -> the neighbours its knock was reported to
        self.knocking: list[int] = []  # brand-new ids waiting for a sponsor
        self.dying: dict[int, frozenset[int]] = {}  # crashing this round -> the neighbours its frames reach
        self.lying: dict[int, frozenset[int]] = {}  # equivocating this round -> the neighbours it lies to
        self.voting: dict[int, Fault] = {}  # lying voters, from their round on
        self.lied: set[int] = set()  # equivocating nodes whose frame did carry another copy
        self.doubled: dict[int, int] = {}  # double voter -> first step whose vote went out two ways
        self._told: set[tuple[int, int, Note]] = set()  # split: (liar, neighbour, vote) already sent
        self.log: list[tuple[int, int]] = []  # the evaluator's
        self.seq = StepSequence(0)
        self.attach_node = -1
        self.error = ""
        self.restarts = RESTARTS  # lives a newcomer whose JOIN step committed without it gets
        self.tracing = False  # record every command in `Node.trace` (test_member.py)
        for i in g.nodes:
            n = self._node(i, 0, base[i])
            n.ends = set(base[i])
            n.program = self._founder(n.member)

    def _node(self, i: int, incarnation: int, neighbours: Iterable[int]) -> Node:
        p = self.p
        seal = signing(i) if self.signed else None
        flood = Flood(
            i,
            sorted(neighbours) if not incarnation and i in self.base else [],
            range(p.ids),
            1,
            None,
            p.step_window,
            tolerate_conflicts=True,
            signing=seal,
        )
        member = Member(
            p,
            flood,
            i,
            incarnation=incarnation,
            attach=0,
            neighbours=sorted(neighbours),
            growth=self.growth,
            grows=self.growth is not None,
            healing=self.healing,
            meet_timeout_s=p.patience_hops * ROUND_S,  # the heal wait: HEAL_FACTOR × patience rounds
        )
        n = Node(i, member, iter(()), incarnation=incarnation, neighbours=set(neighbours))
        n.since = self.round
        self.nodes[i] = n
        return n

    def _founder(self, m: Member) -> Program:
        """What a founding client runs: every step, then the drain."""
        for t in range(self.p.steps):
            yield from loop.step(m, t)
        yield from loop.drain(m)

    def _newcomer(self, m: Member, blob: bytes) -> Program:
        """What a sponsored client runs: the catch-up, then its steps from there, then the drain."""
        m.next_step = yield from joining.rejoin(m, blob)
        for t in range(m.next_step, self.p.steps):
            yield from loop.step(m, t)
        yield from loop.drain(m)

    # -- running -----------------------------------------------------------------------------
    def run(self, max_rounds: int | None = None) -> Outcome:
        p = self.p
        limit = max_rounds or (p.steps + p.delay + 2) * p.hops + 2 * p.patience_hops + 8 * p.hops * (p.delay + 1)
        if self.faults:  # after the last fault: the heal waits and a late peer's bound
            limit += max(f.round for f in self.faults) + 2 * Protocol.HEAL_FACTOR * p.patience_hops + LATE_ROUNDS
        pending = list(self.faults)
        for r in range(limit):
            self.round = r
            if not any(n.running or (n.state == "asleep" and pending) for n in self.nodes.values()):
                break
            while pending and pending[0].round <= r:
                self._fault(pending.pop(0))
            self._advance()
            self._exchanges()
            for v in sorted(self.dying):
                self._close(self.nodes[v], "dead", "crashed")
                self.wires.faults.dead[v] = "crashed"
            self.dying.clear()
            self.lying.clear()
        return self._outcome()

    def _fault(self, f: Fault) -> None:
        n = self.nodes.get(f.node)
        if f.kind == "crash" and n is not None and n.running:
            self.dying[f.node] = f.reach
        elif f.kind == "equivocate" and n is not None and n.running:
            self.lying[f.node] = f.reach
        elif f.kind in BYZANTINE:
            self.voting[f.node] = f
        elif f.kind == "stall" and n is not None and n.running:
            if any(h.kind == "heal" and h.node == f.node and not h.edges and h.round > f.round for h in self.faults):
                n.state = "asleep"  # a sleep: it wakes at that heal
            else:
                self._sever({edge(f.node, u) for u in self.g.neighbors(f.node)})
        elif f.kind == "cut":
            self._sever(f.edges)
        elif f.kind == "heal":
            if f.edges:
                self.wires.faults.cut -= {x for a, b in f.edges for x in ((a, b), (b, a))}
            elif n is not None and n.state == "asleep":
                n.state = "run"
                n.lost.update({q: "timed out while this client slept" for q in n.ends})
                n.ends.clear()
                n.since = self.round
        elif f.kind == "restart" and n is not None and n.state == "dead" and f.node not in self.revived:
            self._revive(n)
        elif f.kind == "join":
            self.knocking.append(f.node)
            self.wires.add(f.node)
        elif f.kind == "leave" and n is not None and n.running:
            n.member.leave()

    def _revive(self, n: Node) -> None:
        """n's process starts again as its next incarnation: its neighbours' transports report it."""
        inc = n.incarnation + 1
        self.revived[n.i] = inc
        self.told[n.i] = set()
        self.wires.faults.dead.pop(n.i, None)
        self.wires.closed.discard(n.i)
        self.wires.faults.incarnations[n.i] = inc
        self.wires.renew(n.i)

    def _sever(self, edges: Iterable[Edge]) -> None:
        """Cut links: frames are lost both ways (and the negotiation refuses to heal them)."""
        for a, b in edges:
            self.wires.faults.cut |= {(a, b), (b, a)}

    # -- the clients' programs -------------------------------------------------------------------
    def _advance(self) -> None:
        """Run every client until it waits in an exchange or a meeting; connect the meetings
        both of whose ends asked, and run on those they end, until nobody moves."""
        while True:
            moved = False
            for i in sorted(self.nodes):
                n = self.nodes[i]
                if n.running and n.waiting is None:
                    self._go(n)
                    moved = True
            if not self._meet() and not moved:
                return

    def _go(self, n: Node) -> None:
        """Run n's program until it waits or ends."""
        while n.running and n.waiting is None:
            try:
                cmd = n.program.send(n.result)
            except StopIteration:
                self._close(n, "done")
                return
            except Left as e:
                self._close(n, "left", str(e))
                return
            except MembershipError as e:
                n.excluded = isinstance(e, ExcludedError)
                self._close(n, "stopped", str(e))
                if isinstance(e, JoinMissedError) and n.incarnation < self.restarts:
                    self._revive(n)  # started again at once and sponsored again (roles/inprocess.py)
                return
            n.result = None
            out = self._do(n, cmd)
            if out is PARK:
                n.waiting, n.since = cmd, self.round
            else:
                n.result = out

    def _run_now(self, n: Node, steps: Generator[c.Command, Any, Any]) -> Any:
        """Run a nested entry point of n's member (the sponsor's part) to its end: it never waits."""
        result: Any = None
        while True:
            try:
                cmd = steps.send(result)
            except StopIteration as done:
                return done.value
            result = self._do(n, cmd)
            assert result is not PARK, cmd

    def _close(self, n: Node, state: str, why: str = "") -> None:
        """n's process ends (`state`): every edge of it closes."""
        n.state, n.why = state, why or n.why
        n.waiting = None
        n.ends.clear()
        self.wires.closed.add(n.i)
        self.closed_at.setdefault(n.i, self.round)

    def _do(self, n: Node, cmd: c.Command) -> Any:  # noqa: C901 (one dispatch)
        """Execute one command of n's member: the transport's part, the model's, the clock's."""
        m, i = n.member, n.i
        if self.tracing:
            n.trace.append(repr(cmd))
        if isinstance(cmd, c.Exchange):
            self._send(n, cmd.t)
            return PARK
        if isinstance(cmd, c.Connect):
            if not cmd.meet:  # a catch-up's edge: its sponsor connected it already
                return [q for q in cmd.peers if q in n.ends]
            n.met = set()
            return PARK
        if isinstance(cmd, c.Neighbours):
            return tuple(sorted(n.neighbours)), bool(n.ends)
        if isinstance(cmd, c.Estimate):
            return [Message.make(i, cmd.t, self.p.seed(i, cmd.t, 0), float(i + 1), 0)]
        if isinstance(cmd, c.Apply):
            n.applied.append((cmd.step, m.agreement.digests[cmd.step]))
            if cmd.fresh and self.attach_node == i and m.roster.attach == i:
                self._offer([n.applied[-1]])
        elif isinstance(cmd, c.ApplyAll):
            n.applied += [(s, m.agreement.digests[s]) for s, _ in cmd.steps]
        elif isinstance(cmd, c.Follow):
            if m.roster.attach == i and self.attach_node != i:  # the evaluator's new edge: catch-up first
                self.attach_node = i
                self._offer([x for x in n.applied if x[0] >= len(self.log)])
        elif isinstance(cmd, c.Now):
            return self.round * ROUND_S
        elif isinstance(cmd, c.Revived):
            fresh = [v for v in sorted(self.revived) if v in n.neighbours and i not in self.told[v]]
            for v in fresh:
                self.told[v].add(i)
            return fresh
        elif isinstance(cmd, c.Newcomers):
            return list(self.knocking)
        elif isinstance(cmd, c.Claim):
            v = cmd.peer
            if v not in self.revived and v not in self.knocking or not self.wires.claim(i, v):
                return None
            return self.revived.get(v, 0)
        elif isinstance(cmd, c.Sponsor):
            self._sponsor(n, cmd)
        elif isinstance(cmd, c.Grow):
            for q in cmd.peers:
                if q != i and q not in n.neighbours:
                    n.neighbours.add(q)
                    self.wires.link(i, q)
                    self.g.add_edge(i, q)
            return tuple(sorted(n.neighbours))
        elif isinstance(cmd, c.Part | c.Drop):
            n.ends.discard(cmd.peer)
        elif isinstance(cmd, c.AskHeal):
            return self.wires.heal(i, dict(cmd.want), cmd.hop)
        elif isinstance(cmd, c.Restore):
            q = cmd.peer
            n.ends.add(q)
            self.wires.healed(i, q)
            if q in self.nodes and i in self.nodes[q].ends:
                self.healed.append((self.round, edge(i, q)))
        elif isinstance(cmd, c.StateHash):
            return hashlib.sha256(repr(n.applied).encode()).hexdigest()
        return None  # Clock (the member keeps its clock), Idle, Received, Say

    # -- sponsoring ------------------------------------------------------------------------------
    def _sponsor(self, s: Node, cmd: c.Sponsor) -> None:
        """`Churn._sponsor` on a network that meets at once: sponsor s admits claimed `cmd.peer`
        (its member floods the JOIN note and makes the catch-up); the newcomer's process starts
        with that catch-up, its edge to s up at both ends."""
        v, p = cmd.peer, self.p
        if self.wires.is_cut(s.i, v) or (v not in self.revived and v not in self.knocking):
            return  # it is gone again
        blob = self._run_now(s, joining.sponsor(s.member, cmd.t, v, cmd.inc, prefix.NOTHING, s.member.clock))
        old = self.nodes.get(v)
        if v in self.knocking:
            self.knocking.remove(v)
            self.sponsored[v] = (s.i, self.round, cmd.t + p.delay + 1)
            neighbours = {s.i}  # its transport holds its sponsor; its member grows the rest
        else:
            del self.revived[v]
            neighbours = (set(self.base.neighbors(v)) if v in self.base else set()) | (old.neighbours if old else set())
        n = self._node(v, cmd.inc, neighbours | {s.i})
        n.program = self._newcomer(n.member, blob)
        n.ends, s.ends = {s.i}, s.ends | {v}
        for key in ((s.i, v), (v, s.i)):
            self.queues.pop(key, None)
        self.linked.append((self.round, edge(s.i, v)))
        s.member.flood.add_peer(v)

    # -- meetings and exchanges -----------------------------------------------------------------
    def _meet(self) -> bool:
        """Connect each pair of clients waiting in a meeting for each other (over a live, uncut
        link); end the meetings that met every peer or waited MEET_ROUNDS. Returns whether any ended."""
        meeting = {i: n for i, n in self.nodes.items() if n.running and isinstance(n.waiting, c.Connect)}
        for i, n in sorted(meeting.items()):
            assert isinstance(n.waiting, c.Connect)
            for q in n.waiting.peers:
                other = meeting.get(q)
                if other is None or q in n.met or self.wires.is_cut(i, q):
                    continue
                assert isinstance(other.waiting, c.Connect)
                if i in other.waiting.peers and i not in other.met:
                    n.met.add(q)
                    other.met.add(i)
                    n.ends.add(q)
                    other.ends.add(i)
                    for key in ((i, q), (q, i)):
                        self.queues.pop(key, None)
                    self.linked.append((self.round, edge(i, q)))
        ended = False
        for n in meeting.values():
            assert isinstance(n.waiting, c.Connect)
            if n.met >= set(n.waiting.peers) or self.round - n.since >= MEET_ROUNDS:
                n.waiting, n.result = None, sorted(n.met)
                ended = True
        return ended

    def _send(self, n: Node, t: int) -> None:
        """n's frames of its exchange at its clock, into the queue of each edge it holds up
        (what a dying node's last frames reach, what a liar sends in place of its own)."""
        k, i = n.clock, n.i
        frames = outbox_frames(n.flood)
        if i in self.voting and frames:
            frames = self._lie(n, self.voting[i], frames, t)
        for q in sorted(n.ends):
            frame = frames.get(q, b"")  # an edge up but not yet the flood's: an empty frame, as the transports send
            if self.wires.is_cut(i, q) or (i in self.dying and q not in self.dying[i]):
                continue
            if i in self.lying and q in self.lying[i]:
                frame = self._equivocate(n, frame, t)
            self.queues.setdefault((i, q), []).append((k, frame))

    def _exchanges(self) -> None:
        """Complete every exchange whose peers' frames are here or whose peers are lost."""
        for i in sorted(self.nodes):
            n = self.nodes[i]
            if not (n.running and isinstance(n.waiting, c.Exchange)):
                continue
            frames: dict[int, bytes] = {}
            lost = dict(n.lost)
            late = self.round - n.since >= LATE_ROUNDS
            waits = False
            for q in sorted(n.ends):
                why = self._gone(n, q)
                if why is None:
                    frame = self._peek(q, i, n.clock)
                    if frame is not None:
                        frames[q] = frame
                        continue
                    why = "late: no frame within the bound" if late else None
                if why is None:
                    waits = True
                else:
                    lost[q] = why
            if waits:
                continue
            for q in frames:
                self.queues[(q, i)].pop(0)
            for q in lost:
                n.ends.discard(q)
                self.queues.pop((q, i), None)
            n.lost = {}
            n.waiting, n.result = None, c.Exchanged(frames, lost)

    def _gone(self, n: Node, q: int) -> str | None:
        """Why n's edge to q is gone (None: it is up, its frame may still come)."""
        other = self.nodes.get(q)
        if other is None or other.state in ("dead", "done", "stopped", "left"):
            return f"node {q} is gone ({other.state if other else 'never started'})"
        if other.state == "asleep":
            return f"node {q} stopped answering"
        if self.wires.is_cut(n.i, q):
            return "the link is cut"
        if n.i not in other.ends:
            at = self.wires.agreed(n.i, q)
            if at is not None and at >= other.clock:
                return None  # its end connects at the agreed index, still ahead of its clock
            return f"node {q} closed its end"
        return None

    def _peek(self, src: int, dst: int, k: int) -> bytes | None:
        """src's frame of exchange k to dst, if it came (older ones are dropped: an earlier edge's)."""
        q = self.queues.get((src, dst), [])
        while q and q[0][0] < k:
            q.pop(0)
        return q[0][1] if q and q[0][0] == k else None

    # -- the evaluator ---------------------------------------------------------------------------
    def _offer(self, steps: Iterable[tuple[int, int]]) -> None:
        """Steps the attach node hands the evaluator (stepstream.StepSequence refuses a second content)."""
        if self.error:
            return
        try:
            for s, d in steps:
                if self.seq.offer(s, d.to_bytes(8, "little")):
                    self.log.append((s, d))
        except FrameError as e:
            self.error = str(e)

    # -- liars -----------------------------------------------------------------------------------
    def _items(self, frame: bytes, t: int) -> tuple[list[Message], list[Note]]:
        return decode_hop(frame, self.p.wire_limits(t))

    def _equivocate(self, n: Node, frame: bytes, t: int) -> bytes:
        """The frame with another copy of each of n's own messages in it."""
        msgs, notes = self._items(frame, t)
        if not any(m.origin == n.i for m in msgs):
            return frame
        self.lied.add(n.i)
        other = [_other_copy(m) if m.origin == n.i else m for m in msgs]
        return encode_hop(other, notes, self.signed)

    def _lie(self, n: Node, f: Fault, frames: dict[int, bytes], t: int) -> dict[int, bytes]:
        """What lying voter n sends each neighbour in place of its own votes (the module docstring)."""
        p = self.p
        out: dict[int, bytes] = {}
        for peer, frame in frames.items():
            msgs, notes = self._items(frame, t)
            if f.kind == "split":
                out[peer] = encode_hop([m for m in msgs if m.origin == n.i], self._echo(n, peer), True)
                continue
            kept = []
            for item in notes:
                if not (item.kind == VOTE and item.origin == n.i):
                    kept.append(item)
                elif f.kind == "bogus":
                    kept.append(self._signed_vote(n, item, lambda v, _: _bogus(v, p.n_origins)))
                elif f.kind == "double" and peer in f.reach:
                    kept.append(self._signed_vote(n, item, lambda v, s: _less_one(n, v, s)))
                    if len(f.reach) < len(frames):
                        self.doubled.setdefault(n.i, item.step)
                elif f.kind != "mute":
                    kept.append(item)
            out[peer] = encode_hop(msgs, kept, True)
        return out

    def _echo(self, n: Node, peer: int) -> list[Note]:
        """Split liar n's votes for `peer`: each value `peer` voted (in the votes n holds), as n's."""
        out = []
        assert n.flood.signing is not None
        for s in range(self.p.steps):
            for v in n.voter.votes(s):
                if v.origin == peer:
                    mine = Vote(v.step, v.ballot, n.i, n.incarnation, v.value).note(self.p.ids)
                    if (n.i, peer, mine) not in self._told:
                        self._told.add((n.i, peer, mine))
                        out.append(n.flood.signing.seal(mine))
        return out

    def _signed_vote(self, n: Node, note: Note, other: Callable[[Value, int], Value]) -> Note:
        """Note's vote with another value (`other(value, step)`), signed anew by its origin."""
        vote = Vote.of(note, self.p.ids)
        lie = dataclasses.replace(vote, value=other(vote.value, vote.step)).note(self.p.ids)
        assert n.flood.signing is not None
        return n.flood.signing.seal(lie)

    @property
    def parted_by(self) -> dict[int, set[int]]:
        """Leaver -> the neighbours that took its LEAVE note from its own frame (and so closed
        their end before the exchange it names, never healing it: edges.unlink)."""
        out: dict[int, set[int]] = {}
        for n in self.nodes.values():
            e = n.member.edges
            for q in {*e.parted, *e.unlink}:
                out.setdefault(q, set()).add(n.i)
        return out

    def repro(self) -> str:
        """The command that runs this world again (`main`): its graph, protocol and faults."""
        p, name = self.p, _name_of(self.base)
        args = [name, f"--steps {p.steps}", f"--hops {p.hops}", f"--settle {p.settle}"]
        args += [f"--max-nodes {p.max_nodes}"] if p.max_nodes else []
        args += ["--signed"] if self.signed else []
        args += ["--repair"] if self.growth is not None and self.growth.repair else []
        return "python tests/explorer.py " + " ".join(args + [shlex.quote(str(f)) for f in self.faults])

    def final_graph(self, drop: Iterable[Edge] = ()) -> nx.Graph:
        """The graph liveness is judged on: the clients still there (not dead, left, lying or, with
        heals, committed out while away) and the links no fault took, less `drop`."""
        final = nx.Graph()
        liars = {f.node for f in self.faults if f.kind in FAULTY}
        final.add_nodes_from(i for i, n in self.nodes.items() if n.state not in ("dead", "left") and i not in liars)
        if self.healing:  # a client committed out while it was away stops (a restart rejoins it)
            final.remove_nodes_from(self._committed_out())
        gone = {edge(*e) for e in drop}
        final.add_edges_from(e for e in self._final_links() if all(x in final for x in e) and e not in gone)
        return final

    def never_up(self) -> set[Edge]:
        """The edges a join grew that never connected (no link round, no heal brought them up)."""
        founders = self.base.number_of_nodes()
        grown = {edge(a, b) for a, b in self.g.edges if max(a, b) >= founders}
        return grown - {e for _, e in self.linked} - {e for _, e in self.healed}

    def _outcome(self, drop: Iterable[Edge] = ()) -> Outcome:
        hist = {i: n.applied for i, n in self.nodes.items()}
        longest = max(hist.values(), key=len)
        problem = ""
        for i, h in hist.items():
            if h != longest[: len(h)]:
                problem = f"node {i} applied {h} but node {self._who(longest)} applied {longest}"
        if not problem and self.log != longest[: len(self.log)]:
            problem = f"the evaluator logged {self.log}, the clients applied {longest}"
        if not problem and self.error:
            problem = f"the evaluator refused a step: {self.error}"
        safe = not problem
        final = self.final_graph(drop)
        live, lag = True, set()
        for part in nx.connected_components(final):
            if self._majority(part):
                laggards = [i for i in sorted(part) if self.nodes[i].state != "done"]
                if laggards:
                    live = False
                    lag |= set(laggards)
                    problem = problem or "liveness: " + "; ".join(
                        f"node {i} {self.nodes[i].state} ({self.nodes[i].why or 'no line'})" for i in laggards
                    )
        return Outcome(
            hist,
            {i: n.state for i, n in self.nodes.items()},
            {i: n.why for i, n in self.nodes.items()},
            self.log,
            self.lied,
            safe,
            live,
            problem,
            lag,
            self.repro(),
        )

    def _final_links(self) -> Iterable[Edge]:
        """The links no fault took (a client that merely finished still counts as connected; an
        equivocating one counts as gone: the others exclude it), with every heal in, in schedule
        order (a heal brings back only a link whose ends had not closed before they could connect)."""
        if not self.healing:
            gone = {edge(a, b) for f in self.faults if f.kind == "cut" for a, b in f.edges}
            for f in self.faults:
                if f.kind in ("crash", "stall", *FAULTY):
                    gone |= {edge(f.node, u) for u in self.g.neighbors(f.node)}
            return [edge(a, b) for a, b in self.g.edges if edge(a, b) not in gone]
        cut: set[Edge] = set()
        stalled: set[Edge] = set()
        dead: set[Edge] = set()  # a crashed or lying node's links: no heal brings them back
        # in round order (a schedule lists its faults in any order); a leaver holds no node of `final`
        for f in sorted((f for f in self.faults if f.kind not in MEMBERSHIP), key=lambda f: f.round):
            links = {edge(a, b) for a, b in f.edges} or {edge(f.node, u) for u in self.g.neighbors(f.node)}
            if f.kind in ("crash", *FAULTY):
                dead |= links
            elif f.kind == "cut":
                cut |= links
            elif f.kind == "stall":
                stalled |= links
            elif f.kind == "heal":
                at = f.round + Protocol.HEAL_AHEAD  # the first round its ends can connect at
                back = {e for e in links if all(self.closed_at.get(x, at) >= at for x in e)}
                if f.edges:
                    cut -= back  # a healed cut link of a node still asleep stays down until it wakes
                else:
                    stalled -= back - cut  # a woken node's cut links stay cut
        return [edge(a, b) for a, b in self.g.edges if edge(a, b) not in cut | stalled | dead]

    def _majority(self, part: set[int]) -> bool:
        """The connected part holds a strict majority: of every client, or with membership
        changes of the roster its least advanced client that did not finish had to commit the
        next step with (R_s: a join or a leave changes it only through a committed step)."""
        if not self.membership:
            return 2 * len(part) > len(self.nodes)
        behind = [self.nodes[i].voter.agreement for i in part if self.nodes[i].state != "done"]
        if not behind:
            return False  # every client of it finished
        roster = min(behind, key=lambda a: a.through).roster.members
        return 2 * len(part & roster) > len(roster)

    def _committed_out(self) -> set[int]:
        """The members that stopped and the last committed roster (the most advanced client's:
        there is one history) leaves out, whether or not anyone finished: members it excluded, and
        new ids whose JOIN step it committed without them (a new id whose JOIN step is still
        undecided is no member yet, and still counts)."""
        ahead = max(self.nodes.values(), key=lambda n: n.voter.agreement.through).voter.agreement
        decided = set(self.base.nodes) | {j for c in ahead.roster.changes.values() for j, _ in c.join}
        decided |= {j for j, (_, _, e) in self.sponsored.items() if ahead.through >= e}
        return {i for i, n in self.nodes.items() if n.state == "stopped" and i in decided - ahead.roster.members}

    def _who(self, h: list[tuple[int, int]]) -> int:
        return next(i for i, n in self.nodes.items() if n.applied is h)


def _bogus(v: Value, n_origins: int) -> Value:
    """A value its voter does not hold: every origin, under a digest no messages hash to."""
    return Value(v.prev, frozenset(range(n_origins)), (), v.digest ^ 0x5EED, v.evidence)


def _less_one(n: Node, v: Value, step: int) -> Value:
    """V less its lowest origin other than the liar, with the digest of the messages it holds
    of those: a value an honest client that lacked one message would propose."""
    drop = min(v.members - {n.i}, default=None)
    members = v.members - {drop}
    joins = tuple(j for j in v.joins if j[0] != drop)
    digest = step_digest(v.prev, step, n.flood.messages(step, members), joins)
    return Value(v.prev, members, joins, digest, v.evidence)


def _other_copy(m: Message) -> Message:
    """Another message under m's id (same seed, another scalar)."""
    return Message.make(m.origin, m.step, m.seed, -2.0 * m.scalar - 1.0, m.k)


# -- schedules ---------------------------------------------------------------------------------------
def single_faults(g: nx.Graph, rounds: int, restarts: bool = True) -> Iterator[list[Fault]]:
    """Every one-fault schedule in rounds 0..rounds-1: a crash of each node in each round with
    each subset of its frames delivered, a stall, each cut link, each partition (a cut of every
    link across a split), and a crash followed by a restart some rounds later."""
    nodes = sorted(g.nodes)
    splits = set()
    for k in range(1, len(nodes) // 2 + 1):
        for side in itertools.combinations(nodes, k):
            across = frozenset(edge(a, b) for a, b in g.edges if (a in side) != (b in side))
            if len(across) > 1:  # one link is a `cut` already
                splits.add(across)
    for r in range(rounds):
        for v in nodes:
            peers = sorted(g.neighbors(v))
            for k in range(len(peers) + 1):
                for reach in itertools.combinations(peers, k):
                    yield [Fault(r, "crash", v, frozenset(reach))]
            yield [Fault(r, "stall", v)]
        for a, b in sorted(g.edges):
            yield [Fault(r, "cut", edges=frozenset({edge(a, b)}))]
        for across in sorted(splits, key=sorted):
            yield [Fault(r, "cut", edges=across)]
    if restarts:
        for r in range(rounds):
            for v in nodes:
                for back in (r + 1, r + rounds // 2 + 1):
                    yield [Fault(r, "crash", v, frozenset()), Fault(back, "restart", v)]


def heals(g: nx.Graph, rounds: int, delays: Sequence[int]) -> Iterator[list[Fault]]:
    """Every schedule of a fault and its heal `d` rounds later, for each d in `delays`: each cut
    link and each partition (as `single_faults` lists them) and its heal, and each node's stall
    and its wake-up, in every round 0..rounds-1."""
    cuts = [f[0].edges for f in single_faults(g, 1, restarts=False) if f[0].kind == "cut"]
    for r in range(rounds):
        for d in delays:
            for v in sorted(g.nodes):
                yield [Fault(r, "stall", v), Fault(r + d, "heal", v)]
            for edges in cuts:
                yield [Fault(r, "cut", edges=edges), Fault(r + d, "heal", edges=edges)]


def equivocations(g: nx.Graph, rounds: int) -> Iterator[list[Fault]]:
    """Every one-equivocation schedule: each node, in each round (a copy differs only in a round
    whose frame carries the node's own messages), to each non-empty proper subset of its
    neighbours (all of them would be one consistent copy, not two)."""
    for r in range(rounds):
        for v in sorted(g.nodes):
            peers = sorted(g.neighbors(v))
            for k in range(1, len(peers)):
                for reach in itertools.combinations(peers, k):
                    yield [Fault(r, "equivocate", v, frozenset(reach))]


def lying_voters(g: nx.Graph, rounds: int) -> Iterator[list[Fault]]:
    """Every one-liar schedule of a signed world: each node, from each round on, mute, voting a
    bogus value, a two-faced bridge (`split`), or voting two values to each non-empty proper
    subset of its neighbours."""
    for r in range(rounds):
        for v in sorted(g.nodes):
            yield [Fault(r, "mute", v)]
            yield [Fault(r, "bogus", v)]
            yield [Fault(r, "split", v)]
            peers = sorted(g.neighbors(v))
            for k in range(1, len(peers)):
                for reach in itertools.combinations(peers, k):
                    yield [Fault(r, "double", v, frozenset(reach))]


def joins(g: nx.Graph, rounds: int, every: int = 1) -> Iterator[list[Fault]]:
    """A new id (the first beyond the topology's) knocking in every `every`-th round of
    0..rounds-1 (a knock is acted on at a step's start: with `every` = hops, every step start)."""
    for r in range(0, rounds, every):
        yield [Fault(r, "join", g.number_of_nodes())]


def leaves(g: nx.Graph, rounds: int, every: int = 1) -> Iterator[list[Fault]]:
    """Each node asked to leave gracefully in every `every`-th round of 0..rounds-1 (a leave
    takes effect at the leaver's next step start: with `every` = hops, every step start)."""
    for r in range(0, rounds, every):
        for v in sorted(g.nodes):
            yield [Fault(r, "leave", v)]


def pairs(g: nx.Graph, rounds: int) -> Iterator[list[Fault]]:
    """Every schedule of two faults (each from `single_faults` without restarts), the second in
    the same round as the first or later."""
    singles = list(single_faults(g, rounds, restarts=False))
    for i, a in enumerate(singles):
        for b in singles[i:]:
            if b[0].round >= a[0].round and (a[0].kind != "crash" or b[0].node != a[0].node):
                yield a + b


def sample_pairs(g: nx.Graph, rounds: int, rnd: random.Random, k: int) -> list[list[Fault]]:
    """`rnd.sample(list(pairs(g, rounds)), min(k, their number))`, the same schedules in the same
    order and `rnd` left in the same state, without making every pair (complete5 has ~10^6):
    random.sample's picks depend only on the population's length, so the indices are drawn from
    a range of that length and only the drawn pairs are made."""
    singles = list(single_faults(g, rounds, restarts=False))
    assert all(a[0].round <= b[0].round for a, b in zip(singles, singles[1:])), "singles come in round order"
    # pairs() pairs singles[i] with every singles[j], j >= i (a later round or the same), but a
    # crash with its own node's faults: per i, (len - i) less those from i on (itself included).
    counts = [0] * len(singles)
    from_i: dict[int, int] = {}  # node -> singles[i:] whose fault names that node
    for i in range(len(singles) - 1, -1, -1):
        f = singles[i][0]
        from_i[f.node] = from_i.get(f.node, 0) + 1
        counts[i] = len(singles) - i - (from_i[f.node] if f.kind == "crash" else 0)
    starts = [0, *itertools.accumulate(counts)]  # starts[i]: index of singles[i]'s first pair
    out = []
    for index in rnd.sample(range(starts[-1]), min(k, starts[-1])):
        i = bisect.bisect_right(starts, index) - 1
        a, skip = singles[i], index - starts[i]
        for b in singles[i:]:
            if a[0].kind != "crash" or b[0].node != a[0].node:
                if skip == 0:
                    out.append(a + b)
                    break
                skip -= 1
    return out


def random_schedule(g: nx.Graph, rounds: int, rnd: random.Random, faults: int) -> list[Fault]:
    """`faults` random faults (crashes with random partial sends, stalls, cuts, restarts)."""
    out: list[Fault] = []
    nodes = sorted(g.nodes)
    edges = sorted(edge(a, b) for a, b in g.edges)
    for _ in range(faults):
        r = rnd.randrange(rounds)
        kind = rnd.choice(["crash", "crash", "stall", "cut", "cut", "restart"])
        v = rnd.choice(nodes)
        if kind == "crash":
            peers = sorted(g.neighbors(v))
            out.append(Fault(r, "crash", v, frozenset(u for u in peers if rnd.random() < 0.5)))
        elif kind == "restart":
            out += [Fault(r, "crash", v, frozenset()), Fault(r + rnd.randrange(1, rounds), "restart", v)]
        elif kind == "stall":
            out.append(Fault(r, "stall", v))
        else:
            out.append(Fault(r, "cut", edges=frozenset(rnd.sample(edges, rnd.randint(1, min(3, len(edges)))))))
    return out


def left_behind(faults: list[Fault], out: Outcome) -> set[int]:
    """The clients of a healed link (or the woken one) that stopped lacking the messages of a step
    their neighbours had applied before the heal: a healed edge brings what its ends still hold,
    and an applied step's messages are no longer held (docs/churn-design.md, Healed edges, Limits)."""
    ends = {x for f in faults if f.kind == "heal" for x in (f.edges and set().union(*f.edges)) or {f.node}}
    return {i for i in ends if out.states[i] == "stopped" and "did not reach this client" in out.why[i]}


def excuse_left_behind(faults: list[Fault], out: Outcome) -> tuple[Outcome, bool]:
    """`out`, counted live where the only clients of the connected majority that did not finish
    are healed ones `left_behind` (a stated limit); and whether any client was left behind so."""
    behind = left_behind(faults, out)
    if behind and out.safe and not out.live and out.laggards <= behind:
        out = dataclasses.replace(out, live=True, problem="")
    return out, bool(behind)


@dataclass
class Report:
    schedules: int = 0
    unsafe: list[tuple[str, list[Fault], str]] = field(default_factory=list)
    stuck: list[tuple[str, list[Fault], str]] = field(default_factory=list)

    def add(self, name: str, faults: list[Fault], out: Outcome) -> None:
        self.schedules += 1
        if not out.safe:
            self.unsafe.append((name, faults, f"{out.problem}\n  again: {out.repro}"))
        elif not out.live:
            self.stuck.append((name, faults, f"{out.problem}\n  again: {out.repro}"))

    def summary(self) -> str:
        return (
            f"explored {self.schedules} schedules: {len(self.unsafe)} unsafe, "
            f"{len(self.stuck)} where a connected majority did not finish"
        )


def explore(
    cases: Iterable[tuple[str, nx.Graph, Protocol]], schedules_of: callable, report: Report | None = None
) -> Report:
    report = report or Report()
    for name, g, p in cases:
        for faults in schedules_of(g, p):
            report.add(name, faults, World(g, p, faults).run())
    return report


# -- one schedule again, from the command line ----------------------------------------------------------
def _name_of(g: nx.Graph) -> str:
    """g's name among `graphs()` and `larger_graphs()`, else its edges ("0-1,1-2")."""
    for name, h in {**graphs(8), **larger_graphs()}.items():
        if set(h.nodes) == set(g.nodes) and {edge(*e) for e in h.edges} == {edge(*e) for e in g.edges}:
            return name
    return ",".join(f"{a}-{b}" for a, b in sorted(edge(*e) for e in g.edges))


def _graph_of(name: str) -> nx.Graph:
    named = {**graphs(8), **larger_graphs()}
    if name in named:
        return named[name]
    return nx.Graph([tuple(map(int, e.split("-"))) for e in name.split(",")])


def parse_fault(text: str) -> Fault:
    """The `Fault` that `str(fault)` printed: "r7:stall 3", "r4:crash 0→[1, 2]", "r6:cut [(0, 1)]"."""
    m = re.fullmatch(r"r(\d+):(\w+)(?: (-?\d+))?(?:→(\[.*\]))?(?: (\[.*\]))?", text.strip())
    if m is None:
        raise ValueError(f"not a fault: {text!r}")
    r, kind, node, reach, edges = m.groups()
    return Fault(
        int(r),
        kind,
        int(node) if node is not None else -1,
        frozenset(int(x) for x in re.findall(r"-?\d+", reach or "")),
        frozenset(edge(int(a), int(b)) for a, b in re.findall(r"\((\d+), (\d+)\)", edges or "")),
    )


def main(argv: Sequence[str]) -> int:
    """Run one schedule and print what each client did: the command a failing test prints."""
    import argparse

    ap = argparse.ArgumentParser(prog="python tests/explorer.py", description=main.__doc__)
    ap.add_argument("graph", help="a name of graphs()/larger_graphs(), or edges: 0-1,1-2")
    ap.add_argument("faults", nargs="*", help='as printed: "r7:stall 3" "r4:crash 0→[1]" "r6:cut [(0, 1)]"')
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--hops", type=int, default=0)
    ap.add_argument("--settle", type=int, default=1)
    ap.add_argument("--max-nodes", type=int, default=0)
    ap.add_argument("--signed", action="store_true")
    ap.add_argument("--repair", action="store_true")
    a = ap.parse_intermixed_args(argv)
    g = _graph_of(a.graph)
    p = protocol_for(g, a.steps, a.hops, a.settle, a.max_nodes)
    out = World(g, p, [parse_fault(f) for f in a.faults], a.signed, a.repair).run()
    for i in sorted(out.states):
        print(f"node {i}: {out.states[i]}, applied {len(out.histories[i])} steps {out.why[i]}".rstrip())
    print(f"safe: {out.safe}, live: {out.live}, evaluator logged {len(out.log)} steps {out.problem}".rstrip())
    return 0 if out.safe and out.live else 1


if __name__ == "__main__":
    sys.path.insert(0, "src")
    sys.exit(main(sys.argv[1:]))
