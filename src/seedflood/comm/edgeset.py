"""Which edges one node has and how the set changes: connect, reconnect, sponsor claims, drops.

Owns `EdgeSet`, the base of links.EdgeTransport: its state (the connected edges, their
incarnations, lost peers, the pushes in flight) and every change to the edge set: `connect`
(concurrent meetings, one thread per peer, rendezvous.link), `poll` (between steps: answer
neighbours and the evaluator waiting to connect), `revived` / `claim` / `sponsor` (a restarted
neighbour and the sponsor handshake, docs/churn-design.md, Rejoin across processes), `grow` /
`newcomers` / `knock` (a `transport.Growing`: graph repair's edges, and brand-new ids that knock
through the store for a sponsor, docs/churn-design.md, A new id joins), `healable` /
`heal` / `restore` (a `transport.Healing`: a down edge between live processes comes back at an
exchange index both ends agreed on, healing.Heals; docs/churn-design.md, Healed edges), `drop`
and `take_lost`. What travels over the edges (hops, pushes, blobs, close) is links.py's.

Store calls: the set's own (between steps) go through bounded.BoundedStore, so a store whose host
stopped answering costs timeout_s once and is then known gone (`store_gone`: edges still work,
none can be (re)built; torch's TCPStore client alone would block until TCP gives up); connect's
link threads use plain clones and are bounded by connect's deadline.

Assumes: one thread drives it (connect's helper threads use clones of the store).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from seedflood.comm.bounded import BoundedStore, bounded
from seedflood.comm.edge import Edge, who
from seedflood.comm.framing import device, reason
from seedflood.comm.healing import Heals
from seedflood.comm.rendezvous import (
    MIN_BUILD_S,
    Attempt,
    Knocks,
    hello_key,
    incarnation_of,
    knock,
    link,
    parse_greeting,
    peek,
    register,
    sponsor_key,
)
from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.transport import (
    EVALUATOR,
    HEADER,
    INLINE_BYTES,
    MAX_FRAME_BYTES,
    MAX_PENDING,
    ByteCounter,
    TransportError,
)

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 2.0  # the most close() waits for the evaluator to take the last pushes (s)


class _Results:
    """The attempts of one connect() call's threads; one that ends after connect() stopped
    waiting is released by its own thread (nobody installs it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[int, Attempt] = {}
        self._open = True

    def put(self, attempt: Attempt) -> None:
        with self._lock:
            if self._open:
                self._done[attempt.peer] = attempt
                return
        if attempt.edge is not None:
            attempt.edge.close()

    def take(self) -> dict[int, Attempt]:
        with self._lock:
            self._open = False
            return dict(self._done)


class EdgeSet:
    """One node's edges over per-edge gloo groups (links.EdgeTransport adds the traffic).

    `neighbours`: the node's topology neighbours and those `grow` added (what `poll` may
    reconnect and `heal` may bring up); `peers`: those
    connected now. Nothing is connected until `connect`. `attach=True` on the evaluator's attach
    node: it also keeps the evaluator edge (node -1, not a peer) for `push`. `incarnation`
    defaults to a new one from `register`. `timeout_s`: the heartbeat's silence bound (both ends
    of an edge must use the same), the default bound of blobs and of poll's connects; a hop
    waits up to Protocol.LATE_FACTOR × timeout_s for a peer that beats. `joinable`: the brand-new ids
    that may knock (churn.max_nodes: topology.nodes..max_nodes-1; `newcomers`), none by default.
    See the module docstring.
    """

    def __init__(
        self,
        node: int,
        neighbours: Sequence[int],
        store: dist.Store | BoundedStore,
        *,
        incarnation: int | None = None,
        counter: ByteCounter | None = None,
        attach: bool = False,
        timeout_s: float = 30.0,
        close_timeout_s: float = CLOSE_WAIT_S,
        inline_bytes: int = INLINE_BYTES,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        max_pending: int = MAX_PENDING,
        joinable: Sequence[int] = (),
    ) -> None:
        if node < 0 or node in neighbours or EVALUATOR in neighbours:
            raise ValueError(f"node {node}: bad node id or neighbours {sorted(neighbours)}")
        if inline_bytes <= HEADER or max_pending < 2 or timeout_s <= 0:
            raise ValueError("need inline_bytes > HEADER, max_pending >= 2 and timeout_s > 0")
        self.node = node
        self.neighbours = tuple(sorted(set(neighbours)))
        self.store = bounded(store, timeout_s)  # between steps too: a silent store costs timeout_s once
        self.incarnation = incarnation if incarnation is not None else register(self.store, node)
        self.rejoining = self.incarnation > 1
        """This process joins a run already under way (a restart, or a start later than the
        others' start-up bound): a sponsor connects it, not `connect` at start-up."""
        self.counter = counter if counter is not None else ByteCounter()
        self.attach = attach
        self.timeout_s = timeout_s
        self.close_timeout_s = close_timeout_s
        self.peers: tuple[int, ...] = ()
        self.incarnations: dict[int, int] = {}  # connected peer (or EVALUATOR) -> its incarnation
        self.lost: dict[int, str] = {}  # peer -> why it was dropped; see take_lost
        self.last_step = 0  # step of the latest exchange/push: the end marker is counted there
        self.blob_bytes: dict[int, int] = defaultdict(int)  # peer -> blob bytes sent (HEADER + blob)
        self.pushes_discarded = 0  # pushes while no evaluator was connected
        self.evaluator_links = 0  # evaluator edges built so far: each opens with a catch-up blob
        self.inline = inline_bytes
        self.max_frame = max_frame_bytes
        self.max_pending = max_pending
        self.edges: dict[int, Edge] = {}
        self._answered: dict[int, str] = {}  # peer -> the last greeting of it acted on
        self._seen: dict[int, int] = {}  # neighbour -> newest incarnation known (see revived)
        for p in self.neighbours:  # what exists now is not a restart (connect refreshes these)
            self._seen[p] = incarnation_of(self.store, p)
        self.in_flight: deque[tuple[dist.Work, torch.Tensor]] = deque()  # pushes in flight
        self.heals = Heals(node, self.incarnation, self.store, timeout_s, inline_bytes)
        self.joinable = joinable  # a range, usually: `in` is O(1)
        self._knocks = Knocks(Protocol.LATE_FACTOR * timeout_s)  # the most a newcomer waits for its sponsor
        self._knocked: dict[int, int] = {}  # new id -> newest incarnation of it seen knocking
        self._knocking: dict[int, tuple[int, float]] = {}  # new id -> (incarnation, first seen) unclaimed
        self._store_ok = True
        self.closed = False

    @property
    def evaluator_connected(self) -> bool:
        return EVALUATOR in self.edges

    @property
    def rejoins_possible(self) -> bool:
        """False once the store was found gone: edges still work, none can be (re)built."""
        return self._store_ok

    def check_open(self) -> None:
        if self.closed:
            raise TransportError(f"node {self.node}: transport is closed")

    # --- membership of the edge set ---------------------------------------------------------

    def connect(self, peers: Iterable[int], timeout_s: float | None = None) -> list[int]:
        """Connect to these neighbours (EVALUATOR too on the attach node) concurrently, each
        within timeout_s (None: the hop timeout; + MIN_BUILD_S for a build that starts at the
        deadline); returns those connected now (added to `peers`). Never raises for a peer that
        does not come."""
        self.check_open()
        todo = sorted(set(peers) - set(self.edges))
        if bad := [p for p in todo if p not in self.neighbours and not (p == EVALUATOR and self.attach)]:
            raise ValueError(f"node {self.node}: {bad} are not neighbours")
        if not todo or not self._store_ok:
            return []
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        device()  # created here, once, rather than raced for by the threads
        try:
            stores = [self.store.clone() for _ in todo]  # a Store is used by one thread at a time
        except Exception as e:
            self.store_gone(e)
            return []
        results = _Results()

        def run(peer: int, store: dist.Store, answered: str | None) -> None:
            beat = self.timeout_s  # the evaluator edge too: a silent evaluator or sender is found in timeout_s
            results.put(link(store, self.node, self.incarnation, peer, deadline, answered, self.inline, beat))

        threads = [
            threading.Thread(
                target=run, args=(p, s, self._answered.get(p)), name=f"seedflood-link-{self.node}-{p}", daemon=True
            )
            for p, s in zip(todo, stores)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, deadline + MIN_BUILD_S + 1.0 - time.monotonic()))
        connected = []
        for p, attempt in sorted(results.take().items()):
            if attempt.greeting is not None:
                self._answered[p] = attempt.greeting
            if attempt.edge is None:
                log.info("node %d: no edge to %s: %s", self.node, who(p), attempt.error)
                continue
            self.edges[p] = attempt.edge
            self.incarnations[p] = attempt.edge.incarnation
            self.evaluator_links += p == EVALUATOR
            connected.append(p)
            log.info("node %d: connected to %s (incarnation %d)", self.node, who(p), attempt.edge.incarnation)
        self.peers = tuple(sorted(p for p in self.edges if p != EVALUATOR))
        for p in todo:  # what `revived` compares against: a peer that did not come is not new
            if p != EVALUATOR:
                try:
                    self._seen[p] = max(self._seen.get(p, 0), incarnation_of(self.store, p))
                except Exception as e:
                    self.store_gone(e)
        return connected

    # --- rejoin (the client's sponsor handshake, docs/churn-design.md, Rejoin across processes) ---

    def revived(self) -> list[int]:
        """Unconnected neighbours that registered an incarnation newer than any seen (one store
        read each, between steps); each is reported once. [] once the store is gone."""
        if self.closed or not self._store_ok:
            return []
        out = []
        for p in self.neighbours:
            if p in self.edges:
                continue
            try:
                inc = incarnation_of(self.store, p)
            except Exception as e:
                self.store_gone(e)
                return []
            if inc > self._seen.get(p, 0):
                self._seen[p] = inc
                out.append(p)
        return out

    def claim(self, peer: int) -> int | None:
        """Become the sponsor of `peer`'s newest incarnation (the first neighbour to ask wins,
        by compare_set on `seedflood/sponsor/{peer}/{inc}`); returns that incarnation, or None."""
        try:
            inc = incarnation_of(self.store, peer)
            won = self.store.compare_set(sponsor_key(peer, inc), "", str(self.node)).decode()
        except Exception as e:
            self.store_gone(e)
            return None
        return inc if won == str(self.node) else None

    def sponsor(self, timeout_s: float) -> int:
        """A restarted process (`rejoining`): the neighbour that claimed this incarnation (the
        store key `claim` sets), waiting up to timeout_s; TransportError when none did, or the
        store is gone."""
        key = sponsor_key(self.node, self.incarnation)
        deadline = time.monotonic() + timeout_s
        try:
            # a wait may wake before the key is set (torch's store wakes the waiters of a key that
            # a compare_set found missing): wait again until it is there, within the bound
            while not self.store.check([key]):
                self.store.wait([key], timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            sponsor = int(self.store.get(key))
        except Exception as e:  # the store's timeout, or the store is gone
            raise TransportError(
                f"node {self.node}: no neighbour sponsored the rejoin within {timeout_s:g} s "
                f"({str(e).splitlines()[0]}); if the whole run was relaunched, give it a fresh store "
                "(this one remembers the earlier launch)"
            ) from None
        self.grow([sponsor])  # a brand-new id's first neighbour (the join rule links it there)
        return sponsor

    # --- growing the graph (a `transport.Growing`: graph repair and new ids, docs/churn-design.md) --

    def knock(self) -> None:
        """This process is a brand-new node id (docs/churn-design.md, A new id joins): publish
        this incarnation for the members' `newcomers`; the sponsor connects it (`rejoining`)."""
        knock(self.store, self.node, self.incarnation)
        self.rejoining = True

    def newcomers(self) -> list[int]:
        """Brand-new ids (of `joinable`) that knocked and wait for a sponsor: not claimed yet,
        knocking for less than Protocol.LATE_FACTOR × timeout_s (the most a newcomer waits for its
        sponsor), and not a later life of a neighbour (that restart is `revived`'s). The life a
        neighbour had when `grow` made it one stays listed: a member the join rule links a
        newcomer to grows its end at once and claims it only some exchanges later
        (roles/churn.py `_knock`), so it must go on seeing that knock until the claim. One store
        read per call (the knock counter: members look before every exchange), one more per new
        knock (`rendezvous.Knocks`), and one per unclaimed knock (its sponsor key). [] once the
        store is gone."""
        if not self.joinable or self.closed or not self._store_ok:
            return []
        now = time.monotonic()
        try:
            for j, inc in self._knocks.read(self.store):
                if j != self.node and j in self.joinable and inc > self._knocked.get(j, 0):
                    self._knocked[j] = inc
                    self._knocking[j] = (inc, now)
            for j, (inc, since) in sorted(self._knocking.items()):
                late = now - since > Protocol.LATE_FACTOR * self.timeout_s
                # `check`, not `peek`: a compare_set on a missing key wakes the newcomer's wait
                restart = j in self.neighbours and inc > self._seen.get(j, 0)
                if late or restart or self.store.check([sponsor_key(j, inc)]):
                    del self._knocking[j]
        except Exception as e:
            self.store_gone(e)
            return []
        return sorted(self._knocking)

    def grow(self, peers: Sequence[int]) -> None:
        """Make `peers` neighbours of this node, not connected: a heal brings each edge up (as a
        topology edge that went down). The incarnation each runs as now counts as seen, so
        `revived` reports only a restart after this (one store read each)."""
        for p in peers:
            if p == self.node or p == EVALUATOR or p in self.neighbours:
                continue
            self.neighbours = tuple(sorted((*self.neighbours, p)))
            if self._store_ok:
                try:
                    self._seen[p] = max(self._seen.get(p, 0), incarnation_of(self.store, p))
                except Exception as e:
                    self.store_gone(e)

    # --- healing a down edge (docs/churn-design.md, Healed edges) ------------------------------

    def healable(self, peer: int, incarnation: int | None) -> bool:
        """`peer` runs as `incarnation` (None: its first life) in the store, which is up."""
        if self.closed or not self._store_ok:
            return False
        try:
            return self.heals.healable(peer, incarnation)
        except Exception as e:
            self.store_gone(e)
            return False

    def heal(self, want: Mapping[int, int | None], hop: int) -> dict[int, int]:
        """Right before exchange `hop`, never waiting on a peer: ask to heal the down edges to
        `want` (peer -> the incarnation it must run as); returns peer -> the exchange index both
        ends agreed to connect at, for each heal agreed so far. A few store round trips per
        down edge (healing.Heals); {} once the store is gone."""
        self.check_open()
        out: dict[int, int] = {}
        for peer, incarnation in sorted(want.items()):
            if not self._store_ok:
                break
            if peer in self.edges or peer not in self.neighbours:
                continue
            try:
                at = self.heals.ask(peer, incarnation, hop)
            except Exception as e:
                self.store_gone(e)
                break
            if at is not None:
                out[peer] = at
        if self._store_ok:
            try:
                out.update(self.heals.forgo(want))
            except Exception as e:
                self.store_gone(e)
        if not self.peers and self._store_ok:  # alone: the client's clock jumps to the lowest agreed index
            try:
                out.update(self.heals.settle())
            except Exception as e:
                self.store_gone(e)
        return out

    def restore(self, peer: int) -> None:
        """Connect a healed edge right before the agreed exchange: it exchanges from now. A
        build that failed (the other end did not come) records the peer in `lost` instead."""
        if peer in self.edges:
            return
        got = self.heals.take(peer)
        if isinstance(got, str):
            self.lost[peer] = f"healed edge not built: {got}"
            log.warning("node %d: healed edge to node %d not built: %s", self.node, peer, got)
            return
        self.edges[peer] = got
        self.incarnations[peer] = got.incarnation
        self.peers = tuple(sorted((*self.peers, peer)))
        self.lost.pop(peer, None)
        log.info("node %d: healed edge to node %d (incarnation %d) connected", self.node, peer, got.incarnation)

    def poll(self, timeout_s: float | None = None, evaluator_only: bool = False) -> list[int]:
        """Between steps: connect the neighbours (and, on the attach node, the evaluator) that
        are not connected and are waiting to connect to this incarnation (a new incarnation, or
        a live one retrying); returns them. One store read per unconnected neighbour, a second
        one only when it greets; nothing when all are connected. Each connect is bounded by
        timeout_s (default: the hop timeout). Once the store is gone: [] (logged once)."""
        if self.closed or not self._store_ok:
            return []
        missing = [] if evaluator_only else [p for p in self.neighbours if p not in self.edges]
        if self.attach and EVALUATOR not in self.edges:
            missing.append(EVALUATOR)
        ready = []
        for p in missing:
            try:
                theirs = peek(self.store, hello_key(p, self.node, self.incarnation))
                if theirs is None or theirs == self._answered.get(p):
                    continue
                if parse_greeting(theirs)[0] != incarnation_of(self.store, p):  # left by a dead incarnation
                    self._answered[p] = theirs
                    continue
            except ValueError:  # not 'inc:try': nobody of ours wrote it
                continue
            except Exception as e:
                self.store_gone(e)
                return []
            ready.append(p)
        return self.connect(ready, self.timeout_s if timeout_s is None else timeout_s) if ready else []

    def store_gone(self, e: BaseException) -> None:
        if self._store_ok:
            self._store_ok = False
            log.warning(
                "node %d: rendezvous store unreachable (%s): training goes on with peers %s, "
                "but no edge can be rebuilt any more",
                self.node,
                reason(e),
                list(self.peers),
            )

    def drop(self, peer: int, reason: str) -> None:
        """Remove a peer (or the evaluator) now: its group is released without waiting on it; a
        peer is recorded in `lost`. No-op when not connected."""
        edge = self.edges.pop(peer, None)
        if edge is None:
            return
        self.incarnations.pop(peer, None)
        if peer == EVALUATOR:
            self.in_flight.clear()  # release the pushes' works before the group
            log.warning("node %d: evaluator dropped, pushes discarded until it reconnects: %s", self.node, reason)
        else:
            self.lost[peer] = reason
            self.peers = tuple(p for p in self.peers if p != peer)
            log.warning("node %d: lost peer node %d: %s", self.node, peer, reason)
        edge.close()

    def part(self, peer: int) -> None:
        """Close the edge to a neighbour both ends agreed to close before this exchange (a
        graceful leave, docs/churn-design.md): released like `drop`, but not lost. No-op when
        not connected."""
        edge = self.edges.pop(peer, None) if peer != EVALUATOR else None
        if edge is None:
            return
        self.incarnations.pop(peer, None)
        self.peers = tuple(p for p in self.peers if p != peer)
        log.info("node %d: parted from node %d (a graceful leave)", self.node, peer)
        edge.close()

    def take_lost(self) -> dict[int, str]:
        """Peers lost since the last call (peer -> reason); clears them."""
        lost, self.lost = self.lost, {}
        return lost
