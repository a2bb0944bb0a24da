"""One node's endpoint of the in-process network (`memory.InMemoryNetwork`): the transport a client thread drives.

Owns `MemoryTransport`, a `transport.ChurnTransport`: exchanges (strict: a failed peer raises;
tolerant: it is dropped and recorded in `lost`), pushes to the evaluator's inbox, edge meetings
(`connect`), a rejoin's claim, sponsor and catch-up, and its byte counting (HEADER + frame,
once, at the sender, at the step the caller passes; the end marker at `last_step`), which
mirrors GlooTransport's exactly.
The network owns the queues and the faults; this module reads its public state only.

Assumes: one endpoint per node, driven from one thread. Imports no torch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from seedflood.core.flood.transport import EOS, EVALUATOR, HEADER, ByteCounter, TransportError, check_addressed

# the network constructs its endpoints, so this names the type only (a runtime import would be a cycle)
if TYPE_CHECKING:
    from seedflood.comm.memory import InMemoryNetwork


class MemoryTransport:
    """One node's endpoint of an InMemoryNetwork (use from one thread)."""

    def __init__(self, network: InMemoryNetwork, node: int, counter: ByteCounter) -> None:
        self.network = network
        self.node = node
        self.incarnation = network.incarnations.get(node, 0)
        # a revived node starts unconnected: it connects its edges as its sponsor says
        self.neighbours = network.neighbors[node]  # topology neighbours, connected or not
        self.peers = self.neighbours if not self.incarnation else ()
        self._revived_seen = {p: network.incarnations.get(p, 0) for p in network.neighbors[node]}
        self.lost: dict[int, str] = {}  # tolerant: peers dropped and not yet taken, -> reason
        self.counter = counter
        self.hop = 0  # exchanges so far: the Mutator's `hop`
        self.last_step = 0  # step of the latest exchange/push: the end marker is counted there
        self._closed = False

    def __enter__(self) -> MemoryTransport:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(abort=exc_type is not None)

    def _check(self) -> None:
        if reason := self.network.dead.get(self.node):
            raise TransportError(f"node {self.node}: {reason}")
        if self._closed:
            raise TransportError(f"node {self.node}: transport is closed")

    def revived(self) -> list[int]:
        """Neighbours restarted (a new incarnation) since the last call, not yet connected."""
        out = []
        for p in self.network.neighbors[self.node]:
            inc = self.network.incarnations.get(p, 0)
            if inc > self._revived_seen[p] and p not in self.network.dead:
                self._revived_seen[p] = inc
                out.append(p)
        return out

    def connect(self, peers: Sequence[int], timeout_s: float | None = None) -> list[int]:
        """Connect to these neighbours, each only if it connects to this node within `timeout_s`
        (default: the network's timeout), as links.EdgeTransport's meetings; returns those
        connected now, exchanging from the next hop. A stalled node meets nobody until resumed."""
        self._check()
        if bad := [p for p in peers if p not in self.network.neighbors[self.node]]:
            raise ValueError(f"node {self.node}: {bad} are not topology neighbours")
        if (resumed := self.network.resumed.get(self.node)) is not None:
            resumed.wait()
            self._check()
        todo = sorted(set(peers) - set(self.peers))
        timeout = self.network.timeout_s if timeout_s is None else timeout_s
        added = self.network.meet(self.node, todo, timeout) if todo else []
        self.peers = tuple(sorted((*self.peers, *added)))
        return added

    def claim(self, node: int) -> int | None:
        """Become revived `node`'s sponsor (only one neighbour wins); its incarnation, or None."""
        return self.network.incarnations.get(node, 0) if self.network.claim(self.node, node) else None

    def send_blob(self, peer: int, data: bytes) -> None:
        self.network.send_blob(peer, data)

    def recv_blob(self, peer: int | None, timeout_s: float) -> bytes:
        """The catch-up payload a sponsor sent (from whichever neighbour claimed us: `peer` unused)."""
        return self.network.recv_blob(self.node, timeout_s)

    def sponsor(self, timeout_s: float) -> int:
        """The neighbour that claimed this revived node (waits up to `timeout_s` for one)."""
        return self.network.sponsor_of(self.node, timeout_s)

    def take_lost(self) -> dict[int, str]:
        """Peers dropped since the last call (tolerant mode), with the reason."""
        lost, self.lost = self.lost, {}
        return lost

    def exchange(self, frames: Mapping[int, bytes], step: int) -> dict[int, bytes]:
        self._check()
        if self.network.tolerate:
            return self._exchange_tolerant(frames, step)
        check_addressed(self.node, self.peers, frames)
        self.last_step = step
        for p in self.peers:
            frame = bytes(frames.get(p, b""))
            self.counter.add(step, self.node, p, HEADER + len(frame))
            self.network.send(self.node, p, self.hop, frame)
        deadline = time.monotonic() + self.network.timeout_s
        out = {p: self.network.recv(p, self.node, deadline) for p in self.peers}
        self.hop += 1
        return out

    def _exchange_tolerant(self, frames: Mapping[int, bytes], step: int) -> dict[int, bytes]:
        """One hop with the peers still connected; a failed one is dropped, not raised."""
        net = self.network
        if (resumed := net.resumed.get(self.node)) is not None:
            resumed.wait()  # stalled: frozen here until unstall
            self._check()
        self.last_step = step
        reach = len(self.peers)
        if (dying := net.dying.get(self.node)) is not None:
            if dying[0] == 0:
                reach = dying[1]
            else:
                net.dying[self.node] = (dying[0] - 1, dying[1])
        for i, p in enumerate(self.peers):
            frame = bytes(frames.get(p, b""))
            self.counter.add(step, self.node, p, HEADER + len(frame))
            if i < reach:
                net.send(self.node, p, self.hop, frame)
        if reach < len(self.peers):
            del net.dying[self.node]
            net.kill(self.node)
            raise TransportError(f"node {self.node}: crashed mid-send (reached {reach} of {len(self.peers)} peers)")
        out = {}
        for p in self.peers:
            try:
                out[p] = net.recv_tolerant(p, self.node)
            except TransportError as e:
                self.lost[p] = str(e)
                net.close_edge(self.node, p, f"node {self.node} dropped node {p}")
        self.peers = tuple(p for p in self.peers if p not in self.lost)
        self.hop += 1
        return out

    def push(self, frame: bytes, step: int) -> None:
        self._check()
        inbox = self.network.inbox
        if inbox is None or self.node != self.network.attach:
            raise ValueError(f"node {self.node} is not the evaluator's attach node")
        self.last_step = step
        frame = bytes(frame)
        self.counter.add(step, self.node, EVALUATOR, HEADER + len(frame))
        delivered = frame if self.network.mutate is None else self.network.mutate(self.node, EVALUATOR, self.hop, frame)
        if delivered is None:  # the mutator lost it
            return
        inbox.put(delivered)  # queues, counts `received`, calls `on_frame` here (never raises)

    def close(self, abort: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        reason = f"node {self.node} {'aborted' if abort else 'closed'}"
        inbox = self.network.inbox
        is_attach = self.node == self.network.attach and inbox is not None
        if is_attach and not abort and self.node not in self.network.dead:
            self.counter.add(self.last_step, self.node, EVALUATOR, HEADER)  # the end marker, as gloo
            inbox.put(EOS)  # type: ignore[union-attr]
        self.network.poison(self.node, reason, stream=abort)
