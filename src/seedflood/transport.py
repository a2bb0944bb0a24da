"""Moving opaque frames between topology neighbours, and one-way to the evaluator.

Owns:
- `Transport`: the interface the flood runs on. One `exchange` is one synchronous hop: a frame
  (bytes, possibly empty) goes to every neighbour and one comes back from every neighbour.
  `push` sends a frame one way to the evaluator (only on its attach node) without slowing hops.
- `ByteCounter`: every byte handed to the backend, per directed edge and per step. These are the
  communication figures we publish, so both transports count the same thing the same way:
  `HEADER` (8-byte length) + the frame, once, at the sender.
- `GlooTransport` / `EvaluatorInbox`: torch.distributed point-to-point over gloo on CPU uint8
  tensors (the frames are tiny, so even a GPU run keeps them on the CPU).
- `InMemoryNetwork`: the same interface between threads of one process, for tests and fault
  injection (killed nodes, cut links, frame mutators).

Wire format (gloo), per frame: one message `[int64 LE length][payload[:inline_bytes - 8]]`,
received into a preallocated `inline_bytes` buffer (gloo accepts a message shorter than the
posted buffer; it rejects a longer one), then, only for frames longer than that, one message
with the rest, whose exact size the receiver now knows. A hop therefore costs one message per
edge and direction in the usual case. Length -1 on the evaluator channel means end of stream.
Both ends of a channel must use the same inline_bytes (the default unless a test changes it).

Assumes: the caller set up the default process group (runtime.process_group) and every process
runs the same number of hops; a transport is used from one thread. Frame contents are none of
this module's business (message.py validates them).
"""

from __future__ import annotations

import logging
import queue
import re
import struct
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

EVALUATOR = -1
"""Node id of the evaluator in byte counts (it is rank 0, not a topology node)."""
HEADER = 8
"""Bytes of the int64 length that precedes every frame on the wire (counted)."""
INLINE_BYTES = 64 * 1024
"""Receive buffer per peer: frames up to INLINE_BYTES - HEADER travel in one message."""
MAX_FRAME_BYTES = 1 << 30
"""A length header above this is treated as a corrupt stream."""
MAX_PENDING = 1024
"""Unfinished push messages to the evaluator before `push` waits for the oldest (back-pressure)."""

# Gloo tags. monitored_barrier uses small counting tags in the same point-to-point namespace,
# so ours sit far away from 0, 1, 2, ...
TAG_HOP = 0x5EED_0000
TAG_EVAL = 0x5EED_0001
_END = -1  # length header of the end-of-stream marker


class TransportError(RuntimeError):
    """A peer failed (crashed, closed, timed out or sent a corrupt stream); names node and rank."""


@runtime_checkable
class Transport(Protocol):
    node: int
    peers: tuple[int, ...]
    """Neighbour node ids, sorted."""
    counter: ByteCounter

    def exchange(self, frames: Mapping[int, bytes]) -> dict[int, bytes]:
        """One hop: send frames[p] (b"" if absent) to every peer p; return every peer's frame."""
        ...

    def push(self, frame: bytes) -> None:
        """Send a frame one way to the evaluator (attach node only); never waits for a hop."""
        ...

    def close(self, abort: bool = False) -> None:
        """Finish: end the evaluator stream (unless abort) and release resources."""
        ...


# --- byte accounting ----------------------------------------------------------------------------


class ByteCounter:
    """Bytes handed to the backend, keyed by (step, src node, dst node); dst -1 = evaluator.

    The caller sets `counter.step = t` before the hops of step t. Each process counts what it
    sends, so one counter holds one node's out-edges; `merged` adds counters of many nodes.
    Thread-safe for `add`; `step` belongs to the one thread that drives the transport.
    """

    def __init__(self) -> None:
        self.step = 0
        self._bytes: dict[tuple[int, int, int], int] = defaultdict(int)
        self._lock = threading.Lock()

    def add(self, src: int, dst: int, nbytes: int) -> None:
        with self._lock:
            self._bytes[(self.step, src, dst)] += nbytes

    def rows(self) -> list[tuple[int, int, int, int]]:
        """(step, src, dst, bytes), sorted: the raw table, JSON-friendly."""
        with self._lock:
            return sorted((s, a, b, n) for (s, a, b), n in self._bytes.items())

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[int]]) -> ByteCounter:
        c = cls()
        for s, a, b, n in rows:
            c._bytes[(int(s), int(a), int(b))] += int(n)
        return c

    @classmethod
    def merged(cls, counters: Sequence[ByteCounter]) -> ByteCounter:
        return cls.from_rows([r for c in counters for r in c.rows()])

    def total(self) -> int:
        return sum(n for *_, n in self.rows())

    def per_edge_total(self) -> dict[tuple[int, int], int]:
        out: dict[tuple[int, int], int] = defaultdict(int)
        for _, a, b, n in self.rows():
            out[(a, b)] += n
        return dict(out)

    def per_step_total(self, include_evaluator: bool = True) -> dict[int, int]:
        out: dict[int, int] = defaultdict(int)
        for s, _, b, n in self.rows():
            if include_evaluator or b != EVALUATOR:
                out[s] += n
        return dict(out)

    def mean_bytes_per_edge_per_step(self, include_evaluator: bool = False) -> float:
        """Total bytes / (directed edges seen × steps seen); the evaluator edge is left out by
        default because it is not part of the topology."""
        rows = [r for r in self.rows() if include_evaluator or r[2] != EVALUATOR]
        edges = {(a, b) for _, a, b, _ in rows}
        steps = {s for s, *_ in rows}
        return sum(r[3] for r in rows) / (len(edges) * len(steps)) if rows else 0.0


# --- evaluator inbox (shared by both transports) -----------------------------------------------


class _EndOfStream:
    pass


_EOS = _EndOfStream()


class Inbox:
    """Frames pushed to the evaluator, in order. `get` returns None once the sender ended its
    stream (close without abort), raises TransportError if the sender failed, TimeoutError if
    nothing came within `timeout` seconds. Iterating yields frames until the end of stream."""

    def __init__(self, sender: str) -> None:
        self.sender = sender
        self._queue: queue.SimpleQueue[bytes | _EndOfStream | TransportError] = queue.SimpleQueue()
        self._final: _EndOfStream | TransportError | None = None

    def _put(self, item: bytes | _EndOfStream | TransportError) -> None:
        self._queue.put(item)

    def get(self, timeout: float | None = None) -> bytes | None:
        if isinstance(self._final, TransportError):
            raise self._final
        if self._final is not None:
            return None
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no frame from {self.sender} within {timeout} s") from None
        if isinstance(item, bytes):
            return item
        self._final = item
        return self.get()

    def __iter__(self) -> Iterator[bytes]:
        while (frame := self.get()) is not None:
            yield frame

    def close(self) -> None:
        pass


# --- gloo ---------------------------------------------------------------------------------------


def _encode(frame: bytes, inline_bytes: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """frame -> (head message, tail message or None) as CPU uint8 tensors owning a copy."""
    cut = inline_bytes - HEADER
    head = bytearray(struct.pack("<q", len(frame))) + frame[:cut]
    tail = bytearray(frame[cut:]) if len(frame) > cut else None
    return (
        torch.frombuffer(head, dtype=torch.uint8),
        torch.frombuffer(tail, dtype=torch.uint8) if tail is not None else None,
    )


def _check_addressed(node: int, peers: Sequence[int], frames: Mapping[int, bytes]) -> None:
    """A hop sends only to neighbours: anything else is a caller bug."""
    if unknown := set(frames) - set(peers):
        raise ValueError(f"node {node}: frames for non-neighbours {sorted(unknown)}")


def _reason(e: BaseException) -> str:
    """First sentence of a gloo error, without its '[file.cc:123] ' prefix."""
    lines = str(e).strip().splitlines()
    text = re.sub(r"^\[[^\]]*\]\s*", "", lines[0]) if lines else ""
    return text.split(". ")[0] or type(e).__name__


def _require_group() -> None:
    if not dist.is_initialized():
        raise TransportError("no process group: create transports inside runtime.process_group")


class _HeadBuffer:
    """One preallocated receive buffer (inline_bytes) and its decoding."""

    def __init__(self, inline_bytes: int) -> None:
        self.tensor = torch.empty(inline_bytes, dtype=torch.uint8)
        self._np = self.tensor.numpy()

    def length(self) -> int:
        return int(self._np[:HEADER].view("<i8")[0])

    def payload(self, n: int) -> bytes:
        return self._np[HEADER : HEADER + n].tobytes()


class GlooTransport:
    """Frames over torch.distributed (gloo) point-to-point; see the module docstring for the wire.

    A hop posts every receive and send before waiting on any of them, so no pair can deadlock.
    A peer failure raises TransportError naming the peer; a dead peer (closed socket) is noticed
    at once, a silent one after the process-group timeout (gloo then closes that pair for good).
    After an error the transport is unusable.

    push(): isend, keep the work handle, reap finished ones on later calls; beyond `max_pending`
    unfinished pushes (the evaluator far behind) push waits for the oldest: bounded memory,
    back-pressure instead of loss. The evaluator's receiver thread drains continuously, so
    in practice this never blocks a hop.
    """

    def __init__(
        self,
        node: int,
        peers: Sequence[int],
        rank_of: Callable[[int], int] | Mapping[int, int] = lambda n: n + 1,
        counter: ByteCounter | None = None,
        evaluator_rank: int | None = None,
        *,
        inline_bytes: int = INLINE_BYTES,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        max_pending: int = MAX_PENDING,
    ) -> None:
        if node in peers:
            raise ValueError(f"node {node} lists itself as a peer")
        if inline_bytes <= HEADER or max_pending < 1:
            raise ValueError("inline_bytes must exceed the header and max_pending must be >= 1")
        _require_group()
        lookup = rank_of.__getitem__ if isinstance(rank_of, Mapping) else rank_of
        self.node = node
        self.peers = tuple(sorted(set(peers)))
        self.counter = counter if counter is not None else ByteCounter()
        self.evaluator_rank = evaluator_rank
        self._rank = {p: lookup(p) for p in self.peers}  # node -> rank; EVALUATOR -> its rank
        if evaluator_rank is not None:
            self._rank[EVALUATOR] = evaluator_rank
        self._inline = inline_bytes
        self._max_frame = max_frame_bytes
        self._max_pending = max_pending
        self._heads = {p: _HeadBuffer(inline_bytes) for p in self.peers}
        self._pending: deque[tuple[dist.Work, torch.Tensor]] = deque()  # pushes in flight
        self._broken: TransportError | None = None
        self._closed = False
        log.debug("node %d: gloo transport to %s", node, {p: self._rank[p] for p in self.peers})

    def __enter__(self) -> GlooTransport:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(abort=exc_type is not None)

    def _fail(self, peer: int, what: str, e: BaseException | None = None) -> TransportError:
        who = "evaluator" if peer == EVALUATOR else f"peer node {peer}"
        self._broken = TransportError(
            f"node {self.node}: {what} {who} (rank {self._rank[peer]}) failed"
            + (f": {_reason(e)}" if e is not None else "")
        )
        return self._broken

    def _post(self, op: Callable[..., dist.Work], t: torch.Tensor, peer: int, tag: int) -> dist.Work:
        """isend/irecv; posting raises at once when gloo already closed the pair."""
        try:
            return op(t, self._rank[peer], tag=tag)
        except Exception as e:
            raise self._fail(peer, "send to" if op is dist.isend else "receive from", e) from e

    def _wait(self, work: dist.Work, peer: int, what: str) -> None:
        try:
            work.wait()
        except Exception as e:  # gloo raises RuntimeError / DistBackendError
            raise self._fail(peer, what, e) from e

    def _check(self) -> None:
        if self._broken is not None:
            raise self._broken
        if self._closed:
            raise TransportError(f"node {self.node}: transport is closed")

    def exchange(self, frames: Mapping[int, bytes]) -> dict[int, bytes]:
        self._check()
        _check_addressed(self.node, self.peers, frames)
        self._reap()
        # Post everything first: heads in, then heads (+ tails) out.
        recvs = {p: self._post(dist.irecv, self._heads[p].tensor, p, TAG_HOP) for p in self.peers}
        sends: list[tuple[int, dist.Work, torch.Tensor]] = []  # (peer, work, tensor kept alive)
        for p in self.peers:
            frame = frames.get(p, b"")
            self.counter.add(self.node, p, HEADER + len(frame))
            for t in _encode(frame, self._inline):
                if t is not None:
                    sends.append((p, self._post(dist.isend, t, p, TAG_HOP), t))
        out: dict[int, bytes] = {}
        tails: list[tuple[int, dist.Work, torch.Tensor]] = []
        for p, work in recvs.items():
            self._wait(work, p, "receive from")
            n = self._heads[p].length()
            if not 0 <= n <= self._max_frame:
                raise self._fail(p, f"corrupt length {n} from")
            out[p] = self._heads[p].payload(min(n, self._inline - HEADER))
            if n > self._inline - HEADER:  # the rest follows as one exact-size message
                t = torch.empty(n - (self._inline - HEADER), dtype=torch.uint8)
                tails.append((p, self._post(dist.irecv, t, p, TAG_HOP), t))
        for p, work, t in tails:
            self._wait(work, p, "receive from")
            out[p] += t.numpy().tobytes()
        for p, work, _ in sends:
            self._wait(work, p, "send to")
        return out

    def push(self, frame: bytes) -> None:
        self._check()
        if self.evaluator_rank is None:
            raise ValueError(f"node {self.node} is not the evaluator's attach node")
        self._reap()
        while len(self._pending) >= self._max_pending:  # back-pressure: wait for the oldest
            self._wait(self._pending.popleft()[0], EVALUATOR, "push to")
        self.counter.add(self.node, EVALUATOR, HEADER + len(frame))
        for t in _encode(frame, self._inline):
            if t is not None:
                self._pending.append((self._post(dist.isend, t, EVALUATOR, TAG_EVAL), t))

    def _reap(self) -> None:
        """Drop finished pushes (raising if one failed)."""
        while self._pending and self._pending[0][0].is_completed():
            self._wait(self._pending.popleft()[0], EVALUATOR, "push to")

    def close(self, abort: bool = False) -> None:
        """Unless aborting: send the end-of-stream marker and wait until the evaluator has taken
        every push (bounded by the process-group timeout). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if abort or self._broken is not None or self.evaluator_rank is None:
            self._pending.clear()
            return
        self.counter.add(self.node, EVALUATOR, HEADER)
        end = torch.frombuffer(bytearray(struct.pack("<q", _END)), dtype=torch.uint8)
        self._pending.append((self._post(dist.isend, end, EVALUATOR, TAG_EVAL), end))
        while self._pending:
            self._wait(self._pending.popleft()[0], EVALUATOR, "push to")


class EvaluatorInbox(Inbox):
    """Rank 0's side of the push channel: a daemon thread receives from the attach node's rank
    into a queue. A blocked receive cannot be cancelled; the thread ends with the stream, with a
    failure of the sender, or with the process (destroying the process group under it is safe)."""

    def __init__(
        self,
        src_rank: int,
        src_node: int | None = None,
        *,
        inline_bytes: int = INLINE_BYTES,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        name = f"attach node {src_node} (rank {src_rank})" if src_node is not None else f"rank {src_rank}"
        super().__init__(name)
        _require_group()
        self.src_rank = src_rank
        self._inline = inline_bytes
        self._max_frame = max_frame_bytes
        self._thread = threading.Thread(target=self._run, name="seedflood-inbox", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        head = _HeadBuffer(self._inline)
        try:
            while True:
                dist.recv(head.tensor, self.src_rank, tag=TAG_EVAL)
                n = head.length()
                if n == _END:
                    self._put(_EOS)
                    return
                if not 0 <= n <= self._max_frame:
                    raise ValueError(f"corrupt length {n}")
                frame = head.payload(min(n, self._inline - HEADER))
                if n > self._inline - HEADER:
                    tail = torch.empty(n - (self._inline - HEADER), dtype=torch.uint8)
                    dist.recv(tail, self.src_rank, tag=TAG_EVAL)
                    frame += tail.numpy().tobytes()
                self._put(frame)
        except Exception as e:
            self._put(TransportError(f"evaluator: stream from {self.sender} failed: {_reason(e)}"))

    def close(self) -> None:
        self._thread.join(timeout=0.1)
        if self._thread.is_alive():
            log.debug("evaluator inbox: receiver still waiting on %s; left to the process", self.sender)


# --- in memory ----------------------------------------------------------------------------------


class _Failure:
    """Poison placed in a queue: the receiver raises TransportError with this reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


Mutator = Callable[[int, int, int, bytes], bytes]
"""(src, dst, hop, frame) -> frame as delivered; hop counts the sender's exchanges from 0."""


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
        self._queues: dict[tuple[int, int], queue.SimpleQueue[bytes | _Failure]] = {
            (n, p): queue.SimpleQueue() for n, ps in self.neighbors.items() for p in ps
        }
        self._inbox = Inbox(f"attach node {attach}") if attach is not None else None
        self._endpoints: dict[int, MemoryTransport] = {}
        self._dead: dict[int, str] = {}
        self._cut: set[tuple[int, int]] = set()

    def endpoint(self, node: int, counter: ByteCounter | None = None) -> MemoryTransport:
        if node not in self.neighbors:
            raise ValueError(f"node {node} is not in the network")
        if node in self._endpoints:
            raise ValueError(f"node {node} already has an endpoint")
        self._endpoints[node] = MemoryTransport(self, node, counter or ByteCounter())
        return self._endpoints[node]

    def evaluator_inbox(self) -> Inbox:
        if self._inbox is None:
            raise ValueError("network has no evaluator (pass attach=node)")
        return self._inbox

    def counter(self) -> ByteCounter:
        """All endpoints' counts merged."""
        return ByteCounter.merged([e.counter for e in self._endpoints.values()])

    def kill(self, node: int) -> None:
        """Crash `node`: its own calls and every receive from it raise from now on."""
        self._poison(node, f"node {node} was killed", inbound=True)
        self._dead[node] = f"node {node} was killed"

    def cut(self, src: int, dst: int) -> None:
        """Fail the link src -> dst: dst's next receive from src raises; later frames are lost."""
        self._cut.add((src, dst))
        self._queues[(src, dst)].put(_Failure(f"link {src} -> {dst} was cut"))

    def _poison(self, node: int, reason: str, inbound: bool = False, stream: bool = True) -> None:
        for p in self.neighbors[node]:
            self._queues[(node, p)].put(_Failure(reason))
            if inbound:
                self._queues[(p, node)].put(_Failure(reason))
        if stream and node == self.attach and self._inbox is not None:
            self._inbox._put(TransportError(f"evaluator: stream from attach node {node} failed: {reason}"))

    def _send(self, src: int, dst: int, hop: int, frame: bytes) -> None:
        if (src, dst) in self._cut:
            return
        if self.mutate is not None:
            frame = self.mutate(src, dst, hop, frame)
        self._queues[(src, dst)].put(frame)

    def _recv(self, src: int, dst: int, deadline: float) -> bytes:
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


class MemoryTransport:
    """One node's endpoint of an InMemoryNetwork (use from one thread)."""

    def __init__(self, network: InMemoryNetwork, node: int, counter: ByteCounter) -> None:
        self.network = network
        self.node = node
        self.peers = network.neighbors[node]
        self.counter = counter
        self.hop = 0
        self._closed = False

    def __enter__(self) -> MemoryTransport:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(abort=exc_type is not None)

    def _check(self) -> None:
        if reason := self.network._dead.get(self.node):
            raise TransportError(f"node {self.node}: {reason}")
        if self._closed:
            raise TransportError(f"node {self.node}: transport is closed")

    def exchange(self, frames: Mapping[int, bytes]) -> dict[int, bytes]:
        self._check()
        _check_addressed(self.node, self.peers, frames)
        for p in self.peers:
            frame = bytes(frames.get(p, b""))
            self.counter.add(self.node, p, HEADER + len(frame))
            self.network._send(self.node, p, self.hop, frame)
        deadline = time.monotonic() + self.network.timeout_s
        out = {p: self.network._recv(p, self.node, deadline) for p in self.peers}
        self.hop += 1
        return out

    def push(self, frame: bytes) -> None:
        self._check()
        inbox = self.network._inbox
        if inbox is None or self.node != self.network.attach:
            raise ValueError(f"node {self.node} is not the evaluator's attach node")
        frame = bytes(frame)
        self.counter.add(self.node, EVALUATOR, HEADER + len(frame))
        if self.network.mutate is not None:
            frame = self.network.mutate(self.node, EVALUATOR, self.hop, frame)
        inbox._put(frame)

    def close(self, abort: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        reason = f"node {self.node} {'aborted' if abort else 'closed'}"
        is_attach = self.node == self.network.attach and self.network._inbox is not None
        if is_attach and not abort and self.node not in self.network._dead:
            self.counter.add(self.node, EVALUATOR, HEADER)  # the end marker, as gloo counts it
            self.network._inbox._put(_EOS)  # type: ignore[union-attr]
        self.network._poison(self.node, reason, stream=abort)
