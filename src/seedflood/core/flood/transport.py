"""Moving opaque frames between topology neighbours, and one-way to the evaluator: the interface.

Owns what every backend shares, and nothing backend-specific:
- `Transport`: the interface the flood runs on. One `exchange(frames, step)` is one synchronous
  hop: a frame (bytes, possibly empty) goes to every neighbour and one comes back from every
  neighbour. `push(frame, step)` sends a frame one way to the evaluator (only on its attach
  node) without slowing hops. The step is passed explicitly and only labels the byte counts.
- `ByteCounter`: every byte handed to the backend, per directed edge and per step. These are the
  communication figures we publish, so every backend counts the same thing the same way:
  `HEADER` (4-byte u32 length) + the frame, once, at the sender; the end-of-stream marker `close()`
  sends to the evaluator is `HEADER` bytes at the transport's `last_step`.
- `ChurnTransport`: a `Transport` that outlives its peers, as the churn strategy
  (roles/churn.py) uses it: a failed peer is dropped and reported (`take_lost`), not raised;
  edges (re)connect by meetings (`connect`); a restarted neighbour is claimed (`revived`,
  `claim`) and caught up by a blob (`send_blob`, `recv_blob`); a restarted process waits for
  its sponsor (`sponsor`).
- `Healing`: a `ChurnTransport` whose down edges between live members come back (the in-memory
  one, and the per-edge gloo one over its store): a negotiation of the exchange index both ends
  reconnect at.
- `Growing`: a `ChurnTransport` that a brand-new node id may join (the in-memory one; launched
  joins are not built): the newcomers waiting for a sponsor, and adding an edge to the graph.
- `EvaluatorFeed`: what a churn attach node needs to feed an evaluator that follows it (answer
  its greeting, open each new edge with the steps it lacks, push).
- `Inbox`: the evaluator's side of the push channel (an ordered queue that ends with the
  stream, or fails with the sender), with an `on_frame` hook and a `received` count.
- `TransportError`, and the constants every backend and its callers agree on.

Backends: `seedflood.comm.gloo.GlooTransport` (strict: one torch.distributed process group,
point-to-point), `seedflood.comm.links.EdgeTransport` (churn: one gloo group per edge; a
`ChurnTransport` and an `EvaluatorFeed`) and `seedflood.comm.memoryendpoint.MemoryTransport`
(threads of one process, with fault injection; a `ChurnTransport`). This module imports neither
torch nor torch.distributed.

Assumes: a transport is driven from one thread; frame contents are none of this layer's
business (message.py validates them).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)

EVALUATOR = -1
"""Node id of the evaluator in byte counts (it is rank 0, not a topology node)."""
HEADER = 4
"""Bytes of the u32 length that precedes every frame on the wire (counted). Frames are far below
MAX_FRAME_BYTES (< 2**32), so 4 bytes hold any length plus the end-of-stream marker 2**32 - 1."""
INLINE_BYTES = 64 * 1024
"""Receive buffer per peer (gloo): frames up to INLINE_BYTES - HEADER travel in one message."""
MAX_FRAME_BYTES = 1 << 30
"""A length header above this is treated as a corrupt stream."""
MAX_PENDING = 1024
"""Unfinished push messages to the evaluator before `push` waits for the oldest (back-pressure)."""


class TransportError(RuntimeError):
    """A peer failed (crashed, closed, timed out or sent a corrupt stream); names node and rank."""


@runtime_checkable
class Transport(Protocol):
    node: int
    peers: tuple[int, ...]
    """Neighbour node ids, sorted."""
    counter: ByteCounter
    last_step: int
    """Step of the latest exchange or push (0 before any): where close() counts its end marker."""

    def exchange(self, frames: Mapping[int, bytes], step: int) -> dict[int, bytes]:
        """One hop of `step`: send frames[p] (b"" if absent) to every peer p; return every
        peer's frame. The bytes sent are counted at `step`."""
        ...

    def push(self, frame: bytes, step: int) -> None:
        """Send a frame one way to the evaluator (attach node only), counted at `step`; never
        waits for a hop."""
        ...

    def close(self, abort: bool = False) -> None:
        """Finish: end the evaluator stream (unless abort) and release resources."""
        ...


class ChurnTransport(Transport, Protocol):
    """A transport of a churn run (docs/churn-design.md, Per-edge transport and the store): what
    `roles.churn.Churn` calls besides `Transport`'s hops. An exchange drops a failed peer instead
    of raising; `peers` are the neighbours connected now, `neighbours` every topology neighbour
    (what may be connected)."""

    neighbours: tuple[int, ...]
    """Topology neighbours, sorted, connected or not."""
    incarnation: int
    """This process's life of its node: a restart gets a higher one (0 or 1 first, by backend)."""

    def connect(self, peers: Sequence[int], timeout_s: float | None = None) -> list[int]:
        """Meet these neighbours, each only if it connects to this node within `timeout_s` s
        (None: the transport's own timeout); returns those connected now, exchanging from the
        next hop. Never raises for a peer that does not come."""
        ...

    def revived(self) -> list[int]:
        """Unconnected neighbours restarted (a new incarnation) since the last call; each once."""
        ...

    def claim(self, node: int) -> int | None:
        """Become revived `node`'s sponsor (the first neighbour to ask wins): its incarnation,
        or None when another neighbour won (or the claim could not be made)."""
        ...

    def send_blob(self, peer: int, data: bytes) -> None:
        """Hand a connected peer a catch-up payload, apart from the hops (not hop traffic)."""
        ...

    def recv_blob(self, peer: int, timeout_s: float) -> bytes:
        """The catch-up payload `peer` sent, within `timeout_s` s; TransportError otherwise."""
        ...

    def sponsor(self, timeout_s: float) -> int:
        """A restarted process: the neighbour that claimed it, waiting up to `timeout_s` s for
        one; TransportError when none did."""
        ...

    def take_lost(self) -> dict[int, str]:
        """Peers dropped since the last call (peer -> why); clears them. {} when none were."""
        ...

    def drop(self, peer: int, reason: str) -> None:
        """Close the edge to a connected peer now, as if it had failed (it sent what no correct
        peer sends): `take_lost` reports it and the peer's end of the edge fails. No-op when the
        peer is not connected."""
        ...

    def part(self, peer: int) -> None:
        """Close the edge to a connected peer that leaves gracefully (or to every peer, on the
        leaver's side), right before the exchange both ends agreed on (a LEAVE note's hop): not
        a failure, so `take_lost` does not report it. No-op when the peer is not connected."""
        ...


@runtime_checkable
class Healing(Protocol):
    """What a churn client calls to heal its down edges (docs/churn-design.md, Healed edges):
    before each exchange it asks for the edges to the live members it lacks; both ends connect
    right before one exchange index they agreed on ahead of both clocks, or neither does."""

    peers: tuple[int, ...]

    def healable(self, peer: int, incarnation: int | None) -> bool:
        """`peer` runs as `incarnation` (None: its first life) and could still heal an edge."""
        ...

    def heal(self, want: Mapping[int, int | None], hop: int) -> dict[int, int]:
        """Right before exchange `hop`, never waiting: ask to heal the down edges to `want`
        (peer -> the incarnation it must run as); returns peer -> the exchange index both ends
        agreed to connect at (the same one at both ends), for each heal agreed so far. A
        proposal of this end to a peer no longer in `want` is withdrawn, or, where the peer took
        it first, its index is returned all the same (connect, then close the edge)."""
        ...

    def restore(self, peer: int) -> None:
        """Connect a healed edge right before the agreed exchange."""
        ...


@runtime_checkable
class Growing(Protocol):
    """What a churn client calls for a brand-new node id (docs/churn-design.md, A new id joins):
    the ids waiting for a sponsor, and the edges its rule adds to the graph."""

    neighbours: tuple[int, ...]

    def newcomers(self) -> list[int]:
        """Brand-new ids that wait for a sponsor and that this node can reach (not yet claimed)."""
        ...

    def grow(self, peers: Sequence[int]) -> None:
        """Make `peers` neighbours of this node (not connected yet: `connect` or a heal does)."""
        ...


class EvaluatorFeed(Protocol):
    """What a churn client needs to feed the evaluator while it is the roster's attach node
    (`roles.churn.Churn.follow`): the evaluator follows whichever node that is now, greeting it
    over the store; each new evaluator edge opens with a blob of the decided steps it lacks,
    then every step applied from there is pushed."""

    attach: bool
    """This node keeps an evaluator edge (set once it becomes the attach node)."""
    evaluator_links: int
    """Evaluator edges built so far: each opens with one catch-up blob."""

    @property
    def evaluator_connected(self) -> bool: ...

    def poll(self, timeout_s: float | None = None, evaluator_only: bool = False) -> list[int]:
        """Between steps: connect whoever waits to connect to this node (`evaluator_only`: the
        evaluator alone); returns them."""
        ...

    def evaluator_needs(self) -> int:
        """The first step the connected evaluator lacks, as it published it (0 if unknown)."""
        ...

    def send_blob(self, peer: int, data: bytes) -> None:
        """Hand the evaluator (`peer` EVALUATOR) a catch-up blob without waiting for it."""
        ...

    def push(self, frame: bytes, step: int) -> None:
        """Send a frame one way to the evaluator, counted at `step`."""
        ...


def check_addressed(node: int, peers: Sequence[int], frames: Mapping[int, bytes]) -> None:
    """A hop sends only to neighbours: anything else is a caller bug (shared by the backends)."""
    if unknown := set(frames) - set(peers):
        raise ValueError(f"node {node}: frames for non-neighbours {sorted(unknown)}")


# --- byte accounting ----------------------------------------------------------------------------


class ByteCounter:
    """Bytes handed to the backend, keyed by (step, src node, dst node); dst -1 = evaluator.

    Each process counts what it sends, so one counter holds one node's out-edges; `merged` adds
    counters of many nodes. Thread-safe: the step is an argument of `add`, so there is no shared
    mutable "current step" (a gloo push and a hop may count from different places).
    """

    def __init__(self) -> None:
        self._bytes: dict[tuple[int, int, int], int] = defaultdict(int)  # (step, src, dst) -> bytes
        self._lock = threading.Lock()

    def add(self, step: int, src: int, dst: int, nbytes: int) -> None:
        with self._lock:
            self._bytes[(step, src, dst)] += nbytes

    def add_many(self, step: int, src: int, sizes: Sequence[tuple[int, int]]) -> None:
        """`add(step, src, dst, nbytes)` for each (dst, nbytes), under one lock (a hop's edges)."""
        with self._lock:
            for dst, nbytes in sizes:
                self._bytes[(step, src, dst)] += nbytes

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


# --- evaluator inbox (base of both backends' receiving side) -----------------------------------


class _EndOfStream:
    pass


EOS = _EndOfStream()
"""Queued once the sender closed its stream without aborting."""


class Inbox:
    """Frames pushed to the evaluator, in order. `get` returns None once the sender ended its
    stream (close without abort), raises TransportError if the sender failed, TimeoutError if
    nothing came within `timeout` seconds. Iterating yields frames until the end of stream.

    Progress while the consumer is busy (e.g. scoring): `received` counts frames queued so far
    (it is raised before the frame is queued, so received >= frames the consumer has taken), and
    `on_frame`, if set (constructor or `inbox.on_frame = fn`), is called with no arguments on
    the receiving side right after each frame is queued: gloo's receiver thread, or the pushing
    node's thread in memory. It must be quick and thread-safe; an exception from it is logged
    (once) and otherwise ignored, so a display bug can neither kill the stream nor the sender.
    The end-of-stream marker and failures are not frames: they neither count nor call it.
    """

    watches_sender = False
    """True for an inbox that ends or fails by itself once its sender is gone (a heartbeat, its own
    bounds: attach.AttachInbox), so a consumer waits for each frame without a timeout of its own."""

    def __init__(self, sender: str, *, on_frame: Callable[[], None] | None = None) -> None:
        self.sender = sender
        self.on_frame: Callable[[], None] | None = on_frame
        self.received = 0  # frames queued so far; written only by the receiving side
        self._queue: queue.SimpleQueue[bytes | _EndOfStream | TransportError] = queue.SimpleQueue()
        self._final: _EndOfStream | TransportError | None = None
        self._hook_failed = False

    def sender_of(self, step: int) -> str:
        """Who sent the frame of `step` (for a line that names it): the one sender here."""
        return self.sender

    def put(self, item: bytes | _EndOfStream | TransportError) -> None:
        """Queue a frame, the end of stream or a failure; frames count and call `on_frame`."""
        if not isinstance(item, bytes):
            self._queue.put(item)
            return
        self.received += 1
        self._queue.put(item)
        hook = self.on_frame
        if hook is not None:
            try:
                hook()
            except Exception:  # a progress display must not become a transport failure
                if not self._hook_failed:
                    self._hook_failed = True
                    log.warning(
                        "inbox from %s: on_frame raised (logged once, later errors are silent)",
                        self.sender,
                        exc_info=True,
                    )

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
