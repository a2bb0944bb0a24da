"""The evaluator's side of a churn run: it follows the attach node, whoever that is now.

Owns `AttachInbox`, the evaluator's `transport.Inbox` in a churn run (docs/churn-design.md, The evaluator follows the attach node). The
clients agree on one attach node (`membership.Roster.attach`: the configured one until it leaves,
then the next member after it); that node streams each step it decides to the evaluator over an
edge built like a topology edge (rendezvous.py, edge.py), and only that node answers the
evaluator's greeting.

How the evaluator follows it, with two threads:
- the offer thread keeps a greeting (`rendezvous.hello_key`) addressed to the newest incarnation
  of every node except the one it streams from, and every OFFER_S reads their answers. An answer
  comes only from the attach node, so an answer from another node means the attach node moved
  (its predecessor left, or stalled and was excluded): the thread builds that edge, takes the
  catch-up blob every edge opens with (the sender's decided steps from the step the evaluator
  published it needs, `rendezvous.evaluator_next_key`), and makes it the stream's edge, closing
  the old one (which also ends a receive blocked on a stalled predecessor).
- the stream thread receives pushes from the current edge. Every push carries its step, so a
  `stepstream.StepSequence` hands the consumer each step once, in order from `start`, however
  the successive senders' steps overlap; a gap is an error (TransportError to the consumer).
An edge that fails, or ends before the last step, is simply dropped: the next attach node, or the
same one reconnecting, answers a fresh greeting. Evaluator edges beat like topology edges
(edge.Edge, `timeout_s`), so a sender that goes silent (stopped, cut off) is dropped within
timeout_s instead of holding a receive for ever. The stream ends as soon as the last step is in
(edges stay open until `close`, so the sender's own end marker still finds a receiver). The
inbox gives up (TransportError) when no edge has been up for `wait_s` (said on screen every
REPORT_S meanwhile; an edge switch started with no edge up ends by then too), or at once when
every key of `done_keys` (the clients' final or stop reports) is in the store, or `done()` says
so (the same reports on this disk).

Store use: 2 reads per node per OFFER_S while the run lasts (no training path is involved),
each bounded by timeout_s (bounded.BoundedStore). In a run open to brand-new ids (`joinable`,
churn.max_nodes) the nodes are the founders and every new id that knocked (`rendezvous.Knocks`:
one more read per OFFER_S), so a new id that becomes the attach node is followed too.
Assumes: one AttachInbox per evaluator process (it registers the evaluator's incarnation).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import torch.distributed as dist

from seedflood.comm.bounded import BoundedStore, bounded
from seedflood.comm.edge import TAG_BLOB, Edge, receive
from seedflood.comm.framing import TAG_EVAL, HeadBuffer, device, reason
from seedflood.comm.rendezvous import (
    MIN_BUILD_S,
    Knocks,
    build_edge,
    evaluator_next_key,
    greeting,
    hello_key,
    incarnation_of,
    parse_greeting,
    peek,
    register,
)
from seedflood.core.flood.stepstream import StepSequence, decode_push, decode_pushes
from seedflood.core.flood.transport import EOS, EVALUATOR, INLINE_BYTES, MAX_FRAME_BYTES, Inbox, TransportError
from seedflood.core.wire.message import FrameError

log = logging.getLogger(__name__)

OFFER_S = 0.25  # how often the offer thread re-reads greetings and answers (s)
REPORT_S = 10.0  # how often an evaluator with no edge says on screen that it waits (s)


class AttachInbox(Inbox):
    """Steps start..steps-1 of a churn run, from whichever client is the attach node (see the
    module docstring). `nodes`: the run's client count (its founders); `joinable`: the brand-new
    ids that may join (churn.max_nodes), followed once they knocked; `blob_wait_s`: the most a new
    edge's catch-up blob may take; `wait_s`: the most the inbox waits with no edge up."""

    watches_sender = True  # edges beat, no edge up for wait_s gives up, the clients' reports end it

    def __init__(
        self,
        store: dist.Store,
        nodes: int,
        steps: int,
        *,
        start: int = 0,
        incarnation: int | None = None,
        wait_s: float = 300.0,
        blob_wait_s: float = 30.0,
        timeout_s: float = 30.0,
        done_keys: Sequence[str] = (),
        done: Callable[[], bool] | None = None,
        inline_bytes: int = INLINE_BYTES,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        joinable: Sequence[int] = (),
    ) -> None:
        super().__init__("the attach node")
        self.nodes = nodes
        self.joinable = joinable
        self.steps = steps
        self.incarnation = incarnation if incarnation is not None else register(store, EVALUATOR)
        self.wait_s = wait_s
        self.blob_wait_s = blob_wait_s
        self.timeout_s = timeout_s
        self.done_keys = list(done_keys)
        self.done = done  # like done_keys, another way to know (the clients' reports on this disk)
        self.senders: list[int] = []  # the attach nodes followed so far, in order
        self._from: dict[int, int] = {}  # step -> the node whose payload of it was queued
        self._inline = inline_bytes
        self._max_frame = max_frame_bytes
        self._seq = StepSequence(start)
        self._lock = threading.Condition()  # guards _seq, _edge, _over; wakes the stream thread
        self._edge: Edge | None = None
        self._over = False  # every step is queued, or the stream was given up: nothing more comes
        self._offering = True  # the offer thread runs (it alone can bring a new edge)
        device()
        self._offers = threading.Thread(
            target=self._offer_loop,
            args=(bounded(store, timeout_s).clone(),),
            name="seedflood-attach-offer",
            daemon=True,
        )
        self._stream = threading.Thread(target=self._stream_loop, name="seedflood-attach-stream", daemon=True)
        self._offers.start()
        self._stream.start()

    @property
    def connected(self) -> bool:
        return self._edge is not None

    # --- taking steps -------------------------------------------------------------------------
    def _take(self, step: int, payload: bytes, node: int) -> None:
        """Queue `payload` (sent by `node`) if `step` is the next one, and the end once the last
        step is in; drops repeats. Called under the lock."""
        if self._over or not self._seq.offer(step, payload):
            return
        self._from[step] = node
        self.put(payload)
        if self._seq.next >= self.steps:  # everything is here: the sender's marker is not needed
            self._over = True
            self.put(EOS)
            self._lock.notify_all()

    def sender_of(self, step: int) -> str:
        """The attach node that sent step `step` (a line that refuses it names it)."""
        node = self._from.get(step)
        return self.sender if node is None else f"node {node} (the attach node it followed)"

    def _fail(self, error: TransportError) -> None:
        """Give the stream up (once): the consumer's next `get` raises `error`."""
        with self._lock:
            if self._over:
                return
            self._over = True
            self.put(error)
            self._lock.notify_all()

    # --- the offer thread ---------------------------------------------------------------------
    def _offer_loop(self, raw: dist.Store) -> None:
        # Every store call of this loop is bounded by timeout_s (a store whose host went silent
        # would otherwise hold it past wait_s); gloo's rendezvous in `_switch` needs the plain one.
        store = BoundedStore(raw, self.timeout_s)
        mine: dict[int, tuple[int, str]] = {}  # node -> (its incarnation greeted, our greeting)
        answered: dict[int, str] = {}  # node -> its last answer acted on
        since = time.monotonic()  # when the stream last had an edge
        report = since + REPORT_S
        error: TransportError | None = None
        knocks = Knocks(self.wait_s) if self.joinable else None
        nodes = list(range(self.nodes))  # and every new id that knocked
        try:
            while not self._over:
                for n, _ in knocks.read(store) if knocks is not None else ():
                    if n in self.joinable and n not in nodes:
                        nodes.append(n)
                with self._lock:
                    current = self._edge.peer if self._edge is not None else None
                    needs = self._seq.next
                store.set(evaluator_next_key(self.incarnation), str(needs))
                now = time.monotonic()
                if current is None:
                    if (self.done_keys and store.check(self.done_keys)) or (self.done is not None and self.done()):
                        raise TransportError(
                            f"evaluator: every client has finished or stopped, and the stream ended "
                            f"after step {self._seq.next - 1} of {self.steps}"
                        )
                    if now - since > self.wait_s:
                        raise TransportError(
                            f"evaluator: no client has streamed to it for {self.wait_s:g} s (after step "
                            f"{self._seq.next - 1} of {self.steps})"
                        )
                    if now >= report:
                        log.warning(
                            "evaluator: waiting for the attach node to stream from step %d (%.0f s of %g)",
                            needs,
                            now - since,
                            self.wait_s,
                        )
                        report = now + REPORT_S
                else:
                    since, report = now, now + REPORT_S
                for n in nodes:
                    if n == current:
                        continue
                    inc = incarnation_of(store, n)
                    if not inc:
                        continue
                    if n not in mine or mine[n][0] != inc:  # greet this incarnation
                        if n in mine:
                            store.delete_key(hello_key(EVALUATOR, n, mine[n][0]))
                        mine[n] = (inc, greeting(self.incarnation))
                        store.set(hello_key(EVALUATOR, n, inc), mine[n][1])
                    theirs = peek(store, hello_key(n, EVALUATOR, self.incarnation))
                    if theirs is None or theirs == answered.get(n) or parse_greeting(theirs)[0] != inc:
                        continue
                    answered[n] = theirs
                    # no edge meanwhile: the switch may not outlast the stream's own bound
                    limit = since + self.wait_s if current is None else None
                    self._switch(raw, n, inc, mine[n][1], theirs, limit)
                    # a fresh greeting for the next time (an answered one is never answered again)
                    mine[n] = (inc, greeting(self.incarnation))
                    store.set(hello_key(EVALUATOR, n, inc), mine[n][1])
                    break  # re-read `current`
                time.sleep(OFFER_S)
        except TransportError as e:
            error = e
        except Exception as e:  # the store is gone: no edge can be built any more
            with self._lock:
                self._offering = False
                alone = self._edge is None
            if alone:
                error = TransportError(f"evaluator: the store failed with no client streaming: {reason(e)}")
            elif not self._over:
                log.warning("evaluator: the store failed (%s): following the current attach node only", reason(e))
        for n, (inc, _) in mine.items():  # withdraw the greetings before the consumer hears the end
            try:
                store.delete_key(hello_key(EVALUATOR, n, inc))
            except Exception:
                break
        if error is not None:
            self._fail(error)

    def _switch(
        self, store: dist.Store, node: int, inc: int, mine: str, theirs: str, limit: float | None = None
    ) -> None:
        """Build the edge to `node` (which answered `mine` with `theirs`), take its catch-up blob,
        and make it the stream's edge, all within blob_wait_s (and before `limit`, a monotonic
        time, when given). A failed build or blob is logged and dropped. The edge beats like a
        topology edge, so a sender that goes silent (stopped, cut off) is found within timeout_s."""
        deadline = time.monotonic() + self.blob_wait_s
        if limit is not None:
            deadline = max(time.monotonic() + MIN_BUILD_S, min(deadline, limit))
        try:
            edge = build_edge(store, EVALUATOR, mine, node, inc, theirs, deadline, self._inline, self.timeout_s)
        except Exception as e:
            log.warning("evaluator: no edge to node %d: %s", node, reason(e))
            return
        try:
            blob = receive(edge, TAG_BLOB, HeadBuffer(self._inline), deadline, self._max_frame)
            if blob is None:
                raise TransportError("end-of-stream marker instead of a catch-up blob")
            steps = decode_pushes(blob)
        except Exception as e:
            log.warning("evaluator: node %d's catch-up failed: %s", node, reason(e))
            edge.close()
            return
        with self._lock:
            if self._over:
                edge.close()
                return
            try:
                for s, payload in steps:
                    self._take(s, payload, node)
            except FrameError as e:
                edge.close()
                raise TransportError(f"evaluator: node {node}'s catch-up: {e}") from None
            old, self._edge = self._edge, edge
            self.senders.append(node)
            self._lock.notify_all()
        if old is not None:
            old.close()
        log.warning(
            "evaluator: following node %d (incarnation %d) from step %d; its catch-up held %d steps",
            node,
            inc,
            self._seq.next,
            len(steps),
        )

    # --- the stream thread --------------------------------------------------------------------
    def _stream_loop(self) -> None:
        head = HeadBuffer(self._inline)
        while True:
            with self._lock:
                while self._edge is None and not self._over:
                    self._lock.wait()
                if self._over:
                    return
                edge = self._edge
            assert edge is not None  # the wait above ends with an edge or with the stream over
            try:
                data = receive(edge, TAG_EVAL, head, None, self._max_frame)
            except Exception as e:
                self._drop(edge, f"stream failed: {reason(e)}")
                continue
            if data is None:  # the sender closed its stream before the last step
                self._drop(edge, f"stream ended after step {self._seq.next - 1} of {self.steps}")
                continue
            try:
                step, payload = decode_push(data)
                with self._lock:
                    if self._edge is edge:
                        self._take(step, payload, edge.peer)
            except FrameError as e:
                self._fail(TransportError(f"evaluator: stream from node {edge.peer}: {e}"))
                return

    def _drop(self, edge: Edge, why: str) -> None:
        with self._lock:
            if self._edge is not edge or self._over:
                return  # replaced meanwhile (the switch closed it), or nothing more is wanted
            self._edge = None
            offering = self._offering
        edge.close()
        if not offering:
            self._fail(TransportError(f"evaluator: lost node {edge.peer} ({why}) and the store is gone"))
            return
        log.warning("evaluator: lost node %d: %s; waiting for the attach node to answer", edge.peer, why)

    def close(self) -> None:
        """Stop both threads (a receive blocked in gloo ends when its edge is closed)."""
        with self._lock:
            self._over = True
            edge, self._edge = self._edge, None
            self._lock.notify_all()
        if edge is not None:
            edge.close()
        self._offers.join(timeout=4 * OFFER_S)
        self._stream.join(timeout=1.0)
