"""Healing a down gloo edge between two live processes: the store negotiation and the new pair.

Owns `Heals`, one node's side of `transport.Healing` over the store (edgeset.EdgeSet delegates
to it; docs/churn-design.md, Healed edges): the exchange index both ends of a down edge agree on,
and the fresh 2-rank gloo group they build for it (gloo closed the old one for good). As
memorywires.Wires.heal, it never waits on the other end: each end asks before each of its
exchanges, and the store's compare_set makes "accepted" and "withdrawn" exclusive, so both ends
connect right before one exchange index or neither does.

Store keys, per edge a < b and the incarnations (ia, ib) both ends must run as (a restart is a
new key space, so an edge never heals into a process as its old incarnation):
  seedflood/heal/{a}-{b}/{ia}-{ib}/ask/{node}  node's hop clock as it last asked (it is asking)
  seedflood/heal/{a}-{b}/{ia}-{ib}/deal        "{round}:{state}:{at}:{by}": state p (node `by`
                                               proposed index at), a (the other end accepted it)
                                               or w (`by` withdrew it)
  seedflood/edge/{a}-{b}/{ia}-{ib}/heal-{round}/...   the healed edge's gloo rendezvous
The rule, at each ask: post this end's clock; take the other end's proposal (compare_set p -> a)
only while this clock is below its index; else, once the other end asks, propose round r + 1 at
max(both clocks) + Protocol.HEAL_AHEAD by compare_set over the deal seen, which replaces (withdraws) an
open proposal that can no longer be taken (its index reached by either clock), so a withdrawal
and an acceptance exclude each other; a proposal is also withdrawn before this end's clock jumps
past it (`settle`) and once this end no longer wants the edge (`forgo`: the peer was committed
out; had the peer taken it first, this end connects at its index and closes the edge, so the
taker is not left waiting on it). Whichever end asks more often (one with no edge hops every few ms) proposes
first, so the other takes it at its next exchange. Each side starts building the round's group in
a thread as soon as it knows the deal is accepted, and installs it right before the agreed
exchange (`take`). Store traffic: a few round trips per hop per down edge, none while every edge
is up.

Assumes: one thread drives it (the builds use store clones of their own); both ends share the
store, the inline size and the heartbeat timeout; the caller turns a store error into store_gone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from seedflood.comm.bounded import BoundedStore
from seedflood.comm.edge import Edge
from seedflood.comm.framing import device, reason
from seedflood.comm.rendezvous import MIN_BUILD_S, incarnation_of, peek
from seedflood.core.flood.protocol import Protocol

log = logging.getLogger(__name__)

MAX_BACKOFF = 6
"""After k builds in a row failed with a peer (a link that carries the store's traffic but not
the edge's, as a cut between two hosts), this end asks again only Protocol.HEAL_AHEAD × 2^min(k, 6)
exchanges later: each failed build cost a hop up to the timeout."""


def heal_key(node: int, inc: int, peer: int, peer_inc: int) -> str:
    """The negotiation keys' prefix of edge {node, peer} under these incarnations, smaller id first."""
    (a, ia), (b, ib) = sorted([(node, inc), (peer, peer_inc)])
    return f"seedflood/heal/{a}-{b}/{ia}-{ib}"


def heal_prefix(node: int, inc: int, peer: int, peer_inc: int, round_: int) -> str:
    """The gloo rendezvous prefix of a healed edge (beside rendezvous.edge_prefix's meetings)."""
    (a, ia), (b, ib) = sorted([(node, inc), (peer, peer_inc)])
    return f"seedflood/edge/{a}-{b}/{ia}-{ib}/heal-{round_}"


@dataclass(frozen=True)
class Deal:
    """The value of a heal's deal key."""

    round: int
    state: str  # "p" proposed, "a" accepted, "w" withdrawn
    at: int  # the exchange index both ends connect right before
    by: int  # the node that proposed it

    def __str__(self) -> str:
        return f"{self.round}:{self.state}:{self.at}:{self.by}"

    @classmethod
    def parse(cls, value: str | bytes | None) -> Deal | None:
        if value is None:
            return None
        r, state, at, by = (value.decode() if isinstance(value, bytes) else value).split(":")
        return cls(int(r), state, int(at), int(by))

    def to(self, state: str) -> Deal:
        return Deal(self.round, state, self.at, self.by)


@dataclass
class _Open:
    """A proposal of this end not taken yet."""

    key: str
    incarnation: int | None
    deal: Deal


class _Build:
    """The new group of one agreed heal, built in a thread of its own; one the owner gave up on
    is closed by its thread once built."""

    def __init__(
        self,
        store: dist.Store,
        node: int,
        peer: int,
        peer_inc: int,
        prefix: str,
        at: int,
        timeout_s: float,
        inline: int,
    ) -> None:
        self.at = at  # the agreed exchange index
        self.edge: Edge | None = None
        self.error = "not built in time"
        self._lock = threading.Lock()
        self._abandoned = False
        rank = 0 if node < peer else 1
        args = (store, rank, peer, peer_inc, prefix, timeout_s, inline)
        self.thread = threading.Thread(target=self._run, args=args, name=f"seedflood-heal-{node}-{peer}", daemon=True)
        self.thread.start()

    def _run(
        self, store: dist.Store, rank: int, peer: int, peer_inc: int, prefix: str, timeout_s: float, inline: int
    ) -> None:
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [device()]
        opts._threads = 1  # worker threads serve collectives only; an edge runs none
        # in the background, so a long bound costs no hop: the other end learns of the deal at its
        # next ask, which a late peer of its own may hold up to the late bound
        opts._timeout = timedelta(seconds=max(Protocol.LATE_FACTOR * timeout_s, MIN_BUILD_S))
        try:
            group = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, 2, opts)
            edge = Edge(peer, peer_inc, group, 1 - rank, inline)
            edge.heartbeat(timeout_s)  # at once: the peer's watcher is already counting
        except Exception as e:
            self.error = reason(e)
            return
        with self._lock:
            if not self._abandoned:
                self.edge = edge
                return
        edge.close()

    def take(self, wait_s: float) -> Edge | str:
        """The built edge (waiting up to wait_s for the build), or why there is none."""
        self.thread.join(wait_s)
        with self._lock:
            self._abandoned = True
            edge, self.edge = self.edge, None
        return edge if edge is not None else self.error

    def abandon(self) -> None:
        if isinstance(got := self.take(0.0), Edge):
            got.close()


class Heals:
    """One node's heal negotiations and builds (see the module docstring): `ask` before each
    exchange while an edge is down, `settle` before a jump of its clock, `take` at the agreed
    index. Every method but `take` and `close` may raise a store error."""

    def __init__(self, node: int, incarnation: int, store: BoundedStore, timeout_s: float, inline: int) -> None:
        self.node = node
        self.incarnation = incarnation
        self.store = store
        self.timeout_s = timeout_s
        self.inline = inline
        self._builds: dict[int, _Build] = {}  # peer -> the agreed heal's build
        self._open: dict[int, _Open] = {}  # peer -> this end's proposal not taken yet
        self._rounds: dict[str, int] = {}  # heal_key -> the round this end proposed last
        self._failed: dict[int, int] = {}  # peer -> healed edges to it not built, in a row
        self._quiet: dict[int, int] = {}  # peer -> the exchange before which this end does not ask (backoff)

    def healable(self, peer: int, incarnation: int | None) -> bool:
        """`peer` runs as `incarnation` (None: its first life, 1 in the store): one store read."""
        return incarnation_of(self.store, peer) == (incarnation or 1)

    def ask(self, peer: int, incarnation: int | None, hop: int) -> int | None:
        """Right before exchange `hop`: the exchange index the heal of the edge to `peer` (which
        must run as `incarnation`) is agreed at, or None while it is not (never waits on the
        peer)."""
        if (b := self._builds.get(peer)) is not None:
            if hop <= b.at:
                return b.at
            del self._builds[peer]  # its moment passed without a `take`: the edge stays down
            b.abandon()
        if hop < self._quiet.get(peer, 0) or not self.healable(peer, incarnation):
            return None
        key = heal_key(self.node, self.incarnation, peer, incarnation or 1)
        deal = self._negotiate(peer, incarnation, key, hop)
        return None if deal is None else self._agreed(peer, incarnation, deal)

    def settle(self) -> dict[int, int]:
        """This node has no edge, so its clock jumps to the lowest index agreed (`edges.heal`):
        withdraw each proposal of its own at or below that index, so none is taken after the jump
        (its other end would connect at an exchange this end skipped); returns those taken first
        (peer -> index: agreed after all)."""
        if not self._builds:
            return {}
        jump = min(b.at for b in self._builds.values())
        return self._withdraw([peer for peer, o in self._open.items() if o.deal.at <= jump])

    def forgo(self, want: Mapping[int, int | None]) -> dict[int, int]:
        """Withdraw this end's open proposals to peers not in `want` (committed out since it
        proposed); returns those the peer took first (peer -> index): agreed after all, so this
        end connects and closes that edge rather than leave the taker waiting on it."""
        return self._withdraw([peer for peer in self._open if peer not in want])

    def _withdraw(self, peers: list[int]) -> dict[int, int]:
        """Withdraw this end's open proposals to `peers` (one compare_set each, so a withdrawal
        and the peer's acceptance exclude each other); returns those the peer took first (peer ->
        index), whose builds start now."""
        out = {}
        for peer in sorted(peers):
            o = self._open.pop(peer)
            got = Deal.parse(self.store.compare_set(f"{o.key}/deal", str(o.deal), str(o.deal.to("w"))))
            if got == o.deal.to("a"):
                out[peer] = self._agreed(peer, o.incarnation, got)
        return out

    def _agreed(self, peer: int, incarnation: int | None, deal: Deal) -> int:
        """Start building the agreed round's group; returns its exchange index."""
        self._open.pop(peer, None)
        inc = incarnation or 1
        prefix = heal_prefix(self.node, self.incarnation, peer, inc, deal.round)
        clone = self.store.clone()  # a Store is used by one thread at a time
        self._builds[peer] = _Build(clone, self.node, peer, inc, prefix, deal.at, self.timeout_s, self.inline)
        log.info(
            "node %d: heal of the edge to node %d agreed at hop %d (round %d)", self.node, peer, deal.at, deal.round
        )
        return deal.at

    def _negotiate(self, peer: int, incarnation: int | None, key: str, hop: int) -> Deal | None:
        """Post this clock; take the peer's proposal while it is ahead of it; else learn that the
        peer took this end's, or (re)propose ahead of both clocks when no proposal is open or the
        open one can no longer be taken (replacing it in the same compare_set, so a withdrawal and
        an acceptance exclude each other)."""
        self.store.set(f"{key}/ask/{self.node}", str(hop))
        seen = peek(self.store, f"{key}/deal")
        deal = Deal.parse(seen)
        theirs = peek(self.store, f"{key}/ask/{peer}")
        late = theirs is not None and deal is not None and int(theirs) >= deal.at  # the peer can no longer take it
        if deal is not None and deal.by == self.node and deal.round == self._rounds.get(key):
            if deal.state == "a" and hop <= deal.at:
                return deal  # the peer took it
            if deal.state == "p" and hop < deal.at and not late:
                return None  # open, still takeable
        elif deal is not None and deal.state == "p" and hop < deal.at:  # the peer's, still ahead of this clock
            taken = deal.to("a")
            return taken if Deal.parse(self.store.compare_set(f"{key}/deal", str(deal), str(taken))) == taken else None
        if theirs is not None:
            new = Deal((deal.round if deal else 0) + 1, "p", max(hop, int(theirs)) + Protocol.HEAL_AHEAD, self.node)
        elif deal is not None and deal.by == self.node and deal.state == "p":  # its index reached, nobody asking
            new = deal.to("w")
        else:
            return None
        got = Deal.parse(self.store.compare_set(f"{key}/deal", seen or "", str(new)))
        self._open.pop(peer, None)
        if got == new:
            if new.state == "p":
                self._rounds[key] = new.round
                self._open[peer] = _Open(key, incarnation, new)
            return None
        if got is not None and got.by == self.node and got.round == self._rounds.get(key):
            if got.state == "a" and hop <= got.at:
                return got  # the peer took the open proposal just before it was replaced
        return None

    def take(self, peer: int) -> Edge | str:
        """Right before the agreed exchange: the healed edge to `peer`, or why it did not come up
        (waits for the build at most the hop timeout: both ends started it when they agreed).
        After a failure this end asks again only after a backoff (MAX_BACKOFF)."""
        b = self._builds.pop(peer, None)
        if b is None:
            return "no heal agreed"
        got = b.take(self.timeout_s + MIN_BUILD_S)
        if isinstance(got, Edge):
            self._failed.pop(peer, None)
            return got
        k = self._failed[peer] = self._failed.get(peer, 0) + 1
        self._quiet[peer] = b.at + Protocol.HEAL_AHEAD * 2 ** min(k, MAX_BACKOFF)
        return got

    def close(self) -> None:
        for b in self._builds.values():
            b.abandon()
        self._builds.clear()
