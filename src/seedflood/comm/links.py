"""A churn-tolerant process transport: one 2-rank gloo process group per topology edge.

Owns `EdgeTransport` (one process's hops, evaluator pushes and catch-up blobs), `register` /
`incarnation_of` (process incarnations in the store) and the store protocol by which the two ends
of an edge meet (`_link`, `build_edge`; the evaluator's side is attach.py). One of the adapters
that import torch.distributed (with runtime.py, gloo.py, attach.py and bounded.py).

Why per edge: a torch.distributed group cannot take back a member it lost, so one static world
(gloo.py) turns any crash into the end of the run. Here every edge is its own 2-rank
ProcessGroupGloo (rank 0 = the smaller node id; the evaluator is node -1), built directly on a
PrefixStore of the shared store, as torchft reconfigures its groups: a dead edge is dropped
alone, and a restarted process (same node id, new incarnation) builds fresh groups under fresh
prefixes. The store is used only to (re)connect, never on the hop path.

Store keys (under the store the caller passes):
  seedflood/inc/{node}                  latest incarnation of node (an add counter; 0 = none yet)
  seedflood/up/{node}                   node's first incarnation is up (start-up, `await_start`)
  seedflood/started                     some client started training (a later start is a rejoin)
  seedflood/hello/{src}/{dst}/{dst_inc}  "src_inc:try": src is waiting to connect to dst_inc
  seedflood/edge/{a}-{b}/{inc_a}-{inc_b}/{try_a}-{try_b}/...   gloo's rendezvous, a < b
Meeting (`_link`): each side reads the other's incarnation, greets it, and waits (re-reading the
incarnation every POLL_S, so it follows a peer that restarts meanwhile) until the other greets
its own incarnation; both then build the group under the prefix named by the two greetings and
withdraw their greeting. `try` numbers this process's attempts, so two live incarnations can
connect again after a failed attempt or a dropped edge without reusing a rendezvous prefix.
Whoever comes first waits; a running client answers greetings only in `poll()` between steps,
so a side that connects to running clients must wait at least one of their steps.

Wire: gloo.py's format and helpers (length header + frame, the tail of a long frame as a second
message), hops on gloo.TAG_HOP, pushes on gloo.TAG_EVAL, catch-up blobs on TAG_BLOB; counting as
gloo.py (HEADER + frame per peer per exchange, at the sender, at the step passed; the end marker
at `last_step`). Blobs are not hop traffic: they are counted apart, in `blob_bytes`.

Failure handling: no wait is unbounded, none waits on the store, and a failure drops one peer,
never raises. Each topology edge carries a heartbeat (`Edge`): one byte every timeout_s / 4 on
its own tag, watched with a bound of timeout_s. A peer whose socket closed fails the hop at once;
a silent one (stopped, hung) is found by the watcher within timeout_s (+ one beat period), which
closes the edge and so fails the hop waiting on it, once; a live peer that is merely late
(waiting on a silent node of its own) keeps beating and is waited for up to LATE_FACTOR ×
timeout_s, so one stall never drops live edges in a cascade (as memory.py's tolerant network);
a corrupt length fails at once. A failed peer leaves `peers`, its edge is closed (which tells the
peer at once and waits on nothing) and it is recorded in `lost`. Every gloo wait gets an
explicit bound: gloo reads a zero bound as its context timeout, so `_bound` never passes zero,
and a wait that times out closes every pair of its group (gloo's rule, used on purpose here).

Store calls: the transport's own (between steps) go through bounded.BoundedStore, so a store
whose host stopped answering costs timeout_s once and is then known gone (torch's TCPStore
client alone would block until TCP gives up); connect's link threads use plain clones and are
bounded by connect's deadline.

Assumes: one thread drives an EdgeTransport (connect's helper threads use clones of the store);
both ends of an edge use the same inline_bytes.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import math
import threading
import time
import weakref
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from seedflood.comm.bounded import BoundedStore, bounded
from seedflood.comm.framing import END, LENGTH, TAG_EVAL, TAG_HOP, HeadBuffer, device, encode, reason
from seedflood.core.transport import (
    EVALUATOR,
    HEADER,
    INLINE_BYTES,
    LATE_FACTOR,
    MAX_FRAME_BYTES,
    MAX_PENDING,
    ByteCounter,
    TransportError,
)

log = logging.getLogger(__name__)

TAG_BLOB = 0x5EED_0002  # catch-up blobs: apart from hops (TAG_HOP) and pushes (TAG_EVAL)
TAG_BEAT = 0x5EED_0003  # heartbeats
TAG_ABORT = 0x5EED_0004  # never sent: a receive on it times out, which closes an edge (Edge.close)
BEATS_PER_TIMEOUT = 4  # heartbeat period = timeout_s / 4
POLL_S = 0.02  # how often a side waiting to meet re-reads the store (s)
MIN_BUILD_S = 0.5  # the least a group build is given once both sides greeted (s)
PUSH_WAIT_S = 0.05  # at the pending bound, the most push() waits for old pushes (s)
CLOSE_WAIT_S = 2.0  # the most close() waits for the evaluator to take the last pushes (s)
STARTUP_POLL_S = 0.25  # how often a process waiting for the others to start looks (s)
STARTUP_REPORT_S = 10.0  # how often it says on screen whom it waits for (s)
_FOREVER = timedelta(days=365)  # "no bound" as an explicit gloo bound (see _bound)
_ABSENT = "\x00absent"  # compare_set's answer for a missing key (never a real value)
_TRIES = itertools.count(1)  # this process's connection attempts (unique per incarnation)


def _inc_key(node: int) -> str:
    return f"seedflood/inc/{node}"


def greeting(inc: int) -> str:
    """A new greeting 'inc:try' of this process's incarnation `inc` (tries never repeat)."""
    return f"{inc}:{next(_TRIES)}"


def hello_key(src: int, dst: int, dst_inc: int) -> str:
    return f"seedflood/hello/{src}/{dst}/{dst_inc}"


def edge_prefix(node: int, inc: int, tries: int, peer: int, peer_inc: int, peer_tries: int) -> str:
    """Store prefix of one connection attempt of edge {node, peer}, smaller node first."""
    (a, ia, ta), (b, ib, tb) = sorted([(node, inc, tries), (peer, peer_inc, peer_tries)])
    return f"seedflood/edge/{a}-{b}/{ia}-{ib}/{ta}-{tb}"


def evaluator_next_key(inc: int) -> str:
    """Where incarnation `inc` of the evaluator keeps the next step it needs (`attach.py`), so a
    catch-up blob to it can leave out what it holds."""
    return f"seedflood/evaluator/{inc}/next"


def sponsor_key(node: int, inc: int) -> str:
    """Where the neighbour that catches incarnation `inc` of `node` up writes its id."""
    return f"seedflood/sponsor/{node}/{inc}"


def register(store: dist.Store | BoundedStore, node: int) -> int:
    """Take the next incarnation of `node` (1, 2, ...) and publish it: one atomic store.add, so
    a restarted process gets a new one without asking anybody."""
    return int(store.add(_inc_key(node), 1))


def incarnation_of(store: dist.Store | BoundedStore, node: int) -> int:
    """The latest incarnation `node` registered (0 = none yet); one store read."""
    return int(store.add(_inc_key(node), 0))


def peek(store: dist.Store | BoundedStore, key: str) -> str | None:
    """The value at `key`, or None when absent, in one round trip without blocking (get waits)."""
    value = store.compare_set(key, _ABSENT, _ABSENT).decode()
    return None if value == _ABSENT else value


def names(nodes: Sequence[int], shown: int = 16) -> str:
    """'[1, 2, 3]', or the first `shown` and how many more (a screen line stays one line)."""
    nodes = list(nodes)
    head = ", ".join(map(str, nodes[:shown]))
    return f"[{head}{f', ... (+{len(nodes) - shown} more)' if len(nodes) > shown else ''}]"


def up_key(node: int) -> str:
    """Set by a client once it is up at start-up (`await_start`); nobody else writes it (an
    incarnation key may be created at 0 by any reader, so its existence says nothing)."""
    return f"seedflood/up/{node}"


STARTED_KEY = "seedflood/started"
"""Set by the first client that starts training: a client that finds it at its own start came
later than the others' start-up bound and joins as a restarted one would (by a sponsor)."""


def await_start(
    store: dist.Store | BoundedStore,
    node: int,
    nodes: Sequence[int],
    timeout_s: float,
    report_s: float = STARTUP_REPORT_S,
) -> list[int]:
    """Say that `node` is up (model loaded, store reached), then wait until every one of `nodes`
    is, at most timeout_s (transport.startup_timeout_s), saying on screen every report_s which
    ones it waits for; returns those that did not come. One store check per STARTUP_POLL_S (a
    per-node check only when it reports)."""
    store.set(up_key(node), "1")
    keys = {n: up_key(n) for n in nodes if n != node}
    start = time.monotonic()
    report = start + report_s
    while not store.check(list(keys.values())):
        now = time.monotonic()
        if now - start >= timeout_s or now >= report:
            missing = [n for n, k in keys.items() if not store.check([k])]
            if not missing:
                break
            if now - start >= timeout_s:
                return missing
            log.warning(
                "node %d: waiting for nodes %s to start (%.0f s of %g)", node, names(missing), now - start, timeout_s
            )
            report = now + report_s
        time.sleep(STARTUP_POLL_S)
    return []


def parse_greeting(greeting: str) -> tuple[int, int]:
    """'inc:try' -> (inc, try)."""
    inc, _, tries = greeting.partition(":")
    return int(inc), int(tries)


def _bound(deadline: float | None) -> timedelta:
    """A gloo wait bound for `deadline` (monotonic s; None = none): at least 1 ms, because a
    zero bound means gloo's context timeout instead."""
    if deadline is None:
        return _FOREVER
    return timedelta(milliseconds=max(1, math.ceil(1e3 * (deadline - time.monotonic()))))


def _wait(work: dist.Work, deadline: float | None) -> str | None:
    """Wait for `work` until `deadline`; None when it succeeded, else the reason, one line."""
    try:
        work.wait(_bound(deadline))
        return None
    except Exception as e:  # gloo raises RuntimeError / DistBackendError
        return reason(e)


def _who(node: int) -> str:
    return "evaluator" if node == EVALUATOR else f"node {node}"


_LIVE: weakref.WeakSet[Edge] = weakref.WeakSet()  # edges not yet closed


@atexit.register
def _close_all() -> None:
    """At exit, close every edge still open: a thread left blocked in a gloo wait at interpreter
    exit makes the process abort (SIGABRT) instead of exiting with its own status."""
    for edge in list(_LIVE):
        edge.close()


class Edge:
    """One connected edge: its 2-rank group, the peer's rank in it, a hop receive buffer, and
    (topology edges) the heartbeat: a beater thread sends one byte every `timeout_s / 4`, a
    watcher thread receives them with a bound of `timeout_s`. When the watcher's bound runs out
    (the peer is silent: stopped, hung, or its host gone without a reset), gloo closes the edge's
    pairs, which fails the hop waiting on that peer at once. So a silent peer is told apart from
    a live one that is only late (waiting on a silent node of its own), which hops wait for.

    Threads: the owner (hops, blobs, close) and the two heartbeat threads; `_lock` orders the
    beater against `close`. A Work keeps its gloo context alive, so releasing the group alone
    closes nothing while the watcher waits; `close` first forces the context's pairs shut (a
    receive on an unused tag with a 1 ms bound: gloo closes every pair of a context whose
    receive timed out), which wakes the watcher and tells the peer at once.
    """

    def __init__(self, peer: int, incarnation: int, group: dist.ProcessGroupGloo, other: int, inline: int) -> None:
        _LIVE.add(self)
        self.peer = peer
        self.incarnation = incarnation
        self.group: dist.ProcessGroupGloo | None = group
        self.other = other
        self.head = HeadBuffer(inline)
        self.outbox: list[tuple[dist.Work, torch.Tensor]] = []  # blobs in flight (work, tensor)
        self.failure: str | None = None  # why the heartbeat closed the edge, if it did
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beats: deque[tuple[dist.Work, torch.Tensor]] = deque()  # beats not yet reaped

    def heartbeat(self, timeout_s: float) -> None:
        """Start beating and watching (both ends of an edge must, with the same timeout)."""
        for name, run in (("beat", self._beat), ("watch", self._watch)):
            threading.Thread(target=run, args=(timeout_s,), name=f"seedflood-{name}-{self.peer}", daemon=True).start()

    def _beat(self, timeout_s: float) -> None:
        while not self._stop.wait(timeout_s / BEATS_PER_TIMEOUT):
            with self._lock:
                if self.group is None:
                    return
                try:
                    t = torch.zeros(1, dtype=torch.uint8)
                    self._beats.append((self.send(t, TAG_BEAT), t))
                except Exception:  # the pair is closed: the owner finds out on its next hop
                    return
                # The peer's watcher takes a beat as it arrives; one still pending after a whole
                # timeout's worth of beats means the peer stopped taking them.
                while len(self._beats) > BEATS_PER_TIMEOUT:
                    if _wait(self._beats.popleft()[0], time.monotonic()) is not None:
                        self.failure = self.failure or f"silent for over {timeout_s:g} s (no heartbeat)"
                        return

    def _watch(self, timeout_s: float) -> None:
        t = torch.zeros(1, dtype=torch.uint8)
        while True:
            try:
                self.recv(t, TAG_BEAT).wait(timedelta(seconds=timeout_s))
            except Exception as e:
                # Only our own bound running out says "silent"; anything else (a closed socket, or
                # the pairs closed by another wait's timeout or by close) the owner sees itself.
                if "Timed out" in str(e) and not self._stop.is_set():
                    self.failure = self.failure or f"silent for over {timeout_s:g} s (no heartbeat)"
                return

    def close(self) -> None:
        """Close the edge now (see the class docstring) and release the group; waits on no
        peer. The owner drops its own Works of this edge first. Idempotent."""
        with self._lock:
            group, self.group = self.group, None
            if group is None:
                return
            _LIVE.discard(self)
            self._stop.set()
            try:  # force the pairs shut: this receive can only time out
                group.recv([torch.zeros(1, dtype=torch.uint8)], self.other, TAG_ABORT).wait(timedelta(milliseconds=1))
            except Exception:
                pass
            self._beats.clear()
            self.outbox.clear()

    def send(self, t: torch.Tensor, tag: int) -> dist.Work:
        group = self.group
        if group is None:
            raise TransportError("edge closed")
        return group.send([t], self.other, tag)

    def recv(self, t: torch.Tensor, tag: int) -> dist.Work:
        group = self.group
        if group is None:
            raise TransportError("edge closed")
        return group.recv([t], self.other, tag)


def receive(edge: Edge, tag: int, head: HeadBuffer, deadline: float | None, max_bytes: int) -> bytes | None:
    """One length-prefixed message from the edge's peer (None = the end-of-stream marker).
    Raises on a failed or late receive and on a corrupt length."""
    edge.recv(head.tensor, tag).wait(_bound(deadline))
    n = head.length()
    if n == END:
        return None
    if not 0 <= n <= max_bytes:
        raise TransportError(f"corrupt length {n}")
    cut = head.tensor.numel() - HEADER
    data = head.payload(min(n, cut))
    if n > cut:  # the rest follows as one exact-size message
        tail = torch.empty(n - cut, dtype=torch.uint8)
        edge.recv(tail, tag).wait(_bound(deadline))
        data += tail.numpy().tobytes()
    return data


@dataclass
class _Attempt:
    """What one `_link` call came to: an edge, or an error; `greeting` = the peer's greeting it
    acted on (remembered so a stale greeting is answered only once)."""

    peer: int
    edge: Edge | None = None
    greeting: str | None = None
    error: str | None = None


def _link(
    store: dist.Store,
    node: int,
    inc: int,
    peer: int,
    deadline: float,
    answered: str | None,
    inline: int,
    heartbeat_s: float | None,
) -> _Attempt:
    """Meet `peer` through the store (module docstring) and build the edge's group; never raises.
    `answered`: a greeting of this peer already acted on, ignored here. `heartbeat_s`: start the
    edge's heartbeat with this timeout as soon as it is built (None: none)."""
    mine = greeting(inc)
    addressed = 0  # the peer incarnation our greeting is addressed to (0 = none yet)
    attempt = _Attempt(peer)
    try:
        while True:
            peer_inc = incarnation_of(store, peer)
            if peer_inc and peer_inc != addressed:  # greet (again, if the peer restarted)
                if addressed:
                    store.delete_key(hello_key(node, peer, addressed))
                store.set(hello_key(node, peer, peer_inc), mine)
                addressed = peer_inc
            theirs = peek(store, hello_key(peer, node, inc))
            if theirs is not None and theirs != answered and parse_greeting(theirs)[0] == peer_inc:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                attempt.error = f"{_who(peer)} did not answer within the connect timeout"
                return attempt
            time.sleep(min(POLL_S, left))
        attempt.greeting = theirs
        attempt.edge = build_edge(store, node, mine, peer, peer_inc, theirs, deadline, inline, heartbeat_s)
        return attempt
    except Exception as e:  # a store error or a failed build
        attempt.error = reason(e)
        return attempt
    finally:
        if addressed:
            try:
                store.delete_key(hello_key(node, peer, addressed))  # the peer has read it, or gave up
            except Exception:
                pass


def build_edge(
    store: dist.Store,
    node: int,
    mine: str,
    peer: int,
    peer_inc: int,
    theirs: str,
    deadline: float,
    inline: int,
    heartbeat_s: float | None,
) -> Edge:
    """Build the edge both sides greeted for (`mine` / `theirs`: the greetings 'inc:try' each
    acted on), under the prefix they name; raises if the build fails by the deadline."""
    prefix = edge_prefix(
        node, parse_greeting(mine)[0], parse_greeting(mine)[1], peer, peer_inc, parse_greeting(theirs)[1]
    )
    rank = 0 if node < peer else 1
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [device()]
    opts._threads = 1  # worker threads serve collectives only; an edge runs none
    opts._timeout = timedelta(seconds=max(deadline - time.monotonic(), MIN_BUILD_S))
    group = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, 2, opts)
    edge = Edge(peer, peer_inc, group, 1 - rank, inline)
    if heartbeat_s is not None:  # at once: the peer's watcher is already counting
        edge.heartbeat(heartbeat_s)
    return edge


class _Results:
    """The attempts of one connect() call's threads; one that ends after connect() stopped
    waiting is released by its own thread (nobody installs it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[int, _Attempt] = {}
        self._open = True

    def put(self, attempt: _Attempt) -> None:
        with self._lock:
            if self._open:
                self._done[attempt.peer] = attempt
                return
        if attempt.edge is not None:
            attempt.edge.close()

    def take(self) -> dict[int, _Attempt]:
        with self._lock:
            self._open = False
            return dict(self._done)


class EdgeTransport:
    """One node's transport over per-edge gloo groups; satisfies `transport.Transport`.

    `neighbours`: the node's topology neighbours (what `poll` may reconnect); `peers`: those
    connected now. Nothing is connected until `connect`. `attach=True` on the evaluator's attach
    node: it also keeps the evaluator edge (node -1, not a peer) for `push`. `incarnation`
    defaults to a new one from `register`. `timeout_s`: the heartbeat's silence bound (both ends
    of an edge must use the same), the default bound of blobs and of poll's connects; a hop
    waits up to LATE_FACTOR × timeout_s for a peer that beats. See the module docstring.
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
        self._inline = inline_bytes
        self._max_frame = max_frame_bytes
        self._max_pending = max_pending
        self._edges: dict[int, Edge] = {}
        self._answered: dict[int, str] = {}  # peer -> the last greeting of it acted on
        self._seen: dict[int, int] = {}  # neighbour -> newest incarnation known (see revived)
        for p in self.neighbours:  # what exists now is not a restart (connect refreshes these)
            self._seen[p] = incarnation_of(self.store, p)
        self._pending: deque[tuple[dist.Work, torch.Tensor]] = deque()  # pushes in flight
        self._store_ok = True
        self._closed = False

    def __enter__(self) -> EdgeTransport:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(abort=exc_type is not None)

    @property
    def evaluator_connected(self) -> bool:
        return EVALUATOR in self._edges

    @property
    def rejoins_possible(self) -> bool:
        """False once the store was found gone: edges still work, none can be (re)built."""
        return self._store_ok

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError(f"node {self.node}: transport is closed")

    # --- membership of the edge set ---------------------------------------------------------

    def connect(self, peers: Iterable[int], timeout_s: float) -> list[int]:
        """Connect to these neighbours (EVALUATOR too on the attach node) concurrently, each
        within timeout_s (+ MIN_BUILD_S for a build that starts at the deadline); returns those
        connected now (added to `peers`). Never raises for a peer that does not come."""
        self._check_open()
        todo = sorted(set(peers) - set(self._edges))
        if bad := [p for p in todo if p not in self.neighbours and not (p == EVALUATOR and self.attach)]:
            raise ValueError(f"node {self.node}: {bad} are not neighbours")
        if not todo or not self._store_ok:
            return []
        deadline = time.monotonic() + timeout_s
        device()  # created here, once, rather than raced for by the threads
        try:
            stores = [self.store.clone() for _ in todo]  # a Store is used by one thread at a time
        except Exception as e:
            self._store_gone(e)
            return []
        results = _Results()

        def run(peer: int, store: dist.Store, answered: str | None) -> None:
            beat = self.timeout_s  # the evaluator edge too: a silent evaluator or sender is found in timeout_s
            results.put(_link(store, self.node, self.incarnation, peer, deadline, answered, self._inline, beat))

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
                log.info("node %d: no edge to %s: %s", self.node, _who(p), attempt.error)
                continue
            self._edges[p] = attempt.edge
            self.incarnations[p] = attempt.edge.incarnation
            self.evaluator_links += p == EVALUATOR
            connected.append(p)
            log.info("node %d: connected to %s (incarnation %d)", self.node, _who(p), attempt.edge.incarnation)
        self.peers = tuple(sorted(p for p in self._edges if p != EVALUATOR))
        for p in todo:  # what `revived` compares against: a peer that did not come is not new
            if p != EVALUATOR:
                try:
                    self._seen[p] = max(self._seen.get(p, 0), incarnation_of(self.store, p))
                except Exception as e:
                    self._store_gone(e)
        return connected

    # --- rejoin (the client's sponsor handshake, docs/design.md §13) ---------------------------

    def revived(self) -> list[int]:
        """Unconnected neighbours that registered an incarnation newer than any seen (one store
        read each, between steps); each is reported once. [] once the store is gone."""
        if self._closed or not self._store_ok:
            return []
        out = []
        for p in self.neighbours:
            if p in self._edges:
                continue
            try:
                inc = incarnation_of(self.store, p)
            except Exception as e:
                self._store_gone(e)
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
            self._store_gone(e)
            return None
        return inc if won == str(self.node) else None

    def poll(self, timeout_s: float | None = None, evaluator_only: bool = False) -> list[int]:
        """Between steps: connect the neighbours (and, on the attach node, the evaluator) that
        are not connected and are waiting to connect to this incarnation (a new incarnation, or
        a live one retrying); returns them. One store read per unconnected neighbour, a second
        one only when it greets; nothing when all are connected. Each connect is bounded by
        timeout_s (default: the hop timeout). Once the store is gone: [] (logged once)."""
        if self._closed or not self._store_ok:
            return []
        missing = [] if evaluator_only else [p for p in self.neighbours if p not in self._edges]
        if self.attach and EVALUATOR not in self._edges:
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
                self._store_gone(e)
                return []
            ready.append(p)
        return self.connect(ready, self.timeout_s if timeout_s is None else timeout_s) if ready else []

    def _store_gone(self, e: BaseException) -> None:
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
        edge = self._edges.pop(peer, None)
        if edge is None:
            return
        self.incarnations.pop(peer, None)
        if peer == EVALUATOR:
            self._pending.clear()  # release the pushes' works before the group
            log.warning("node %d: evaluator dropped, pushes discarded until it reconnects: %s", self.node, reason)
        else:
            self.lost[peer] = reason
            self.peers = tuple(p for p in self.peers if p != peer)
            log.warning("node %d: lost peer node %d: %s", self.node, peer, reason)
        edge.close()

    def take_lost(self) -> dict[int, str]:
        """Peers lost since the last call (peer -> reason); clears them."""
        lost, self.lost = self.lost, {}
        return lost

    # --- hops ---------------------------------------------------------------------------------

    def exchange(self, frames: Mapping[int, bytes], step: int) -> dict[int, bytes]:
        """One hop with every connected peer (frames for anyone else are ignored); returns the
        frames of the peers that answered. A failing peer is dropped (see `drop`), never raised:
        a closed socket at once; a silent one (no heartbeat) within timeout_s (+ one beat
        period), once; a live one that is only late, waiting on a silent node of its own, is
        waited for up to LATE_FACTOR × timeout_s, so a stall never drops live edges in a cascade."""
        self._check_open()
        self.last_step = step
        deadline = time.monotonic() + LATE_FACTOR * self.timeout_s
        failed: dict[int, str] = {}  # peer -> reason (the first failure of each peer)
        edges = [self._edges[p] for p in self.peers]

        def fail(e: Edge, what: str, raw: str) -> None:
            if e.failure is not None:  # the heartbeat closed the edge: its reason is the cause
                raw = e.failure
            elif "Application timeout" in raw:  # gloo's words for "a timed-out wait closed the pairs"
                raw = f"silent for over {self.timeout_s:g} s (no heartbeat)"
            elif "Timed out" in raw:
                raw = f"{what} not done within {LATE_FACTOR * self.timeout_s:g} s though the peer beats"
            else:
                raw = f"{what} failed: {raw}"
            failed.setdefault(e.peer, raw)

        heads: dict[int, dist.Work] = {}
        for e in edges:  # post every receive and send before waiting on any
            try:
                heads[e.peer] = e.recv(e.head.tensor, TAG_HOP)
            except Exception as x:  # gloo refuses to post on a pair it already closed
                fail(e, "receive", reason(x))
        sends: list[tuple[Edge, dist.Work, torch.Tensor]] = []  # (edge, work, tensor kept alive)
        for e in edges:
            if e.peer in failed:
                continue
            frame = frames.get(e.peer, b"")
            try:
                for t in encode(frame, self._inline):
                    if t is not None:
                        sends.append((e, e.send(t, TAG_HOP), t))
            except Exception as x:
                fail(e, "send", reason(x))
                continue
            self.counter.add(step, self.node, e.peer, HEADER + len(frame))
        out: dict[int, bytes] = {}
        tails: list[tuple[Edge, dist.Work, torch.Tensor]] = []
        cut = self._inline - HEADER
        for e in edges:
            if e.peer in failed:
                continue
            if (why := _wait(heads[e.peer], deadline)) is not None:
                fail(e, "receive", why)
                continue
            n = e.head.length()
            if not 0 <= n <= self._max_frame:
                failed[e.peer] = f"corrupt length {n}"
                continue
            out[e.peer] = e.head.payload(min(n, cut))
            if n > cut:  # the rest follows as one exact-size message
                t = torch.empty(n - cut, dtype=torch.uint8)
                try:
                    tails.append((e, e.recv(t, TAG_HOP), t))
                except Exception as x:
                    fail(e, "receive", reason(x))
        for e, work, t in tails:
            if e.peer not in failed:
                if (why := _wait(work, deadline)) is not None:
                    fail(e, "receive", why)
                else:
                    out[e.peer] += t.numpy().tobytes()
        for e, work, _ in sends:
            if e.peer not in failed and (why := _wait(work, deadline)) is not None:
                fail(e, "send", why)
        for e in edges:  # blobs posted since the last hop: the peer takes them before hopping
            if e.peer not in failed and e.outbox:
                why = next(filter(None, (_wait(w, deadline) for w, _ in e.outbox)), None)
                e.outbox.clear()
                if why is not None:
                    fail(e, "blob send", why)
        heads.clear()  # no Work may outlive its group
        sends.clear()
        tails.clear()
        for p, why in failed.items():
            out.pop(p, None)
            self.drop(p, f"incarnation {self.incarnations.get(p)}: {why}")
        return out

    # --- evaluator stream ---------------------------------------------------------------------

    def push(self, frame: bytes, step: int) -> None:
        """Send a frame one way to the evaluator (attach node only), counted at `step`. Never
        waits on a slow or dead evaluator: at `max_pending` unfinished messages it waits at most
        PUSH_WAIT_S for the older half, else drops the evaluator; pushes while none is
        connected are discarded (`pushes_discarded`)."""
        self._check_open()
        if not self.attach:
            raise ValueError(f"node {self.node} is not the evaluator's attach node")
        self.last_step = step
        if len(self._pending) >= self._max_pending:
            self._reap(time.monotonic() + PUSH_WAIT_S)
        edge = self._edges.get(EVALUATOR)
        if edge is None:
            self.pushes_discarded += 1
            return
        try:
            for t in encode(frame, self._inline):
                if t is not None:
                    self._pending.append((edge.send(t, TAG_EVAL), t))
        except Exception as x:
            self.drop(EVALUATOR, f"push failed: {reason(x)}")
            self.pushes_discarded += 1
            return
        self.counter.add(step, self.node, EVALUATOR, HEADER + len(frame))

    def _reap(self, deadline: float) -> None:
        """Wait for the older half of the pending pushes until `deadline`; a push that fails or
        is not done by then drops the evaluator (its stream is then incomplete anyway)."""
        while len(self._pending) > self._max_pending // 2:
            work, _ = self._pending.popleft()
            if (why := _wait(work, deadline)) is not None:
                del work
                self.drop(EVALUATOR, f"push failed or {self._max_pending} pushes pending: {why}")
                return

    def evaluator_needs(self) -> int:
        """The first step the connected evaluator lacks, as it published it (0 if unknown)."""
        inc = self.incarnations.get(EVALUATOR)
        try:
            value = peek(self.store, evaluator_next_key(inc)) if inc else None
            return int(value) if value is not None else 0
        except ValueError:
            return 0
        except Exception as e:
            self._store_gone(e)
            return 0

    # --- catch-up blobs -----------------------------------------------------------------------

    def _edge(self, peer: int) -> Edge:
        self._check_open()
        edge = self._edges.get(peer)
        if edge is None:
            raise TransportError(f"node {self.node}: {_who(peer)} is not connected")
        return edge

    def send_blob(self, peer: int, data: bytes) -> None:
        """Hand `data` (up to max_frame_bytes) to a connected peer or the evaluator, on its own
        tag, without waiting: a sponsor's hop loop must not stall while the newcomer is still
        connecting its other edges. It completes when the peer takes it (`recv_blob`); a peer's
        blob is waited for within the deadline of the next `exchange` (a failure there drops the
        peer like any hop failure), the evaluator's like a push. Counted in `blob_bytes`, not in
        the hop counter. Raises TransportError (after dropping it) when the post itself fails."""
        if len(data) > self._max_frame:
            raise ValueError(f"blob of {len(data)} bytes exceeds {self._max_frame}")
        edge = self._edge(peer)
        queue = self._pending if peer == EVALUATOR else edge.outbox
        try:
            for t in encode(data, self._inline):
                if t is not None:
                    queue.append((edge.send(t, TAG_BLOB), t))
        except Exception as x:
            why = reason(x)
            self.drop(peer, f"incarnation {edge.incarnation}: blob send failed: {why}")
            raise TransportError(f"node {self.node}: blob to {_who(peer)} failed: {why}") from None
        self.blob_bytes[peer] += HEADER + len(data)

    def recv_blob(self, peer: int, timeout_s: float | None = None) -> bytes:
        """The next blob from a connected peer (or the evaluator), within timeout_s (default:
        the hop timeout). On failure the peer is dropped and TransportError raised."""
        edge = self._edge(peer)
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        try:
            data = receive(edge, TAG_BLOB, HeadBuffer(self._inline), deadline, self._max_frame)
            if data is None:
                raise TransportError("end-of-stream marker instead of a blob")
            return data
        except Exception as x:
            why = reason(x)
        self.drop(peer, f"incarnation {edge.incarnation}: blob receive failed: {why}")
        raise TransportError(f"node {self.node}: blob from {_who(peer)} failed: {why}")

    # --- teardown -----------------------------------------------------------------------------

    def close(self, abort: bool = False) -> None:
        """Unless aborting, end the evaluator stream (marker counted at `last_step`) and give the
        evaluator at most close_timeout_s to take it; then release every group, which waits on
        no peer. Idempotent."""
        if self._closed:
            return
        self._closed = True
        edge = self._edges.get(EVALUATOR)
        if edge is not None and not abort:
            end = torch.frombuffer(bytearray(LENGTH.pack(END)), dtype=torch.uint8)
            try:
                self._pending.append((edge.send(end, TAG_EVAL), end))
                self.counter.add(self.last_step, self.node, EVALUATOR, HEADER)
            except Exception as x:
                log.warning("node %d: end of stream not sent to the evaluator: %s", self.node, reason(x))
            deadline = time.monotonic() + self.close_timeout_s
            while self._pending:
                work, _ = self._pending.popleft()
                if (why := _wait(work, deadline)) is not None:
                    log.warning("node %d: evaluator did not take the last pushes: %s", self.node, why)
                    break
        self._pending.clear()
        for edge in self._edges.values():
            edge.close()
        self._edges.clear()
        self.incarnations.clear()
        self.peers = ()
