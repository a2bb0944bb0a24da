"""The schedule explorer: every fault schedule of a small graph through the real agreement.

Owns a lockstep world of N clients that run the churn client's schedule with the real decision
code — `seedflood.core.churn.voter.Voter` (votes, ballots, commits, taking a committed step) over the
real `seedflood.core.flood.flooding.Flood` and `membership.Roster` — and no model: a client "applies" a
step by recording (step, digest). Faults are data (`Fault`), so a program can enumerate them.

The world, one round = one hop of every running client (the global hop index of lockstep
exchanges). A client of local step t originates its message at the first hop of t (from its
JOIN step on), runs hops up to the next round that is a multiple of `hops` (`hops` of them
unless it waited or joined mid-step: `Churn.step_hops`), then calls `Voter.after(t)` and applies
every committed step due (t − delay); a step due but not committed (or whose messages are not all here) makes it hop
on at t (no originating) until it is, at most `protocol.patience_hops` hops, then it stops with
one line, as `Churn.apply_committed` does. After the last step it drains the same way and
lingers for a vote's spread, then exits (its neighbours drop the edge).

Faults (`Fault.kind`), each at a round:
- `crash`: the node's frame of that round reaches only the neighbours in `reach`, then it is
  dead (every edge closes; its neighbours drop it).
- `stall`: the node stops answering at that round: its neighbours drop it, and when it wakes
  its edges are gone (gloo closes a timed-out pair for good), so it runs on alone.
- `cut`: the links in `edges` fail both ways (a partition is a cut of every link across it).
- `equivocate`: the node's frame of that round carries another copy (another scalar) of each of
  its own messages in it to the neighbours in `reach`, the first copy to the others: two
  messages under one id. It is the faulty one: the liveness check asks the others to finish
  without it.
- Byzantine voters (a signed world, `World(..., signed=True)`: every item carries its origin's
  signature, so a liar can lie only about what it signs itself), from that round on, about
  each vote it originates (it relays everything else unchanged, and its messages are honest):
  `double` — to the neighbours in `reach` another value signed for the same ballot (its own
  proposal less one origin, with the digest of what it holds of those: a value an honest
  client could hold), the first to the others: two signed votes in one ballot; `bogus` — to
  everyone a value it does not hold (every origin, a digest no messages hash to); `mute` — no
  vote at all; `split` — a two-faced bridge: it relays nothing (only its own messages go out)
  and tells each neighbour, for every ballot, that it voted what that neighbour voted (one
  signed vote per value it hears: as many double votes as its neighbours disagree). Each is
  faulty for the liveness check, as an equivocator is.
- `restart`: a dead node comes back as a new incarnation: its lowest live member neighbour
  sponsors it with the real catch-up rules (the decided steps, the held messages and notes, a
  JOIN note for t + delay + 1 whose edges connect (delay + 1) · hops rounds later: rounds are
  the shared hop clock), as `Churn.boundary` / `Churn.rejoin` / `Churn.link` do. A newcomer
  whose JOIN step commits without it (the note reached no voter in time) stops after applying
  that step, as `Churn.apply_committed` does (its launcher would restart it).
- `join` (a protocol with `max_nodes`, in process): brand-new id `node` (beyond the topology)
  knocks from that round on. Every running member that the real join rule (`growth.Growth`,
  over the graph and roster committed through e − lag) links it to if admitted at
  e = t + delay + 1 (t its step) sees the knock before each of its hops (`Churn._look`): it
  grows its end and expects the newcomer. The first such member (lowest id) that saw it more
  than 2·spread rounds before (`Churn._knock`: so every member connected to it has seen it too;
  in any round, waiting or not) sponsors it as a restart's sponsor does (`Churn._sponsor`): the
  catch-up, its JOIN note (incarnation 0), the newcomer's edges (the rule's) at its end. The
  newcomer's edges but its sponsor's come up by the heal negotiation, not at the note's link
  round: it asks once caught up, each member while it expects it (having seen the knock, or
  the note with e − lag committed: `Churn._grow`) and no committed step has decided the join
  (`Churn._heal_ok`). The committed step e admits it (the value's `joins`); a member that
  could not expect it grows its end when it commits e, and the edge heals then.
- `leave` (`Churn.leave`): the node originates nothing from its next step on, hops, relays and
  votes until it commits a step that leaves it out, then floods its LEAVE note naming the round
  after next, runs that one goodbye exchange and closes every edge (state `left`); each
  neighbour that got the note in the leaver's own frame closes its end before that round and
  never heals it (`Churn._goodbye`, `Churn.unlink`).
- graph repair (`World(..., repair=True)`, churn.repair): every client that commits a step
  that leaves members out grows its ends of the edges `Growth.repaired` gives (the real rule
  over the committed graph), and they heal like any grown edge (`Churn.repair`).
- `heal` (in process, `Churn.heal` over `transport.Healing`): the links in `edges` (cut earlier)
  work again, or stalled `node` wakes and its dropped edges work again. A stall that a later
  `heal` of its node wakes is a sleep: the node runs no round (sends, hears and counts nothing)
  until then; a stall without one keeps the meaning above. A link that works again is not
  connected by the fault: before every round each running client asks to heal its down edges
  to the neighbours that are members of its committed roster (as the incarnation it admitted),
  while it is an admitted member itself (`Churn._healable`), and the real negotiation
  (`memorywires.Wires.heal`: one end proposes an index `Protocol.HEAL_AHEAD` rounds ahead, the other takes
  it on its next ask) hands both ends one round to connect right before; both connect then
  (`Flood.add_peer`: each owes the other everything it holds). In a world with heals a client
  past its patience waits on, a hop a round, `Protocol.HEAL_FACTOR` × patience hops more before it stops
  with the same line, as `Churn.apply_committed` does over a healing transport (it waits so
  whether or not an edge is down then: an edge healed just before still needs hops to bring
  the votes).
  Where the model simplifies: rounds are the shared hop clock, so a woken node is back on it at
  once (the real one has no edge left and jumps its clock to the agreed index, which lands it on
  the same exchange); the heal wait is counted in hops (the real client waits `Protocol.HEAL_FACTOR` ×
  `meet_timeout_s` seconds, paced); only links a `heal` names heal (every other down link stays
  down, as over gloo: a stall without a wake-up, a newcomer's link that did not meet); an end
  that learns of an agreed heal too late connects nothing (the real one restores its end alone
  and drops it after the late bound).
  For membership changes: the first rule-linked member at a step start in id order sponsors a
  new id (the real members race to claim it); every running member sees a knock in the round
  it comes (the real ones before their next hop, which the claim's wait of 2·spread + 1
  exchanges lets every member connected to the claimant make); a member that holds a new id's
  JOIN note expects it from the round it holds it (the real one when the note arrives); a
  leaver closes its edges right after its goodbye exchange, before the round its note names,
  as its neighbours do (nothing is exchanged in between).

Checks (`Outcome`): safety — every client's applied (step, digest) list is a prefix of one
history, and so is the evaluator's log (it follows whichever client is the attach node, each
new edge opening with that client's steps from where the log stands, through the real
`stepstream.StepSequence`, which refuses two contents for one step); liveness — where the final
graph has a connected part holding a strict majority of the nodes, all of its clients finish.
With heals the final graph is the schedule's links once every heal is in (a heal whose end
closed before it could connect brings nothing back), and a client the finishing majority committed out while it was away
is not expected to finish (docs/churn-design.md, Healed edges: it stops and a restart rejoins it).
With membership changes the final graph holds every grown edge, a client that left holds none,
and a part that did not finish must hold a strict majority of the roster R_s of the first step
one of its clients could not commit (a join or a leave changes it only through a committed
step, so the quorum grows and shrinks with it).
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import networkx as nx

from seedflood.comm.memorywires import Faults as WireFaults
from seedflood.comm.memorywires import Wires
from seedflood.core.churn.agreement import Agreement, Value, Vote, step_digest
from seedflood.core.churn.voter import Voter
from seedflood.core.flood.flooding import Flood
from seedflood.core.flood.protocol import Protocol, schedule
from seedflood.core.flood.signing import Signing
from seedflood.core.flood.stepstream import StepSequence
from seedflood.core.membership.growth import Growth
from seedflood.core.membership.notes import JOIN, LEAVE, VOTE, Note, join_note, leave_note
from seedflood.core.membership.roster import ExcludedError, MembershipError, check_admitted
from seedflood.core.wire.message import FrameError, Message

Edge = tuple[int, int]


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
    i: int
    protocol: Protocol
    peers: Sequence[int]
    incarnation: int = 0
    flood: Flood = field(init=False)
    voter: Voter = field(init=False)
    t: int = 0
    hop: int = 0  # hops run in step t (>= span: waiting for a step due at t)
    span: int = 0  # hops of step t: to the next round that is a multiple of hops (`Churn.step_hops`)
    rounds: int = 0  # hops run in all
    waited: int = 0
    joined_at: int = 0
    linger: int = -1  # hops still to run after the last step was applied (-1: not draining yet)
    state: str = "run"  # run | asleep (a stall a heal wakes) | parting | left | done | stopped | dead
    why: str = ""
    applied: list[tuple[int, int]] = field(default_factory=list)  # (step, digest)
    history: list[tuple[int, list[Message]]] = field(default_factory=list)
    signed: bool = False  # every item sealed by its origin (`signing`), what is not authentic dropped
    heal_at: dict[int, int] = field(default_factory=dict)  # peer -> the round its agreed heal connects at
    heals: bool = False  # its down edges may heal (a world with heals: the in-process transport)
    excluded: bool = False  # stopped because the others committed a step without it
    heal_by: int = -1  # past its patience where edges heal: the waited count it stops at
    leaving: bool = False  # asked to leave gracefully (`Churn.leave`): originates nothing more
    grown: set[int] = field(default_factory=set)  # neighbours beyond the topology's (a join's, a repair's)
    grew_through: int = -1  # committed steps whose joins and repairs grew its edges
    unlink: dict[int, int] = field(default_factory=dict)  # leaving neighbour -> round its edge closes before
    parted: set[int] = field(default_factory=set)  # neighbours that left gracefully: never healed
    seen: dict[int, int] = field(default_factory=dict)  # a knocking new id it is linked to -> round first seen
    expected: dict[int, int] = field(default_factory=dict)  # new id it grew its end to, not admitted -> JOIN step
    noted: set[int] = field(default_factory=set)  # expected ids whose JOIN step is the note's (else the knock's)

    def __post_init__(self) -> None:
        p = self.protocol
        seal = signing(self.i) if self.signed else None
        self.flood = Flood(
            self.i, self.peers, range(p.ids), 1, None, p.step_window, tolerate_conflicts=True, signing=seal
        )
        a = Agreement(self.i, p.ids, 1, self.incarnation, roster=p.roster())
        self.voter = Voter(p, self.flood, a, lambda _: None)

    @property
    def running(self) -> bool:
        return self.state == "run"

    def begin_round(self) -> None:
        """Originate this client's message if this round is the first hop of a step it makes."""
        p = self.protocol
        if self.hop == 0:  # a step's start: its hops end on the hop clock's phase (`Churn.step_hops`)
            self.span = p.hops - self.rounds % p.hops
        if self.hop == 0 and self.joined_at <= self.t < p.steps and not self.leaving:
            seed = p.seed(self.i, self.t, 0)
            self.flood.originate([Message.make(self.i, self.t, seed, float(self.i + 1), 0)])

    def end_round(self) -> None:
        """After this round's hop: the end of a step (or of a waited hop): vote, commit, apply."""
        p = self.protocol
        self.hop += 1
        self.rounds += 1
        if self.linger >= 0:
            self.linger -= 1
            if self.linger < 0:
                self.state = "done"
            return
        if self.hop < self.span:
            return
        try:
            self.voter.after(self.t, self.rounds)
            last = self.applied[-1][0] if self.applied else -1
            due = min(self.t - p.delay, p.steps - 1)
            while last < due:
                msgs = self.voter.take(last + 1)
                if msgs is None:
                    if self.waited >= p.patience_hops and not self._may_heal():
                        raise self.voter.stuck(last + 1, self.waited)
                    self.waited += 1
                    return
                last += 1
                self.applied.append((last, self.voter.agreement.digests[last]))
                self.history.append((last, msgs))
                check_admitted(self.i, last, self.joined_at, self.voter.agreement.roster)  # as Churn does
        except MembershipError as e:
            a = self.voter.agreement
            if self.leaving and isinstance(e, ExcludedError) and self.i not in a.roster.members:
                # its leave committed (`Churn.agree`): the goodbye exchange comes next (the world)
                self.state, self.why = "parting", f"node {self.i} left at step {a.through}"
                return
            self.state, self.why, self.excluded = "stopped", str(e), isinstance(e, ExcludedError)
            return
        self.waited, self.heal_by = 0, -1
        self.t += 1
        self.hop = 0
        if last == p.steps - 1 and self.t >= p.steps:
            self.linger = (p.delay - p.vote_lag) * p.hops
            if self.linger == 0:
                self.state = "done"

    def _may_heal(self) -> bool:
        """Past its patience, where edges heal: wait `Protocol.HEAL_FACTOR` × patience hops more before
        stopping (`Churn.apply_committed`'s `heal_by`, counted in hops: the module docstring)."""
        if self.heal_by < 0 and self.heals:
            self.heal_by = self.waited + Protocol.HEAL_FACTOR * self.protocol.patience_hops
        return self.waited < self.heal_by


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


BYZANTINE = ("double", "bogus", "mute", "split")
"""Fault kinds of a lying voter (a signed world)."""
FAULTY = ("equivocate", *BYZANTINE)
"""Fault kinds whose node the liveness check leaves out (the others finish without it)."""


MEMBERSHIP = ("join", "leave")
"""Fault kinds that change the roster through a committed step (in process: edges heal there)."""


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
        self.sponsored: dict[int, tuple[int, int, int]] = {}  # new id -> (sponsor, round, JOIN step)
        self.parted_by: dict[int, set[int]] = {}  # leaver -> the neighbours its LEAVE note reached
        self.linked: list[tuple[int, Edge]] = []  # (round, link) of each rejoin or join edge that connected
        self.links: set[Edge] = {edge(a, b) for a, b in g.edges}  # working links
        self.nodes = {i: Node(i, protocol, sorted(g.neighbors(i)), signed=signed) for i in g.nodes}
        self.doubled: dict[int, int] = {}  # double voter -> first step whose vote went out two ways
        self._told: set[tuple[int, int, Note]] = set()  # split: (liar, neighbour, vote) already sent
        self.log: list[tuple[int, int]] = []
        self.seq = StepSequence(0)
        self.attach_node = -1
        self.error = ""
        self.round = 0  # the round being run: the shared hop clock
        self.lied: set[int] = set()  # equivocating nodes whose frame did carry another copy
        # links heal (in process): a heal, or a join's or a repair's edges (in process only)
        self.healing = any(f.kind in ("heal", "join") for f in self.faults) or repair
        self.membership = repair or any(f.kind in MEMBERSHIP for f in self.faults)
        self.wires = Wires({i: sorted(g.neighbors(i)) for i in g.nodes}, 1.0, WireFaults())  # heal negotiation
        self.mend: set[Edge] = set()  # links a heal brought back: they heal whenever both ends ask
        self.closed_at: dict[int, int] = {}  # node -> round its client exited or stopped
        woken = {(f.node, f.round) for f in self.faults if f.kind == "heal" and not f.edges}
        self.sleeps = {  # (node, stall round): a stall that a later heal of its node wakes
            (f.node, f.round)
            for f in self.faults
            if f.kind == "stall" and any(v == f.node and r > f.round for v, r in woken)
        }
        if self.healing:
            for n in self.nodes.values():
                n.heals = True
        for n in self.nodes.values():  # `Churn`: a ballot's quiet time follows the committed graph
            n.voter.growth = self.growth

    # -- faults ----------------------------------------------------------------------------
    def _fail(self, a: int, b: int) -> None:
        """Link a–b is gone: each live end drops the other (what the transport's take_lost does)."""
        self.links.discard(edge(a, b))
        for x, y in ((a, b), (b, a)):
            n = self.nodes.get(x)  # None: a knocking new id not sponsored yet (a member grew its end)
            if n is not None and y in n.flood.peers:
                n.flood.drop_peer(y)

    def _isolate(self, v: int) -> None:
        for u in list(self.g.neighbors(v)):
            self._fail(v, u)

    def _restart(self, v: int) -> None:
        """Bring dead node v back as a new incarnation, sponsored by its lowest running member
        neighbour (the catch-up of Churn.catch_up / Churn.rejoin, without the bytes)."""
        old = self.nodes[v]
        if old.state != "dead":
            return
        sponsors = [
            self.nodes[u]
            for u in sorted(self._adj(v))
            if u in self.nodes  # not a new id that knocks, not sponsored yet
            and self.nodes[u].running
            and u in self.nodes[u].voter.agreement.roster.members
            and self.nodes[u].linger < 0
            and not self.nodes[u].leaving
        ]
        if not sponsors or v in sponsors[0].voter.agreement.roster.members:
            if sponsors:  # its old incarnation still counts: the sponsor waits (Churn.boundary)
                self._retry.append(v)
            return
        self.wires.faults.dead.pop(v, None)
        n = self._admit(sponsors[0], v, old.incarnation + 1)
        n.heals, n.grown = old.heals, set(old.grown)

    def _admit(self, s: Node, v: int, inc: int) -> Node:
        """Sponsor `s` catches up node v (incarnation `inc`), as `Churn._sponsor` / `Churn.catch_up` /
        `Churn.rejoin` do without the bytes: every decided step, the held messages and notes (an
        earlier life's LEAVE notes dropped), its JOIN note for e = t + delay + 1 flooded by `s`,
        whose edges connect (delay + 1) · hops rounds later (`_connect_joiners`)."""
        p = self.p
        n = Node(v, p, [], incarnation=inc, signed=self.signed)
        n.voter.growth = self.growth
        n.rounds = self.round  # its hop clock starts at the sponsor's (the catch-up's hop: `Churn.rejoin`)
        self.wires.faults.incarnations[v] = inc
        a = n.voter.agreement
        for step, msgs in s.history:
            a.extend(step, msgs, s.voter.agreement.roster.changes.get(step))
            n.applied.append((step, a.prev))
        n.history = list(s.history)
        n.flood.applied_through = len(s.history) - 1
        n.voter.logged = len(s.history)
        n.grew_through = a.through
        msgs, notes = s.flood.held_items()
        n.flood.restore(msgs)
        e = s.t + p.delay + 1
        link = self.round + p.hops * (p.delay + 1)
        n.flood.originate_notes([x for x in notes if x.kind != LEAVE])
        s.flood.originate_notes([join_note(e, v, inc, link)])
        n.t, n.hop, n.joined_at = s.t, 0, e
        a.rejoins_at = e  # an earlier life's leave committed after this catch-up is not its exclusion
        self.nodes[v] = n
        self.links.add(edge(v, s.i))
        self.linked.append((self.round, edge(v, s.i)))
        n.flood.add_peer(s.i)
        s.flood.add_peer(v)
        self._joining.append((v, e, link))
        return n

    def _adj(self, i: int) -> set[int]:
        """Node i's neighbours as its own transport knows them: the topology's, and the edges a
        join or a repair grew at its end (`Churn._grow`, `Churn.repair`)."""
        own = set(self.base.neighbors(i)) if i in self.base else set()
        return own | (self.nodes[i].grown if i in self.nodes else set())

    def _grow(self, n: Node, q: int) -> None:
        """n adds its end of the edge n–q (`transport.Growing.grow`): a link of the world now, down
        until a meeting or a heal connects it."""
        if q == n.i or q in self._adj(n.i):
            return
        n.grown.add(q)
        self.g.add_edge(n.i, q)
        self.mend.add(edge(n.i, q))

    def _sponsor_newcomers(self) -> None:
        """Before this round: every running member that the join rule links a knocking new id
        to if admitted at e = t + delay + 1 (it has committed step e − lag) sees the knock
        (`Churn._look`, before every hop): it grows its end, remembers the round it first saw it
        and expects it (`expected`: the edge heals before admission). The first such member (in
        id order) that saw it more than 2·spread rounds ago claims it, at any round (`Churn._knock`:
        a member waiting for a commit claims too) and catches it up (`_admit`); the newcomer
        grows its own edges."""
        g, p = self.growth, self.p
        for j in list(self._knocking):
            looking: list[Node] = []  # the members that look this round (`Churn._look`), in id order
            for n in (self.nodes[i] for i in sorted(self.nodes)):
                if not self._looks(n, j):
                    n.seen.pop(j, None)  # `_look` keeps a first sighting only while it looks
                    continue
                looking.append(n)
                self._grow(n, j)
                n.seen.setdefault(j, self.round)
                n.voter.expect(j, n.seen[j])
                if j not in n.noted:
                    n.expected[j] = n.t + p.delay + 1
            for n in looking:
                quiet = n.voter.agreement.quiet
                if j in self._knocking and self.round - n.seen.get(j, self.round) > 2 * quiet:
                    assert g is not None
                    e = n.t + p.delay + 1
                    self._knocking.remove(j)  # the first claims it
                    new = self._admit(n, j, 0)
                    new.heals = True
                    self.sponsored[j] = (n.i, self.round, e)
                    for q in g.edges(j, e, new.voter.agreement.roster.changes):
                        self._grow(new, q)
            for n in self.nodes.values():
                if j not in self._knocking:
                    n.seen.pop(j, None)

    def _looks(self, n: Node, j: int) -> bool:
        """Whether member n looks for knocking new id j before this round (`Churn._knocking`): it
        runs its steps, is a member under its own incarnation, has committed the join rule's
        graph for e = t + delay + 1, and the rule links j to it there."""
        g, p, a = self.growth, self.p, n.voter.agreement
        if not (n.running and n.linger < 0 and n.joined_at <= n.t < p.steps) or n.leaving:
            return False
        if n.i not in a.roster.members or a.roster.incarnations.get(n.i, a.incarnation) != a.incarnation:
            return False
        e = n.t + p.delay + 1
        return g is not None and a.through >= e - g.lag and n.i in g.edges(j, e, a.roster.changes)

    def _expect_noted(self) -> None:
        """Before this round: a running member that holds a brand-new id's JOIN note, has
        committed its step e − lag and is linked to it by the rule grows its end and expects it
        (`Churn.on_notes` → `Churn._grow`, when the note arrives)."""
        g = self.growth
        if g is None:
            return
        for j, (_, _, e) in self.sponsored.items():
            for n in self.nodes.values():
                a = n.voter.agreement
                if not n.running or j == n.i or j in a.roster.members or j in n.noted or a.through < e - g.lag:
                    continue
                if any(x.origin == j for x in n.flood.notes(e, JOIN)) and n.i in g.edges(j, e, a.roster.changes):
                    self._grow(n, j)
                    n.expected[j], n.noted = e, n.noted | {j}

    def _grow_committed(self, n: Node) -> None:
        """After n's round: the edges n's newly committed steps give its end (`Churn.agree`): a
        new id each admitted (the join rule over the committed graph), and with repair the edges
        a step that leaves members out adds (`Growth.repaired`). Each heals like a down edge."""
        g, a = self.growth, n.voter.agreement
        if g is None:
            return
        for s in sorted(x for x in a.roster.changes if n.grew_through < x <= a.through):
            change = a.roster.changes[s]
            for j, _ in change.join:
                if g.new(j):
                    edges = g.edges(j, s, a.roster.changes)
                    for q in edges if n.i == j else [j] if n.i in edges else []:
                        self._grow(n, q)
            if change.leave and n.i in a.roster.members:
                for x, y in g.repaired(a.roster.changes, s):
                    if n.i in (x, y):
                        self._grow(n, y if x == n.i else x)
        n.grew_through = a.through

    def _connect_joiners(self) -> None:
        """At the round its JOIN note names, a restarted node and each neighbour connect their
        edge, where both ends' rules agree (`Churn.link`: the newcomer connects its member
        neighbours, a member connects the newcomer if it holds the note, and owes it the
        committed messages of the steps since its catch-up: `Churn._since_catch_up`), whatever
        steps they are at or wait in. A brand-new id's edges (but its sponsor's) heal instead (`_down`)."""
        for v, e, link in list(self._joining):
            if self.round < link:
                continue
            self._joining.remove((v, e, link))
            n = self.nodes[v]
            if not n.running or (self.growth is not None and self.growth.new(v)):
                continue
            for u in sorted(self._adj(v) & self.nodes.keys()):  # not a new id still knocking
                m = self.nodes[u]
                held = any(j.origin == v for j in m.flood.notes(e, JOIN))
                if (
                    m.running
                    and v in self._adj(u)
                    and u not in n.flood.peers
                    and u in n.voter.agreement.roster.members
                    and u in m.voter.agreement.roster.members
                    and held
                    and self._cut_ok(u, v)
                ):
                    self.links.add(edge(u, v))
                    self.linked.append((self.round, edge(u, v)))
                    n.flood.add_peer(u)
                    m.flood.add_peer(v)
                    # and what the newcomer may lack of steps u applied since its catch-up
                    lo = self.p.owed_from(e)
                    m.flood.owe(v, [x for step, msgs in m.history if step >= lo for x in msgs])

    def _cut_ok(self, a: int, b: int) -> bool:
        return edge(a, b) not in self._cut

    def _unlink(self) -> None:
        """Before this round: each client closes its edge to a leaving neighbour whose LEAVE note
        (in that neighbour's own frame) names this round or an earlier one (`Churn.unlink`)."""
        for n in self.nodes.values():
            for q in sorted(q for q, at in n.unlink.items() if at <= self.round):
                del n.unlink[q]
                n.parted.add(q)
                self.mend.discard(edge(n.i, q))
                if q in n.flood.peers:
                    self.links.discard(edge(n.i, q))
                    n.flood.drop_peer(q)

    # -- heals ---------------------------------------------------------------------------------
    def _down(self, n: Node) -> dict[int, int | None]:
        """`Churn._healable`: n's down edges (-> the incarnation the other end must run as) to
        the neighbours that are members of its committed roster and to the new ids it expects
        (`Node.expected`, until a committed step decides their join), while n is an admitted
        member itself; a new id caught up and not yet admitted, to its member neighbours."""
        a = n.voter.agreement
        roster = a.roster
        ok: dict[int, int | None] = {}
        if n.i not in roster.members or roster.incarnations.get(n.i, a.incarnation) != a.incarnation:
            new = self.growth is not None and self.growth.new(n.i)
            if new and a.through < n.joined_at:
                ok = {q: roster.incarnations.get(q) for q in sorted(self._adj(n.i)) if q in roster.members}
        else:
            ok = {q: roster.incarnations.get(q) for q in sorted(self._adj(n.i)) if q in roster.members}
            for j, e in list(n.expected.items()):
                if j in roster.members or any(j in dict(c.join) for c in roster.changes.values()):
                    del n.expected[j]
                elif j in n.noted and a.through >= e:
                    del n.expected[j]
                elif j in self._adj(n.i):
                    ok[j] = 0
        return {q: i for q, i in ok.items() if q not in n.flood.peers and q not in n.heal_at and q not in n.parted}

    def _heal(self) -> None:
        """Before this round's exchange: every running client asks to heal its down edges (of the
        links a heal brought back) through the real negotiation, in id order; a pair whose agreed
        round this is connects, where both ends learned it."""
        r = self.round
        running = [n for _, n in sorted(self.nodes.items()) if n.running]
        for n in running:
            want = {q: i for q, i in self._down(n).items() if edge(n.i, q) in self.mend}
            if want:
                n.heal_at.update(self.wires.heal(n.i, want, r))
        for n in running:
            for q in sorted(q for q, at in n.heal_at.items() if at <= r):
                at = n.heal_at.pop(q)
                m = self.nodes[q]
                if at == r and m.running and m.heal_at.get(n.i) == r and q not in n.flood.peers:
                    m.heal_at.pop(n.i)
                    self.links.add(edge(n.i, q))
                    n.flood.add_peer(q)
                    m.flood.add_peer(n.i)
                    self.wires.healed(n.i, q)
                    self.wires.healed(q, n.i)
                    self.healed.append((r, edge(n.i, q)))

    def _sever(self, edges: Iterable[Edge]) -> None:
        """Cut links: frames are lost both ways (the wires refuse to heal them), each end drops the other."""
        for a, b in edges:
            self._cut.add(edge(a, b))
            self.mend.discard(edge(a, b))
            self.wires.faults.cut |= {(a, b), (b, a)}
            self._fail(a, b)

    def _mend(self, f: Fault) -> None:
        """A heal fault: its links work again (a woken node's, those not cut), and may heal."""
        if f.edges:
            links = {edge(a, b) for a, b in f.edges}
        else:
            n = self.nodes[f.node]
            if n.state == "asleep":
                n.state = "run"
            links = {edge(f.node, u) for u in self.g.neighbors(f.node)} - self._cut
        for a, b in links:
            self._cut.discard(edge(a, b))
            self.wires.faults.cut -= {(a, b), (b, a)}
            self.mend.add(edge(a, b))

    # -- running -----------------------------------------------------------------------------
    def run(self, max_rounds: int | None = None) -> Outcome:
        p = self.p
        limit = max_rounds or (p.steps + p.delay + 2) * p.hops + 2 * p.patience_hops + 8 * p.hops * (p.delay + 1)
        if self.healing:  # the heal waits, after the last fault
            limit += max(f.round for f in self.faults) + 2 * Protocol.HEAL_FACTOR * p.patience_hops
        self.healed: list[tuple[int, Edge]] = []  # (round, link) of each heal that connected
        pending = sorted(self.faults, key=lambda f: f.round)  # a schedule may list them in any order
        self._cut: set[Edge] = set()
        self._joining: list[tuple[int, int, int]] = []  # (newcomer, JOIN step, link round)
        self._retry: list[int] = []  # restarts waiting for the old incarnation to leave
        self._knocking: list[int] = []  # new ids waiting for a sponsor
        crashing: dict[int, frozenset[int]] = {}
        lying: dict[int, frozenset[int]] = {}
        voting: dict[int, Fault] = {}  # lying voters, from their round on
        for r in range(limit):
            self.round = r
            if not any(
                n.running or n.state == "parting" or (n.state == "asleep" and pending) for n in self.nodes.values()
            ):
                break
            crashing.clear()
            lying.clear()
            while pending and pending[0].round <= r:
                f = pending.pop(0)
                if f.kind == "crash" and self.nodes[f.node].running:
                    crashing[f.node] = f.reach
                elif f.kind == "equivocate" and self.nodes[f.node].running:
                    lying[f.node] = f.reach
                elif f.kind in BYZANTINE:
                    voting[f.node] = f
                elif f.kind == "stall":
                    self._isolate(f.node)
                    self.mend -= {edge(f.node, u) for u in self.g.neighbors(f.node)}
                    if (f.node, f.round) in self.sleeps and self.nodes[f.node].running:
                        self.nodes[f.node].state = "asleep"
                elif f.kind == "cut":
                    self._sever(f.edges)
                elif f.kind == "heal":
                    self._mend(f)
                elif f.kind == "restart":
                    self._restart(f.node)
                elif f.kind == "join":
                    self._knocking.append(f.node)
                elif f.kind == "leave" and self.nodes[f.node].running:
                    self.nodes[f.node].leaving = True
            retry, self._retry = self._retry, []
            for v in retry:
                self._restart(v)
            self._unlink()
            self._sponsor_newcomers()
            self._expect_noted()
            self._connect_joiners()
            if self.healing:
                self._heal()
            running = [n for n in self.nodes.values() if n.running]
            parting = [n for n in self.nodes.values() if n.state == "parting"]  # its goodbye exchange
            for n in running:
                n.begin_round()
            sent = {n.i: n.flood.outbox() for n in running + parting}
            for v, reach in crashing.items():  # the last frame reaches only some neighbours
                sent[v] = {p_: items for p_, items in sent.get(v, {}).items() if p_ in reach}  # {}: it stalled too
            for v, reach in lying.items():  # another copy of its own messages to some neighbours
                for p_ in reach & set(sent[v]):
                    sent[v][p_] = [
                        _other_copy(m) if isinstance(m, Message) and m.origin == v else m for m in sent[v][p_]
                    ]
                    if any(isinstance(m, Message) and m.origin == v for m in sent[v][p_]):
                        self.lied.add(v)
            for v, f in voting.items():  # its own votes, as the fault says
                if v in sent and self.nodes[v].running:
                    sent[v] = self._lie(self.nodes[v], f, sent[v])
            for n in running + parting:
                for src, out in sent.items():
                    if n.i in out and src in n.flood.peers:
                        for item in n.flood.receive(src, out[n.i]):
                            if isinstance(item, Note) and item.kind == LEAVE and item.origin == src:
                                n.unlink[src] = item.value  # only the leaver's own frame closes its edge
                                self.parted_by.setdefault(src, set()).add(n.i)
            for n in parting:  # the goodbye went out: it closes every edge (not a failure)
                n.state = "left"
                self._isolate(n.i)
            for v in crashing:
                self.nodes[v].state = "dead"
                self.wires.faults.dead[v] = "crashed"
                self._isolate(v)
            for n in running:
                if n.running:
                    before = len(n.applied)
                    n.end_round()
                    self._push(n, before)
                    if n.state == "parting":  # `Churn._goodbye`: its LEAVE note, closing before round r + 2
                        n.flood.originate_notes([leave_note(n.voter.agreement.through, n.i, r + 2)])
                    elif n.state in ("run", "done"):
                        self._grow_committed(n)
            for n in self.nodes.values():  # a client that exited, stopped or left closes its edges
                if n.state in ("done", "stopped", "left") and n.i not in self.wires.closed:
                    self.wires.closed.add(n.i)
                    self.closed_at[n.i] = r
                if n.state in ("done", "stopped") and any(edge(n.i, u) in self.links for u in self.g.neighbors(n.i)):
                    self._isolate(n.i)
        return self._outcome()

    def _lie(self, n: Node, f: Fault, sent: dict[int, list]) -> dict[int, list]:
        """What lying voter n sends each neighbour in place of its own votes (the module docstring)."""
        p = self.p
        out: dict[int, list] = {}
        for peer, items in sent.items():
            if f.kind == "split":
                out[peer] = [m for m in items if isinstance(m, Message) and m.origin == n.i] + self._echo(n, peer)
                continue
            kept = []
            for item in items:
                if not (isinstance(item, Note) and item.kind == VOTE and item.origin == n.i):
                    kept.append(item)
                elif f.kind == "bogus":
                    kept.append(self._signed_vote(n, item, lambda v, _: _bogus(v, p.n_origins)))
                elif f.kind == "double" and peer in f.reach:
                    kept.append(self._signed_vote(n, item, lambda v, s: _less_one(n, v, s)))
                    if len(f.reach) < len(sent):
                        self.doubled.setdefault(n.i, item.step)
                elif f.kind != "mute":
                    kept.append(item)
            out[peer] = kept
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

    def _signed_vote(self, n: Node, note: Note, other: callable) -> Note:
        """Note's vote with another value (`other(value, step)`), signed anew by its origin."""
        vote = Vote.of(note, self.p.ids)
        lie = dataclasses.replace(vote, value=other(vote.value, vote.step)).note(self.p.ids)
        assert n.flood.signing is not None
        return n.flood.signing.seal(lie)

    def _push(self, n: Node, before: int) -> None:
        """The evaluator follows the attach node: a new edge opens with that client's steps from
        where the log stands, then each step it applies (stepstream.StepSequence checks them)."""
        if len(n.applied) == before or self.error:
            return
        if n.voter.agreement.roster.attach != n.i:
            return
        try:
            start = before if self.attach_node == id(n) else len(self.log)  # a new edge: catch-up first
            self.attach_node = id(n)
            for s, d in n.applied[min(start, before) :]:
                if self.seq.offer(s, d.to_bytes(8, "little")):
                    self.log.append((s, d))
        except FrameError as e:
            self.error = str(e)

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
        )

    def _final_links(self) -> Iterable[Edge]:
        """The links no fault took (a client that merely finished still counts as connected; an
        equivocating one counts as gone: the others exclude it), with every heal in, in schedule
        order (a heal brings back only a link whose ends had not closed before they could connect)."""
        if not self.healing:
            gone = set(self._cut)
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
            self.unsafe.append((name, faults, out.problem))
        elif not out.live:
            self.stuck.append((name, faults, out.problem))

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
