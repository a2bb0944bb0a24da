"""The wires of the in-process network: per-edge queues, meetings, sponsor claims and catch-up payloads.

Owns `Wires` (one directed FIFO queue per edge and the evaluator's `Inbox`; how frames are sent,
received, refused and poisoned; edge meetings; sponsor claims; catch-up payloads; brand-new ids
and the edges added for them: `add`, `link`) and `Faults`
(the state fault injection leaves behind: dead, cut, stalled and dying nodes, incarnations, the
frame mutator), which the wires read to behave as a faulty network does. Injecting a fault is
memory.InMemoryNetwork's job; an endpoint (memoryendpoint.MemoryTransport) drives the wires.

Semantics mirror gloo: sends never wait, a receive waits for the peer's frame; a poisoned queue
makes its receiver raise TransportError (after the frames before it) and stays failed, like a
closed gloo pair. A tolerant receive (churn, docs/churn-design.md, Failure detection) waits while
the sender is alive and beating: the wires play the per-edge heartbeat, so a peer that is merely
late because it waits on a stalled node of its own is waited for (up to Protocol.LATE_FACTOR × timeout_s),
never dropped in a cascade. Edges (re)connect by a meeting, as links.EdgeTransport's do: both
ends call `meet` for each other within the timeout, else neither has the edge. An edge between
two live members that went down heals by a negotiation that never blocks a hop (`heal`): both
ends ask before each of their exchanges, one proposes a hop index ahead of both clocks, the other
accepts it before it gets there, and both connect right before that exchange (docs/churn-design.md,
Healed edges).

Assumes: all endpoints live in one process. Imports no torch.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.transport import Inbox, TransportError

__all__ = ["Faults", "Mutator", "Wires"]

_SLICE_S = 0.02  # tolerant receive polls the queue in slices this long to watch the heartbeat

Mutator = Callable[[int, int, int, bytes], "bytes | None"]
"""(src, dst, hop, frame) -> frame as delivered (None: lost); hop counts the sender's exchanges
from 0; dst is EVALUATOR (-1) for pushes."""


class _Failure:
    """Poison placed in a queue: the receiver raises TransportError with this reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


@dataclasses.dataclass
class Faults:
    """What fault injection has done to the network (written by InMemoryNetwork, read here and by
    the endpoints)."""

    mutate: Mutator | None = None
    dead: dict[int, str] = dataclasses.field(default_factory=dict)  # node -> reason it was killed
    cut: set[tuple[int, int]] = dataclasses.field(default_factory=set)  # (src, dst) links that drop frames
    stalled: dict[int, float] = dataclasses.field(default_factory=dict)  # node -> monotonic time its stall began
    resumed: dict[int, threading.Event] = dataclasses.field(default_factory=dict)  # stalled node -> set on unstall
    dying: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)  # node -> (exchanges to go, reach)
    incarnations: dict[int, int] = dataclasses.field(default_factory=dict)  # node -> times it was revived

    def silent_for(self, node: int) -> float:
        """Seconds since `node`'s heartbeat stopped (0: it beats)."""
        since = self.stalled.get(node)
        return 0.0 if since is None else time.monotonic() - since

    def deliver(self, src: int, dst: int, hop: int, frame: bytes) -> bytes | None:
        """The frame as it arrives at dst (None: a cut link or the mutator lost it)."""
        if (src, dst) in self.cut:
            return None
        return frame if self.mutate is None else self.mutate(src, dst, hop, frame)

    def reach(self, node: int, peers: int) -> int:
        """How many of its `peers` (in id order) `node`'s frame of this exchange reaches: all, or
        fewer in the exchange where a scheduled crash (`dying`) strikes; counts that exchange off."""
        if (dying := self.dying.get(node)) is None:
            return peers
        if dying[0] == 0:
            return dying[1]
        self.dying[node] = (dying[0] - 1, dying[1])
        return peers


@dataclasses.dataclass
class _Heal:
    """One down edge's heal as its two ends negotiate it (`Wires.heal`)."""

    asked: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)  # end -> (incarnation, hop)
    at: int | None = None  # the proposed hop index: both ends connect right before that exchange
    by: int | None = None  # the end that proposed it
    accepted: bool = False  # the other end took it (fresh queues both ways were made then)


class Wires:
    """One directed FIFO queue per edge of a symmetric graph, plus the evaluator's inbox."""

    def __init__(
        self,
        neighbors: Mapping[int, Sequence[int]],
        timeout_s: float,
        faults: Faults,
        *,
        attach: int | None = None,
        tolerate: bool = False,
    ) -> None:
        self.neighbors = {n: tuple(sorted(set(ps))) for n, ps in neighbors.items()}
        for n, ps in self.neighbors.items():
            for p in ps:
                if p == n or n not in self.neighbors.get(p, ()):
                    raise ValueError(f"neighbours must be symmetric without self loops: {n} -> {p}")
        if attach is not None and attach not in self.neighbors:
            raise ValueError(f"attach node {attach} is not in the network")
        self.timeout_s = timeout_s
        self.faults = faults
        self.attach = attach
        self.tolerate = tolerate
        self.queues: dict[tuple[int, int], queue.SimpleQueue[bytes | _Failure]] = {
            (n, p): queue.SimpleQueue() for n, ps in self.neighbors.items() for p in ps
        }
        self.inbox = Inbox(f"attach node {attach}") if attach is not None else None
        self._sponsor: dict[int, int] = {}  # revived node -> the neighbour that claimed it
        self._blobs: dict[int, queue.SimpleQueue[bytes]] = {n: queue.SimpleQueue() for n in self.neighbors}
        self._offers: dict[tuple[int, int], bool] = {}  # (node, peer) -> met: a connect waiting for peer's
        self._heals: dict[tuple[int, int], _Heal] = {}  # (low, high) node of a down edge -> its heal
        self.closed: set[int] = set()  # nodes whose endpoint closed (finished or stopped): never heal
        self.knocking: set[int] = set()  # brand-new ids waiting for a sponsor (`add`)
        self._lock = threading.Lock()
        self._met = threading.Condition(self._lock)  # a meeting happened, or a sponsor claimed

    # -- frames ------------------------------------------------------------------------------------
    def send(self, src: int, dst: int, hop: int, frame: bytes) -> None:
        if (delivered := self.faults.deliver(src, dst, hop, frame)) is not None:
            self.queues[(src, dst)].put(delivered)

    def recv(self, src: int, dst: int, deadline: float) -> bytes:
        try:
            item = self.queues[(src, dst)].get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TransportError(
                f"node {dst}: receive from peer node {src} failed: no frame within {self.timeout_s} s"
            ) from None
        if isinstance(item, _Failure):
            self.queues[(src, dst)].put(item)  # stays failed, like a closed gloo pair
            raise TransportError(f"node {dst}: receive from peer node {src} failed: {item.reason}")
        return item

    def recv_tolerant(self, src: int, dst: int) -> bytes:
        """Wait for src's frame while src is alive and beating (see the module docstring)."""
        q = self.queues[(src, dst)]
        hard = time.monotonic() + Protocol.LATE_FACTOR * self.timeout_s
        while True:
            try:
                item = q.get(timeout=_SLICE_S)
            except queue.Empty:
                if src in self.faults.dead:
                    raise TransportError(f"node {src} is dead") from None
                if self.faults.silent_for(src) > self.timeout_s:
                    raise TransportError(f"peer node {src} silent for over {self.timeout_s:g} s") from None
                if time.monotonic() > hard:
                    raise TransportError(
                        f"no frame from peer node {src} within {Protocol.LATE_FACTOR * self.timeout_s:g} s"
                    ) from None
                continue
            if isinstance(item, _Failure):
                q.put(item)
                raise TransportError(item.reason)
            return item

    def close_edge(self, src: int, dst: int, reason: str) -> None:
        """src gave up on dst: dst's receives from src fail from now on (a closed gloo pair)."""
        self.queues[(src, dst)].put(_Failure(reason))

    def poison(self, node: int, reason: str, inbound: bool = False, stream: bool = True) -> None:
        """Fail `node`'s out-edges (and in-edges with `inbound`), and the evaluator's stream if
        `node` feeds it (with `stream`)."""
        for p in self.neighbors[node]:
            self.queues[(node, p)].put(_Failure(reason))
            if inbound:
                self.queues[(p, node)].put(_Failure(reason))
        if stream and node == self.attach and self.inbox is not None:
            self.inbox.put(TransportError(f"evaluator: stream from attach node {node} failed: {reason}"))

    def kill(self, node: int) -> None:
        """Crash `node`: its own calls and every receive from it raise from now on."""
        self.poison(node, f"node {node} was killed", inbound=True)
        self.faults.dead[node] = f"node {node} was killed"

    def renew(self, node: int) -> None:
        """Fresh queues on every uncut edge of `node` and no sponsor yet (a restart)."""
        with self._lock:
            for p in self.neighbors[node]:
                if (node, p) not in self.faults.cut:
                    self.queues[(node, p)] = queue.SimpleQueue()
                    self.queues[(p, node)] = queue.SimpleQueue()
            self._sponsor.pop(node, None)

    # -- open membership: brand-new ids ------------------------------------------------------------
    def add(self, node: int) -> None:
        """A brand-new id: no edges yet, waiting for a sponsor (`knocking`) that `claim`s it."""
        with self._met:
            if node in self.neighbors:
                raise ValueError(f"node {node} is already in the network")
            self.neighbors[node] = ()
            self._blobs[node] = queue.SimpleQueue()
            self.knocking.add(node)
            self._met.notify_all()

    def link(self, a: int, b: int) -> None:
        """Add the edge a - b to the graph (idempotent): fresh queues, not connected by anyone
        yet (its ends `meet` or heal it); a kill or restart of either end covers it from now."""
        with self._lock:
            if b in self.neighbors[a]:
                return
            for x, y in ((a, b), (b, a)):
                self.neighbors[x] = tuple(sorted((*self.neighbors[x], y)))
                self.queues[(x, y)] = queue.SimpleQueue()

    # -- meetings, claims, catch-up ----------------------------------------------------------------
    def meet(self, node: int, peers: Sequence[int], timeout_s: float) -> list[int]:
        """Connect `node` with each of `peers` that calls `meet` for `node` within `timeout_s`
        (over a live, uncut link); returns those met. A meeting gives the edge fresh queues both
        ways: both ends are inside this call then, so no frame of either is in flight."""
        deadline = time.monotonic() + timeout_s
        cut, dead = self.faults.cut, self.faults.dead
        with self._met:
            want = [p for p in peers if (node, p) not in cut and (p, node) not in cut]
            met: set[int] = set()
            for p in want:
                if self._offers.get((p, node)) is False and p not in dead:
                    self._offers[(p, node)] = True
                    self.queues[(node, p)] = queue.SimpleQueue()
                    self.queues[(p, node)] = queue.SimpleQueue()
                    met.add(p)
                else:
                    self._offers[(node, p)] = False
            self._met.notify_all()
            while True:
                met |= {p for p in want if self._offers.get((node, p))}
                left = deadline - time.monotonic()
                if len(met) == len(want) or left <= 0 or node in dead:
                    break
                self._met.wait(left)
            for p in want:
                self._offers.pop((node, p), None)
            return sorted(met)

    def claim(self, sponsor: int, node: int) -> bool:
        """`sponsor` becomes the one neighbour that catches revived `node` up (first caller wins;
        never across a cut link: a sponsor the newcomer cannot reach would end its life)."""
        with self._met:
            self._met.notify_all()
            if self.is_cut(sponsor, node):
                return False
            if self._sponsor.setdefault(node, sponsor) != sponsor:
                return False
            self.knocking.discard(node)
            return True

    def is_cut(self, a: int, b: int) -> bool:
        return (a, b) in self.faults.cut or (b, a) in self.faults.cut

    # -- healing a down edge -----------------------------------------------------------------------
    def healable(self, node: int, peer: int, incarnation: int | None) -> bool:
        """`peer` runs as `incarnation` (None: its first life) and may still heal an edge (alive,
        not closed). A cut is not known to the ends of a real link, so it does not count here."""
        inc = self.faults.incarnations.get(peer, 0)
        return peer not in self.faults.dead and peer not in self.closed and inc == (incarnation or 0)

    def heal(self, node: int, want: Mapping[int, int | None], hop: int) -> dict[int, int]:
        """`node`, right before its exchange number `hop`, asks to heal its down edges to `want`
        (peer -> the incarnation it must run as, None: its first). Returns peer -> the hop index
        at which both ends connect, for every heal both ends have agreed (the acceptor learns it
        when it accepts, the proposer on its next ask, which comes at the latest right before
        that exchange). Never waits. One proposes an index `Protocol.HEAL_AHEAD` past both clocks; the
        other accepts it only while its clock is below it, and fresh queues are made then, before
        either end has sent on them; a proposer that reaches its index unaccepted withdraws it,
        and so does one that no longer wants the edge (its peer was committed out), unless the
        peer took it first: then that index is returned all the same, for the proposer to connect
        and close the edge (the taker is not left waiting on an end that never comes). So both
        ends connect at one exchange index or neither does, whatever the timing."""
        out: dict[int, int] = {}
        mine = self.faults.incarnations.get(node, 0)
        with self._lock:
            for peer, incarnation in sorted(want.items()):
                key = (min(node, peer), max(node, peer))
                if self.is_cut(node, peer) or node in self.faults.dead or not self.healable(node, peer, incarnation):
                    self._heals.pop(key, None)
                    continue
                h = self._heals.setdefault(key, _Heal())
                lives = ((node, mine), (peer, self.faults.incarnations.get(peer, 0)))
                if any(h.asked.get(x, (i, 0))[0] != i for x, i in lives) or (h.at is not None and hop > h.at):
                    h = self._heals[key] = _Heal()  # another life asked, or that heal's moment passed
                theirs = h.asked.get(peer)
                h.asked[node] = (mine, hop)
                if h.at is not None:
                    if h.accepted:
                        out[peer] = h.at
                        continue
                    if h.by != node and hop < h.at:  # the peer proposed: take it
                        h.accepted = True
                        self.queues[(node, peer)] = queue.SimpleQueue()
                        self.queues[(peer, node)] = queue.SimpleQueue()
                        out[peer] = h.at
                        continue
                    if hop < h.at:
                        continue  # this end's proposal, not taken yet
                    h.at = h.by = None  # not taken in time (or too late to take): withdrawn
                if theirs is not None:  # both ask: propose an index ahead of both clocks
                    h.at, h.by = max(hop, theirs[1]) + Protocol.HEAL_AHEAD, node
            for key, h in list(self._heals.items()):  # proposals to peers no longer wanted
                peer = key[0] if key[1] == node else key[1]
                if node in key and h.by == node and h.at is not None and peer not in want:
                    if h.accepted:
                        if node in h.asked:  # not yet connected at this end (`healed`)
                            out[peer] = h.at
                    else:
                        h.at = h.by = None  # withdrawn: the peer can no longer take it
        return out

    def agreed(self, node: int, peer: int) -> int | None:
        """The exchange index both ends of the edge node - peer agreed to connect at (None: no
        heal of it is agreed)."""
        with self._lock:
            h = self._heals.get((min(node, peer), max(node, peer)))
            return h.at if h is not None and h.accepted else None

    def healed(self, node: int, peer: int) -> None:
        """`node` connected its end of a healed edge; the heal is done once both have."""
        key = (min(node, peer), max(node, peer))
        with self._lock:
            if (h := self._heals.get(key)) is not None and h.accepted:
                h.asked.pop(node, None)
                if peer not in h.asked:
                    del self._heals[key]

    def sponsor_of(self, node: int, timeout_s: float) -> int:
        """The neighbour that claimed revived `node`, waiting up to `timeout_s` for one (as a
        restarted process waits for the store's sponsor key)."""
        deadline = time.monotonic() + timeout_s
        with self._met:
            while (sponsor := self._sponsor.get(node)) is None:
                if (left := deadline - time.monotonic()) <= 0:
                    raise TransportError(f"node {node}: no neighbour sponsored the rejoin within {timeout_s:g} s")
                self._met.wait(left)
            return sponsor

    def send_blob(self, dst: int, data: bytes) -> None:
        """Hand `dst` a catch-up payload (a sponsor's log and held messages)."""
        self._blobs[dst].put(bytes(data))

    def recv_blob(self, node: int, timeout_s: float) -> bytes:
        try:
            return self._blobs[node].get(timeout=timeout_s)
        except queue.Empty:
            raise TransportError(f"node {node}: no catch-up from a neighbour within {timeout_s:g} s") from None
