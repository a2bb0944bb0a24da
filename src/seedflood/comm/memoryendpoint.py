"""One node's endpoint of the in-process network (`memory.InMemoryNetwork`): the transport a client thread drives.

Owns `MemoryTransport`, a `transport.ChurnTransport`: exchanges (strict: a failed peer raises;
tolerant: it is dropped and recorded in `lost`), pushes to the evaluator's inbox, edge meetings
(`connect`), healing a down edge to a live member (`heal`, `restore`: the wires negotiate the
hop index, never blocking a hop), a rejoin's claim, sponsor and catch-up, a brand-new id's
sponsoring and edges (`newcomers`, `grow`: a `transport.Growing`), and its byte counting (HEADER + frame,
once, at the sender, at the step the caller passes; the end marker at `last_step`), which
mirrors GlooTransport's exactly.
The wires (memorywires.Wires) own the queues and the fault state; this module drives them.

Assumes: one endpoint per node, driven from one thread. Imports no torch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from seedflood.comm.memorywires import Wires
from seedflood.core.flood.transport import EOS, EVALUATOR, HEADER, ByteCounter, TransportError, check_addressed


class MemoryTransport:
    """One node's endpoint of an InMemoryNetwork (use from one thread)."""

    def __init__(self, wires: Wires, node: int, counter: ByteCounter) -> None:
        self.wires = wires
        self.faults = wires.faults
        self.node = node
        self.incarnation = self.faults.incarnations.get(node, 0)
        # a revived node starts unconnected: it connects its edges as its sponsor says
        self.neighbours = wires.neighbors[node]  # topology neighbours, connected or not
        self.peers = self.neighbours if not self.incarnation else ()
        self._revived_seen = {p: self.faults.incarnations.get(p, 0) for p in self.neighbours}
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
        if reason := self.faults.dead.get(self.node):
            raise TransportError(f"node {self.node}: {reason}")
        if self._closed:
            raise TransportError(f"node {self.node}: transport is closed")

    def revived(self) -> list[int]:
        """Neighbours restarted (a new incarnation) since the last call, not yet connected, over
        a link that is not cut (one across a cut is reported once the link heals: a sponsor the
        newcomer cannot reach would win the claim and end its life)."""
        out = []
        for p in self.neighbours:
            inc = self.faults.incarnations.get(p, 0)
            if inc > self._revived_seen[p] and p not in self.faults.dead and not self.wires.is_cut(self.node, p):
                self._revived_seen[p] = inc
                out.append(p)
        return out

    def connect(self, peers: Sequence[int], timeout_s: float | None = None) -> list[int]:
        """Connect to these neighbours, each only if it connects to this node within `timeout_s`
        (default: the network's timeout), as links.EdgeTransport's meetings; returns those
        connected now, exchanging from the next hop. A stalled node meets nobody until resumed."""
        self._check()
        if bad := [p for p in peers if p not in self.neighbours]:
            raise ValueError(f"node {self.node}: {bad} are not topology neighbours")
        if (resumed := self.faults.resumed.get(self.node)) is not None:
            resumed.wait()
            self._check()
        todo = sorted(set(peers) - set(self.peers))
        timeout = self.wires.timeout_s if timeout_s is None else timeout_s
        added = self.wires.meet(self.node, todo, timeout) if todo else []
        self.peers = tuple(sorted((*self.peers, *added)))
        return added

    # -- open membership (docs/churn-design.md, A new id joins) -----------------------------------
    def newcomers(self) -> list[int]:
        """Brand-new ids waiting for a sponsor that this node can reach (`Wires.add`)."""
        w = self.wires
        return sorted(n for n in w.knocking if n not in self.faults.dead and not w.is_cut(self.node, n))

    def grow(self, peers: Sequence[int]) -> None:
        """Make `peers` neighbours of this node: the edges the join rule gives a new id (both
        ends call it; `connect` or a heal brings an edge up)."""
        for p in peers:
            if p == self.node or p in self.neighbours:
                continue
            self.wires.link(self.node, p)
            self.neighbours = tuple(sorted((*self.neighbours, p)))
            self._revived_seen[p] = self.faults.incarnations.get(p, 0)

    # -- healing (docs/churn-design.md, Healed edges) -------------------------------------------
    def healable(self, peer: int, incarnation: int | None) -> bool:
        """`peer` still runs as `incarnation` (None: its first life) and may heal an edge."""
        return self.wires.healable(self.node, peer, incarnation)

    def heal(self, want: Mapping[int, int | None], hop: int) -> dict[int, int]:
        """Right before exchange `hop`: ask to heal the down edges to `want` (peer -> incarnation
        it must run as); returns peer -> the exchange index both ends agreed to connect at."""
        self._check()
        return self.wires.heal(self.node, {p: i for p, i in want.items() if p not in self.peers}, hop)

    def restore(self, peer: int) -> None:
        """Connect a healed edge (right before the agreed exchange): it exchanges from now."""
        if peer not in self.peers:
            self.peers = tuple(sorted((*self.peers, peer)))
            self.lost.pop(peer, None)
            self.wires.healed(self.node, peer)

    def claim(self, node: int) -> int | None:
        """Become revived `node`'s sponsor (only one neighbour wins); its incarnation, or None."""
        return self.faults.incarnations.get(node, 0) if self.wires.claim(self.node, node) else None

    def send_blob(self, peer: int, data: bytes) -> None:
        self.wires.send_blob(peer, data)

    def recv_blob(self, peer: int | None, timeout_s: float) -> bytes:
        """The catch-up payload a sponsor sent (from whichever neighbour claimed us: `peer` unused)."""
        return self.wires.recv_blob(self.node, timeout_s)

    def sponsor(self, timeout_s: float) -> int:
        """The neighbour that claimed this revived node (waits up to `timeout_s` for one); a
        brand-new id takes its sponsor as its first neighbour."""
        sponsor = self.wires.sponsor_of(self.node, timeout_s)
        self.grow([sponsor])
        return sponsor

    def drop(self, peer: int, reason: str) -> None:
        if peer in self.peers:
            self.lost[peer] = reason
            self.wires.close_edge(self.node, peer, f"node {self.node} dropped node {peer}: {reason}")
            self.peers = tuple(p for p in self.peers if p != peer)

    def part(self, peer: int) -> None:
        """Close the edge to `peer` both ends agreed to close before this exchange (a graceful
        leave): no lost peer; the queue fails only receives nobody makes any more."""
        if peer in self.peers:
            self.wires.close_edge(self.node, peer, f"node {self.node} parted from node {peer}")
            self.peers = tuple(p for p in self.peers if p != peer)

    def take_lost(self) -> dict[int, str]:
        """Peers dropped since the last call (tolerant mode), with the reason."""
        lost, self.lost = self.lost, {}
        return lost

    def exchange(self, frames: Mapping[int, bytes], step: int) -> dict[int, bytes]:
        self._check()
        if self.wires.tolerate:
            return self._exchange_tolerant(frames, step)
        check_addressed(self.node, self.peers, frames)
        self.last_step = step
        for p in self.peers:
            frame = bytes(frames.get(p, b""))
            self.counter.add(step, self.node, p, HEADER + len(frame))
            self.wires.send(self.node, p, self.hop, frame)
        deadline = time.monotonic() + self.wires.timeout_s
        out = {p: self.wires.recv(p, self.node, deadline) for p in self.peers}
        self.hop += 1
        return out

    def _exchange_tolerant(self, frames: Mapping[int, bytes], step: int) -> dict[int, bytes]:
        """One hop with the peers still connected; a failed one is dropped, not raised."""
        net = self.wires
        if (resumed := self.faults.resumed.get(self.node)) is not None:
            resumed.wait()  # stalled: frozen here until unstall
            self._check()
        self.last_step = step
        reach = self.faults.reach(self.node, len(self.peers))
        for i, p in enumerate(self.peers):
            frame = bytes(frames.get(p, b""))
            self.counter.add(step, self.node, p, HEADER + len(frame))
            if i < reach:
                net.send(self.node, p, self.hop, frame)
        if reach < len(self.peers):
            del self.faults.dying[self.node]
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
        inbox = self.wires.inbox
        if inbox is None or self.node != self.wires.attach:
            raise ValueError(f"node {self.node} is not the evaluator's attach node")
        self.last_step = step
        frame = bytes(frame)
        self.counter.add(step, self.node, EVALUATOR, HEADER + len(frame))
        if (delivered := self.faults.deliver(self.node, EVALUATOR, self.hop, frame)) is None:  # the mutator lost it
            return
        inbox.put(delivered)  # queues, counts `received`, calls `on_frame` here (never raises)

    def close(self, abort: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        self.wires.closed.add(self.node)
        reason = f"node {self.node} {'aborted' if abort else 'closed'}"
        inbox = self.wires.inbox
        is_attach = self.node == self.wires.attach and inbox is not None
        if is_attach and not abort and self.node not in self.faults.dead:
            self.counter.add(self.last_step, self.node, EVALUATOR, HEADER)  # the end marker, as gloo
            inbox.put(EOS)  # type: ignore[union-attr]
        self.wires.poison(self.node, reason, stream=abort)
