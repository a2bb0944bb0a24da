"""A churn-tolerant process transport: one 2-rank gloo process group per topology edge.

Owns `EdgeTransport` (one process's hops, evaluator pushes and catch-up blobs, over the edges
its base edgeset.EdgeSet connects). The parts: edge.py (one edge, its heartbeat, bounded waits),
rendezvous.py (store keys, incarnations, how two ends meet), edgeset.py (the edge set and how it
changes), healing.py (a down edge's heal: the store negotiation and the new pair). These, runtime.py, gloo.py, attach.py and bounded.py are the adapters that import
torch.distributed.

Why per edge: a torch.distributed group cannot take back a member it lost, so one static world
(gloo.py) turns any crash into the end of the run. Here every edge is its own 2-rank
ProcessGroupGloo (rank 0 = the smaller node id; the evaluator is node -1), built directly on a
PrefixStore of the shared store, as torchft reconfigures its groups: a dead edge is dropped
alone, and a restarted process (same node id, new incarnation) builds fresh groups under fresh
prefixes (rendezvous.py). The store is used only to (re)connect (a down edge's heal asks it
before each exchange, healing.py), never inside a hop.

Wire: gloo.py's format and helpers (length header + frame, the tail of a long frame as a second
message), hops on gloo.TAG_HOP, pushes on gloo.TAG_EVAL, catch-up blobs on TAG_BLOB; counting as
gloo.py (HEADER + frame per peer per exchange, at the sender, at the step passed; the end marker
at `last_step`). Blobs are not hop traffic: they are counted apart, in `blob_bytes`.

Failure handling: no wait is unbounded, none waits on the store, and a failure drops one peer,
never raises. Each topology edge carries a heartbeat (edge.Edge): one byte every timeout_s / 4 on
its own tag, watched with a bound of timeout_s. A peer whose socket closed fails the hop at once;
a silent one (stopped, hung) is found by the watcher within timeout_s (+ one beat period), which
closes the edge and so fails the hop waiting on it, once; a live peer that is merely late
(waiting on a silent node of its own) keeps beating and is waited for up to Protocol.LATE_FACTOR ×
timeout_s, so one stall never drops live edges in a cascade (as memory.py's tolerant network);
a corrupt length fails at once. A failed peer leaves `peers`, its edge is closed (which tells the
peer at once and waits on nothing) and it is recorded in `lost`. Every gloo wait gets an
explicit bound (edge.bound, edge.wait_for).

Assumes: one thread drives an EdgeTransport; both ends of an edge use the same inline_bytes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import torch
import torch.distributed as dist

from seedflood.comm.edge import TAG_BLOB, Edge, receive, wait_for, who
from seedflood.comm.edgeset import EdgeSet
from seedflood.comm.framing import END, LENGTH, TAG_EVAL, TAG_HOP, HeadBuffer, encode, reason
from seedflood.comm.rendezvous import evaluator_next_key, peek
from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.transport import EVALUATOR, HEADER, TransportError

log = logging.getLogger(__name__)

PUSH_WAIT_S = 0.05  # at the pending bound, the most push() waits for old pushes (s)


class EdgeTransport(EdgeSet):
    """One node's transport over per-edge gloo groups: a `transport.ChurnTransport` and, on the
    attach node, the `transport.EvaluatorFeed` an evaluator follows.

    The edges and how they change are EdgeSet's (constructor arguments there); this adds what
    travels over them: hops (`exchange`), the evaluator stream (`push`), catch-up blobs and
    `close`. See the module docstring.
    """

    def __enter__(self) -> EdgeTransport:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(abort=exc_type is not None)

    # --- hops ---------------------------------------------------------------------------------

    def exchange(self, frames: Mapping[int, bytes], step: int) -> dict[int, bytes]:
        """One hop with every connected peer (frames for anyone else are ignored); returns the
        frames of the peers that answered. A failing peer is dropped (see `drop`), never raised:
        a closed socket at once; a silent one (no heartbeat) within timeout_s (+ one beat
        period), once; a live one that is only late, waiting on a silent node of its own, is
        waited for up to Protocol.LATE_FACTOR × timeout_s, so a stall never drops live edges in a cascade."""
        self.check_open()
        self.last_step = step
        deadline = time.monotonic() + Protocol.LATE_FACTOR * self.timeout_s
        failed: dict[int, str] = {}  # peer -> reason (the first failure of each peer)
        edges = [self.edges[p] for p in self.peers]

        def fail(e: Edge, what: str, raw: str) -> None:
            if e.failure is not None:  # the heartbeat closed the edge: its reason is the cause
                raw = e.failure
            elif "Application timeout" in raw:  # gloo's words for "a timed-out wait closed the pairs"
                raw = f"silent for over {self.timeout_s:g} s (no heartbeat)"
            elif "Timed out" in raw:
                raw = f"{what} not done within {Protocol.LATE_FACTOR * self.timeout_s:g} s though the peer beats"
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
                for t in encode(frame, self.inline):
                    if t is not None:
                        sends.append((e, e.send(t, TAG_HOP), t))
            except Exception as x:
                fail(e, "send", reason(x))
                continue
            self.counter.add(step, self.node, e.peer, HEADER + len(frame))
        out: dict[int, bytes] = {}
        tails: list[tuple[Edge, dist.Work, torch.Tensor]] = []
        cut = self.inline - HEADER
        for e in edges:
            if e.peer in failed:
                continue
            if (why := wait_for(heads[e.peer], deadline)) is not None:
                fail(e, "receive", why)
                continue
            n = e.head.length()
            if not 0 <= n <= self.max_frame:
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
                if (why := wait_for(work, deadline)) is not None:
                    fail(e, "receive", why)
                else:
                    out[e.peer] += t.numpy().tobytes()
        for e, work, _ in sends:
            if e.peer not in failed and (why := wait_for(work, deadline)) is not None:
                fail(e, "send", why)
        for e in edges:  # blobs posted since the last hop: the peer takes them before hopping
            if e.peer not in failed and e.outbox:
                why = next(filter(None, (wait_for(w, deadline) for w, _ in e.outbox)), None)
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
        self.check_open()
        if not self.attach:
            raise ValueError(f"node {self.node} is not the evaluator's attach node")
        self.last_step = step
        if len(self.in_flight) >= self.max_pending:
            self._reap(time.monotonic() + PUSH_WAIT_S)
        edge = self.edges.get(EVALUATOR)
        if edge is None:
            self.pushes_discarded += 1
            return
        try:
            for t in encode(frame, self.inline):
                if t is not None:
                    self.in_flight.append((edge.send(t, TAG_EVAL), t))
        except Exception as x:
            self.drop(EVALUATOR, f"push failed: {reason(x)}")
            self.pushes_discarded += 1
            return
        self.counter.add(step, self.node, EVALUATOR, HEADER + len(frame))

    def _reap(self, deadline: float) -> None:
        """Wait for the older half of the pending pushes until `deadline`; a push that fails or
        is not done by then drops the evaluator (its stream is then incomplete anyway)."""
        while len(self.in_flight) > self.max_pending // 2:
            work, _ = self.in_flight.popleft()
            if (why := wait_for(work, deadline)) is not None:
                del work
                self.drop(EVALUATOR, f"push failed or {self.max_pending} pushes pending: {why}")
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
            self.store_gone(e)
            return 0

    # --- catch-up blobs -----------------------------------------------------------------------

    def _edge(self, peer: int) -> Edge:
        self.check_open()
        edge = self.edges.get(peer)
        if edge is None:
            raise TransportError(f"node {self.node}: {who(peer)} is not connected")
        return edge

    def send_blob(self, peer: int, data: bytes) -> None:
        """Hand `data` (up to max_frame_bytes) to a connected peer or the evaluator, on its own
        tag, without waiting: a sponsor's hop loop must not stall while the newcomer is still
        connecting its other edges. It completes when the peer takes it (`recv_blob`); a peer's
        blob is waited for within the deadline of the next `exchange` (a failure there drops the
        peer like any hop failure), the evaluator's like a push. Counted in `blob_bytes`, not in
        the hop counter. Raises TransportError (after dropping it) when the post itself fails."""
        if len(data) > self.max_frame:
            raise ValueError(f"blob of {len(data)} bytes exceeds {self.max_frame}")
        edge = self._edge(peer)
        queue = self.in_flight if peer == EVALUATOR else edge.outbox
        try:
            for t in encode(data, self.inline):
                if t is not None:
                    queue.append((edge.send(t, TAG_BLOB), t))
        except Exception as x:
            why = reason(x)
            self.drop(peer, f"incarnation {edge.incarnation}: blob send failed: {why}")
            raise TransportError(f"node {self.node}: blob to {who(peer)} failed: {why}") from None
        self.blob_bytes[peer] += HEADER + len(data)

    def recv_blob(self, peer: int, timeout_s: float | None = None) -> bytes:
        """The next blob from a connected peer (or the evaluator), within timeout_s (default:
        the hop timeout). On failure the peer is dropped and TransportError raised."""
        edge = self._edge(peer)
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        try:
            data = receive(edge, TAG_BLOB, HeadBuffer(self.inline), deadline, self.max_frame)
            if data is None:
                raise TransportError("end-of-stream marker instead of a blob")
            return data
        except Exception as x:
            why = reason(x)
        self.drop(peer, f"incarnation {edge.incarnation}: blob receive failed: {why}")
        raise TransportError(f"node {self.node}: blob from {who(peer)} failed: {why}")

    # --- teardown -----------------------------------------------------------------------------

    def close(self, abort: bool = False) -> None:
        """Unless aborting, end the evaluator stream (marker counted at `last_step`) and give the
        evaluator at most close_timeout_s to take it; then release every group, which waits on
        no peer. Idempotent."""
        if self.closed:
            return
        self.closed = True
        edge = self.edges.get(EVALUATOR)
        if edge is not None and not abort:
            end = torch.frombuffer(bytearray(LENGTH.pack(END)), dtype=torch.uint8)
            try:
                self.in_flight.append((edge.send(end, TAG_EVAL), end))
                self.counter.add(self.last_step, self.node, EVALUATOR, HEADER)
            except Exception as x:
                log.warning("node %d: end of stream not sent to the evaluator: %s", self.node, reason(x))
            deadline = time.monotonic() + self.close_timeout_s
            while self.in_flight:
                work, _ = self.in_flight.popleft()
                if (why := wait_for(work, deadline)) is not None:
                    log.warning("node %d: evaluator did not take the last pushes: %s", self.node, why)
                    break
        self.in_flight.clear()
        self.heals.close()
        for edge in self.edges.values():
            edge.close()
        self.edges.clear()
        self.incarnations.clear()
        self.peers = ()
