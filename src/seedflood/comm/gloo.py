"""The process backend of `seedflood.core.flood.transport`: torch.distributed point-to-point over gloo.

Owns `GlooTransport` (one client process's hops and pushes) and `EvaluatorInbox` (rank 0's
receiver for the pushes), over the frame layout in `framing`. Frames
travel as CPU uint8 tensors (they are tiny, so even a GPU run keeps them on the CPU).

Wire format, per frame: one message `[u32 LE length][payload[:inline_bytes - 4]]`,
received into a preallocated `inline_bytes` buffer (gloo accepts a message shorter than the
posted buffer; it rejects a longer one), then, only for frames longer than that, one message
with the rest, whose exact size the receiver now knows. A hop therefore costs one message per
edge and direction in the usual case. Length 2**32 - 1 on the evaluator channel means end of
stream (a real length is at most MAX_FRAME_BYTES = 2**30).
Both ends of a channel must use the same inline_bytes (the default unless a test changes it).
Counting follows `transport.ByteCounter`: HEADER + frame, once, at the sender, at the step the
caller passes; the end marker (HEADER bytes) at `last_step`.

Assumes: the caller set up the default process group (runtime.process_group) and every process
runs the same number of hops; a transport is used from one thread.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from seedflood.comm.framing import END, LENGTH, TAG_EVAL, TAG_HOP, HeadBuffer, OutBuffer, encode, reason
from seedflood.core.flood.transport import (
    EOS,
    EVALUATOR,
    HEADER,
    INLINE_BYTES,
    MAX_FRAME_BYTES,
    MAX_PENDING,
    ByteCounter,
    Inbox,
    TransportError,
    check_addressed,
)

log = logging.getLogger(__name__)


def _require_group() -> None:
    if not dist.is_initialized():
        raise TransportError("no process group: create transports inside runtime.process_group")


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
        self.last_step = 0  # step of the latest exchange/push: the end marker is counted there
        self._rank = {p: lookup(p) for p in self.peers}  # node -> rank; EVALUATOR -> its rank
        if evaluator_rank is not None:
            self._rank[EVALUATOR] = evaluator_rank
        self._inline = inline_bytes
        self._max_frame = max_frame_bytes
        self._max_pending = max_pending
        self._heads = {p: HeadBuffer(inline_bytes) for p in self.peers}
        self._outs = {p: OutBuffer(inline_bytes) for p in self.peers}  # every hop's sends end within it
        self._peer_set = frozenset(self.peers)
        self._group = dist.group.WORLD  # the default group: node ranks are its ranks
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
            + (f": {reason(e)}" if e is not None else "")
        )
        return self._broken

    def _post(self, op: Callable[..., dist.Work], t: torch.Tensor, peer: int, tag: int) -> dist.Work:
        """isend/irecv; posting raises at once when gloo already closed the pair."""
        try:
            return op(t, self._rank[peer], tag=tag)
        except Exception as e:
            raise self._fail(peer, "send to" if op is dist.isend else "receive from", e) from e

    def _post_hop(self, send: bool, t: torch.Tensor, peer: int) -> dist.Work:
        """A hop's isend/irecv, posted on the default group itself: what dist.isend/irecv end
        in, without their per-call argument checks (a CPU uint8 tensor, a rank of the world
        group: fixed here), which cost about as much as the post (bench hops)."""
        try:
            if send:
                return self._group.send([t], self._rank[peer], TAG_HOP)
            return self._group.recv([t], self._rank[peer], TAG_HOP)
        except Exception as e:
            raise self._fail(peer, "send to" if send else "receive from", e) from e

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

    def exchange(self, frames: Mapping[int, bytes], step: int) -> dict[int, bytes]:
        self._check()
        if not frames.keys() <= self._peer_set:
            check_addressed(self.node, self.peers, frames)
        self.last_step = step
        if self._pending:
            self._reap()
        # Post everything first: heads in, then heads (+ tails) out.
        post, heads, inline = self._post_hop, self._heads, self._inline - HEADER
        recvs = [(p, post(False, heads[p].tensor, p)) for p in self.peers]
        sends: list[tuple[int, dist.Work, torch.Tensor]] = []  # (peer, work, tensor kept alive)
        sizes = []
        for p in self.peers:
            frame = frames.get(p, b"")
            sizes.append((p, HEADER + len(frame)))
            if len(frame) <= inline:
                head = self._outs[p].fill(frame)
                sends.append((p, post(True, head, p), head))
                continue
            head, tail = encode(frame, self._inline)  # a long frame: a head and a tail
            sends.append((p, post(True, head, p), head))
            if tail is not None:
                sends.append((p, post(True, tail, p), tail))
        self.counter.add_many(step, self.node, sizes)
        out: dict[int, bytes] = {}
        tails: list[tuple[int, dist.Work, torch.Tensor]] = []
        for p, work in recvs:
            self._wait(work, p, "receive from")
            n = heads[p].length()
            if not 0 <= n <= self._max_frame:
                raise self._fail(p, f"corrupt length {n} from")
            out[p] = heads[p].payload(min(n, inline))
            if n > inline:  # the rest follows as one exact-size message
                t = torch.empty(n - inline, dtype=torch.uint8)
                tails.append((p, post(False, t, p), t))
        for p, work, t in tails:
            self._wait(work, p, "receive from")
            out[p] += t.numpy().tobytes()
        for p, work, _ in sends:
            self._wait(work, p, "send to")
        return out

    def push(self, frame: bytes, step: int) -> None:
        self._check()
        if self.evaluator_rank is None:
            raise ValueError(f"node {self.node} is not the evaluator's attach node")
        self.last_step = step
        self._reap()
        while len(self._pending) >= self._max_pending:  # back-pressure: wait for the oldest
            self._wait(self._pending.popleft()[0], EVALUATOR, "push to")
        self.counter.add(step, self.node, EVALUATOR, HEADER + len(frame))
        for t in encode(frame, self._inline):
            if t is not None:
                self._pending.append((self._post(dist.isend, t, EVALUATOR, TAG_EVAL), t))

    def _reap(self) -> None:
        """Drop finished pushes (raising if one failed)."""
        while self._pending and self._pending[0][0].is_completed():
            self._wait(self._pending.popleft()[0], EVALUATOR, "push to")

    def close(self, abort: bool = False) -> None:
        """Unless aborting: send the end-of-stream marker (counted at `last_step`) and wait until
        the evaluator has taken every push (bounded by the process-group timeout). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if abort or self._broken is not None or self.evaluator_rank is None:
            self._pending.clear()
            return
        self.counter.add(self.last_step, self.node, EVALUATOR, HEADER)
        end = torch.frombuffer(bytearray(LENGTH.pack(END)), dtype=torch.uint8)
        self._pending.append((self._post(dist.isend, end, EVALUATOR, TAG_EVAL), end))
        while self._pending:
            self._wait(self._pending.popleft()[0], EVALUATOR, "push to")


class EvaluatorInbox(Inbox):
    """Rank 0's side of the push channel: a daemon thread receives from the attach node's rank
    into a queue (and calls `on_frame` after each frame; pass it here to see the very first
    frame too, since the thread starts at once). A blocked receive cannot be cancelled; the
    thread ends with the stream, with a failure of the sender, or with the process (destroying
    the process group under it is safe)."""

    def __init__(
        self,
        src_rank: int,
        src_node: int | None = None,
        *,
        inline_bytes: int = INLINE_BYTES,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        on_frame: Callable[[], None] | None = None,
    ) -> None:
        name = f"attach node {src_node} (rank {src_rank})" if src_node is not None else f"rank {src_rank}"
        super().__init__(name, on_frame=on_frame)
        _require_group()
        self.src_rank = src_rank
        self._inline = inline_bytes
        self._max_frame = max_frame_bytes
        self._thread = threading.Thread(target=self._run, name="seedflood-inbox", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        head = HeadBuffer(self._inline)
        try:
            while True:
                dist.recv(head.tensor, self.src_rank, tag=TAG_EVAL)
                n = head.length()
                if n == END:
                    self.put(EOS)
                    return
                if not 0 <= n <= self._max_frame:
                    raise ValueError(f"corrupt length {n}")
                frame = head.payload(min(n, self._inline - HEADER))
                if n > self._inline - HEADER:
                    tail = torch.empty(n - (self._inline - HEADER), dtype=torch.uint8)
                    dist.recv(tail, self.src_rank, tag=TAG_EVAL)
                    frame += tail.numpy().tobytes()
                self.put(frame)  # queues, counts `received`, calls `on_frame` (never raises)
        except Exception as e:
            self.put(TransportError(f"evaluator: stream from {self.sender} failed: {reason(e)}"))

    def close(self) -> None:
        self._thread.join(timeout=0.1)
        if self._thread.is_alive():
            log.debug("evaluator inbox: receiver still waiting on %s; left to the process", self.sender)
