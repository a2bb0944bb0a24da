"""The in-process backend of `seedflood.core.flood.transport`: threads of one process, with fault injection.

Owns `InMemoryNetwork` (one directed FIFO queue per edge, plus the evaluator's `Inbox`; the
faults; edge meetings, sponsor claims and catch-up payloads) and `Mutator` (a frame rewriter for
fault injection). One node's endpoint, `MemoryTransport`, is in memoryendpoint.py (re-exported
here); it drives the network through the public methods below.
Used by tests, the in-memory simulation and the benchmarks; it mirrors GlooTransport's
semantics and byte counting exactly (HEADER + frame, once, at the sender, at the step the
caller passes; the end marker at `last_step`), so figures from either backend agree.

Churn (`tolerate=True`, docs/churn-design.md, Failure detection): a peer failure does not raise; the endpoint drops
that peer (closing the edge both ways, as gloo closes a pair), records it in `lost`, and returns
the frames of the peers that answered. A killed peer is dropped at once; a stalled one
(`stall(node)`: its thread blocks in its next exchange until `unstall`) once it has been silent
for `timeout_s`: the network plays the per-edge heartbeat, so a peer that is merely late because
it waits on a stalled node of its own is waited for (up to LATE_FACTOR × timeout_s), never
dropped in a cascade. Edges (re)connect by a meeting, as links.EdgeTransport's do: both ends
call `connect` for each other within the timeout, else neither has the edge (an edge connected at
one end only would have that end wait on frames that never come).

Assumes: each endpoint is driven from one thread; all endpoints live in one process. Imports no
torch.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from seedflood.comm.memoryendpoint import MemoryTransport
from seedflood.core.flood.transport import LATE_FACTOR, ByteCounter, Inbox, TransportError

__all__ = ["InMemoryNetwork", "MemoryTransport", "Mutator"]


class _Failure:
    """Poison placed in a queue: the receiver raises TransportError with this reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


_SLICE_S = 0.02  # tolerant receive polls the queue in slices this long to watch the heartbeat

Mutator = Callable[[int, int, int, bytes], "bytes | None"]
"""(src, dst, hop, frame) -> frame as delivered (None: lost); hop counts the sender's exchanges
from 0; dst is EVALUATOR (-1) for pushes."""


class InMemoryNetwork:
    """Transports between threads of one process, one directed FIFO queue per edge.

    Semantics mirror gloo: sends never wait, a receive waits for the peer's frame; a closed,
    aborted or killed node poisons its out-edges, so its neighbours raise TransportError at once
    (after any frames it did send), and a silent one makes them raise after `timeout_s`.
    Use endpoints as context managers so an exception in one node thread cascades instead of
    leaving the others waiting. Fault injection: `kill(node)`, `cut(src, dst)`, `mutate`.
    """

    def __init__(
        self,
        neighbors: Mapping[int, Sequence[int]],
        timeout_s: float = 10.0,
        *,
        attach: int | None = None,
        mutate: Mutator | None = None,
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
        self.attach = attach
        self.mutate = mutate
        self.tolerate = tolerate
        self._queues: dict[tuple[int, int], queue.SimpleQueue[bytes | _Failure]] = {
            (n, p): queue.SimpleQueue() for n, ps in self.neighbors.items() for p in ps
        }
        self.inbox = Inbox(f"attach node {attach}") if attach is not None else None
        self._endpoints: dict[int, MemoryTransport] = {}
        self.dead: dict[int, str] = {}  # node -> reason it was killed
        self._cut: set[tuple[int, int]] = set()  # (src, dst) links that drop frames
        self._stalled: dict[int, float] = {}  # node -> monotonic time its stall began
        self.resumed: dict[int, threading.Event] = {}
        self.dying: dict[int, tuple[int, int]] = {}  # node -> (exchanges to go, peers it still reaches)
        self.incarnations: dict[int, int] = {}  # node -> times it was revived (its incarnation)
        self._sponsor: dict[int, int] = {}  # revived node -> the neighbour that claimed it
        self._blobs: dict[int, queue.SimpleQueue[bytes]] = {n: queue.SimpleQueue() for n in self.neighbors}
        self._offers: dict[tuple[int, int], bool] = {}  # (node, peer) -> met: a connect waiting for peer's
        self._lock = threading.Lock()
        self._met = threading.Condition(self._lock)  # a meeting happened, or a sponsor claimed

    def endpoint(self, node: int, counter: ByteCounter | None = None) -> MemoryTransport:
        if node not in self.neighbors:
            raise ValueError(f"node {node} is not in the network")
        if node in self._endpoints:
            raise ValueError(f"node {node} already has an endpoint")
        self._endpoints[node] = MemoryTransport(self, node, counter or ByteCounter())
        return self._endpoints[node]

    def evaluator_inbox(self) -> Inbox:
        """The evaluator's queue; set `on_frame` on it to hear of each push (called in push)."""
        if self.inbox is None:
            raise ValueError("network has no evaluator (pass attach=node)")
        return self.inbox

    def counter(self) -> ByteCounter:
        """All endpoints' counts merged."""
        return ByteCounter.merged([e.counter for e in self._endpoints.values()])

    def kill(self, node: int) -> None:
        """Crash `node`: its own calls and every receive from it raise from now on."""
        self.poison(node, f"node {node} was killed", inbound=True)
        self.dead[node] = f"node {node} was killed"

    def cut(self, src: int, dst: int) -> None:
        """Fail the link src -> dst: dst's next receive from src raises; later frames are lost."""
        self._cut.add((src, dst))
        self._queues[(src, dst)].put(_Failure(f"link {src} -> {dst} was cut"))

    def crash_in(self, node: int, exchanges: int, reach: int) -> None:
        """Crash `node` inside its exchange `exchanges` from now (0 = the next): its frame of that
        exchange reaches only its first `reach` peers (in id order), then it dies."""
        self.dying[node] = (exchanges, reach)

    def revive(self, node: int) -> None:
        """Restart a killed node (a new incarnation, same id): fresh edges to every neighbour,
        none connected yet (`MemoryTransport.connect`); its next `endpoint` call makes a new one."""
        with self._lock:
            if node not in self.dead:
                raise ValueError(f"node {node} is alive")
            for p in self.neighbors[node]:
                if (node, p) not in self._cut:
                    self._queues[(node, p)] = queue.SimpleQueue()
                    self._queues[(p, node)] = queue.SimpleQueue()
            del self.dead[node]
            self._endpoints.pop(node, None)
            self.incarnations[node] = self.incarnations.get(node, 0) + 1
            self._sponsor.pop(node, None)

    def held_by(self, node: int) -> list[int]:
        """Live nodes whose endpoint still exchanges with `node` (a dead node's old edges: a
        restart before they are dropped would have them wait on the new incarnation's frames,
        where between processes the old edge is closed with the old process)."""
        with self._lock:
            return [p for p, e in self._endpoints.items() if p != node and p not in self.dead and node in e.peers]

    def claim(self, sponsor: int, node: int) -> bool:
        """`sponsor` becomes the one neighbour that catches revived `node` up (first caller wins)."""
        with self._met:
            self._met.notify_all()
            return self._sponsor.setdefault(node, sponsor) == sponsor

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

    def meet(self, node: int, peers: Sequence[int], timeout_s: float) -> list[int]:
        """Connect `node` with each of `peers` that calls `meet` for `node` within `timeout_s`
        (over a live, uncut link); returns those met. A meeting gives the edge fresh queues both
        ways: both ends are inside this call then, so no frame of either is in flight."""
        deadline = time.monotonic() + timeout_s
        with self._met:
            want = [p for p in peers if (node, p) not in self._cut and (p, node) not in self._cut]
            met: set[int] = set()
            for p in want:
                if self._offers.get((p, node)) is False and p not in self.dead:
                    self._offers[(p, node)] = True
                    self._queues[(node, p)] = queue.SimpleQueue()
                    self._queues[(p, node)] = queue.SimpleQueue()
                    met.add(p)
                else:
                    self._offers[(node, p)] = False
            self._met.notify_all()
            while True:
                met |= {p for p in want if self._offers.get((node, p))}
                left = deadline - time.monotonic()
                if len(met) == len(want) or left <= 0 or node in self.dead:
                    break
                self._met.wait(left)
            for p in want:
                self._offers.pop((node, p), None)
            return sorted(met)

    def send_blob(self, dst: int, data: bytes) -> None:
        """Hand `dst` a catch-up payload (a sponsor's log and held messages)."""
        self._blobs[dst].put(bytes(data))

    def recv_blob(self, node: int, timeout_s: float) -> bytes:
        try:
            return self._blobs[node].get(timeout=timeout_s)
        except queue.Empty:
            raise TransportError(f"node {node}: no catch-up from a neighbour within {timeout_s:g} s") from None

    def stall(self, node: int) -> None:
        """Freeze `node` (SIGSTOP): its next exchange blocks until `unstall`; its heartbeat stops."""
        self.resumed[node] = threading.Event()
        self._stalled[node] = time.monotonic()

    def unstall(self, node: int) -> None:
        """Let a stalled node go on (SIGCONT); its neighbours may have dropped it meanwhile."""
        self._stalled.pop(node, None)
        if (event := self.resumed.pop(node, None)) is not None:
            event.set()

    def silent_for(self, node: int) -> float:
        """Seconds since `node`'s heartbeat stopped (0: it beats)."""
        since = self._stalled.get(node)
        return 0.0 if since is None else time.monotonic() - since

    def close_edge(self, src: int, dst: int, reason: str) -> None:
        """src gave up on dst: dst's receives from src fail from now on (a closed gloo pair)."""
        self._queues[(src, dst)].put(_Failure(reason))

    def poison(self, node: int, reason: str, inbound: bool = False, stream: bool = True) -> None:
        for p in self.neighbors[node]:
            self._queues[(node, p)].put(_Failure(reason))
            if inbound:
                self._queues[(p, node)].put(_Failure(reason))
        if stream and node == self.attach and self.inbox is not None:
            self.inbox.put(TransportError(f"evaluator: stream from attach node {node} failed: {reason}"))

    def send(self, src: int, dst: int, hop: int, frame: bytes) -> None:
        if (src, dst) in self._cut:
            return
        delivered = frame if self.mutate is None else self.mutate(src, dst, hop, frame)
        if delivered is None:  # the mutator lost it (a node dying mid-send)
            return
        self._queues[(src, dst)].put(delivered)

    def recv_tolerant(self, src: int, dst: int) -> bytes:
        """Wait for src's frame while src is alive and beating (see the module docstring)."""
        q = self._queues[(src, dst)]
        hard = time.monotonic() + LATE_FACTOR * self.timeout_s
        while True:
            try:
                item = q.get(timeout=_SLICE_S)
            except queue.Empty:
                if src in self.dead:
                    raise TransportError(f"node {src} is dead") from None
                if self.silent_for(src) > self.timeout_s:
                    raise TransportError(f"peer node {src} silent for over {self.timeout_s:g} s") from None
                if time.monotonic() > hard:
                    raise TransportError(
                        f"no frame from peer node {src} within {LATE_FACTOR * self.timeout_s:g} s"
                    ) from None
                continue
            if isinstance(item, _Failure):
                q.put(item)
                raise TransportError(item.reason)
            return item

    def recv(self, src: int, dst: int, deadline: float) -> bytes:
        try:
            item = self._queues[(src, dst)].get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TransportError(
                f"node {dst}: receive from peer node {src} failed: no frame within {self.timeout_s} s"
            ) from None
        if isinstance(item, _Failure):
            self._queues[(src, dst)].put(item)  # stays failed, like a closed gloo pair
            raise TransportError(f"node {dst}: receive from peer node {src} failed: {item.reason}")
        return item
