"""One connected edge of the per-edge transport: a 2-rank gloo group and its heartbeat.

Owns `Edge` (the group, the peer's rank in it, a hop receive buffer, blobs in flight and the
heartbeat), `receive` (one length-prefixed message off an edge), the tags an edge carries besides
hops and pushes (TAG_BLOB, TAG_BEAT, TAG_ABORT), and the bounded gloo waits every user of an edge
goes through (`bound`, `wait_for`): gloo reads a zero bound as its context timeout, so `bound`
never passes zero, and a wait that times out closes every pair of its group (gloo's rule, used on
purpose: it is how a silent peer's edge is closed). Edges still open at interpreter exit are
closed then (a thread blocked in a gloo wait would make the process abort).

Heartbeat: one byte every timeout_s / 4 on its own tag, watched with a bound of timeout_s; a peer
that stops taking beats, or sends none, is silent (stopped, hung, host gone without a reset), and
the watcher's timeout closes the edge, which fails the hop waiting on it at once.

Assumes: gloo.py's wire (framing.py: length header + frame, the tail of a long frame as a second
message); both ends of an edge use the same inline size and heartbeat timeout.
"""

from __future__ import annotations

import atexit
import math
import threading
import time
import weakref
from collections import deque
from datetime import timedelta

import torch
import torch.distributed as dist

from seedflood.comm.framing import END, HeadBuffer, reason
from seedflood.core.flood.transport import EVALUATOR, HEADER, TransportError

TAG_BLOB = 0x5EED_0002  # catch-up blobs: apart from hops (TAG_HOP) and pushes (TAG_EVAL)
TAG_BEAT = 0x5EED_0003  # heartbeats
TAG_ABORT = 0x5EED_0004  # never sent: a receive on it times out, which closes an edge (Edge.close)
BEATS_PER_TIMEOUT = 4  # heartbeat period = timeout_s / 4
_FOREVER = timedelta(days=365)  # "no bound" as an explicit gloo bound (see bound)


def bound(deadline: float | None) -> timedelta:
    """A gloo wait bound for `deadline` (monotonic s; None = none): at least 1 ms, because a
    zero bound means gloo's context timeout instead."""
    if deadline is None:
        return _FOREVER
    return timedelta(milliseconds=max(1, math.ceil(1e3 * (deadline - time.monotonic()))))


def wait_for(work: dist.Work, deadline: float | None) -> str | None:
    """Wait for `work` until `deadline`; None when it succeeded, else the reason, one line."""
    try:
        work.wait(bound(deadline))
        return None
    except Exception as e:  # gloo raises RuntimeError / DistBackendError
        return reason(e)


def who(node: int) -> str:
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
                    if wait_for(self._beats.popleft()[0], time.monotonic()) is not None:
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
    edge.recv(head.tensor, tag).wait(bound(deadline))
    n = head.length()
    if n == END:
        return None
    if not 0 <= n <= max_bytes:
        raise TransportError(f"corrupt length {n}")
    cut = head.tensor.numel() - HEADER
    data = head.payload(min(n, cut))
    if n > cut:  # the rest follows as one exact-size message
        tail = torch.empty(n - cut, dtype=torch.uint8)
        edge.recv(tail, tag).wait(bound(deadline))
        data += tail.numpy().tobytes()
    return data
