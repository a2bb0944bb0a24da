"""The in-process backend of `seedflood.core.flood.transport`: threads of one process, and the faults tests inject.

Owns `InMemoryNetwork`: it builds the wires (memorywires.Wires: one directed FIFO queue per edge,
plus the evaluator's `Inbox`), hands out one endpoint per node (memoryendpoint.MemoryTransport),
and injects faults (kill, cut, heal, crash mid-send, stall, revive, a frame `Mutator`) and
brand-new ids (`add`), which the wires
and endpoints then obey. Used by tests, the in-memory simulation and the benchmarks; it mirrors
GlooTransport's semantics and byte counting exactly (HEADER + frame, once, at the sender, at the
step the caller passes; the end marker at `last_step`), so figures from either backend agree.

Churn (`tolerate=True`, docs/churn-design.md, Failure detection): a peer failure does not raise; the endpoint drops
that peer (closing the edge both ways, as gloo closes a pair), records it in `lost`, and returns
the frames of the peers that answered. A killed peer is dropped at once; a stalled one
(`stall(node)`: its thread blocks in its next exchange until `unstall`) once it has been silent
for `timeout_s` (the wires play the per-edge heartbeat, memorywires.py).

Assumes: each endpoint is driven from one thread; all endpoints live in one process. Imports no
torch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

from seedflood.comm.memoryendpoint import MemoryTransport
from seedflood.comm.memorywires import Faults, Mutator, Wires
from seedflood.core.flood.transport import ByteCounter, Inbox

__all__ = ["InMemoryNetwork", "MemoryTransport", "Mutator"]


class InMemoryNetwork:
    """Transports between threads of one process, one directed FIFO queue per edge.

    Semantics mirror gloo: sends never wait, a receive waits for the peer's frame; a closed,
    aborted or killed node poisons its out-edges, so its neighbours raise TransportError at once
    (after any frames it did send), and a silent one makes them raise after `timeout_s`.
    Use endpoints as context managers so an exception in one node thread cascades instead of
    leaving the others waiting. Fault injection: `kill`, `cut`, `crash_in`, `stall`/`unstall`,
    `revive`, and `mutate` (every frame passes through it).
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
        self.faults = Faults(mutate=mutate)
        self.wires = Wires(neighbors, timeout_s, self.faults, attach=attach, tolerate=tolerate)
        self.neighbors = self.wires.neighbors
        self.dead = self.faults.dead  # node -> reason it was killed
        self._endpoints: dict[int, MemoryTransport] = {}
        self._lock = threading.Lock()

    def endpoint(self, node: int, counter: ByteCounter | None = None) -> MemoryTransport:
        if node not in self.neighbors:
            raise ValueError(f"node {node} is not in the network")
        if node in self._endpoints:
            raise ValueError(f"node {node} already has an endpoint")
        self._endpoints[node] = MemoryTransport(self.wires, node, counter or ByteCounter())
        return self._endpoints[node]

    def evaluator_inbox(self) -> Inbox:
        """The evaluator's queue; set `on_frame` on it to hear of each push (called in push)."""
        if self.wires.inbox is None:
            raise ValueError("network has no evaluator (pass attach=node)")
        return self.wires.inbox

    def counter(self) -> ByteCounter:
        """All endpoints' counts merged."""
        return ByteCounter.merged([e.counter for e in self._endpoints.values()])

    # -- fault injection ---------------------------------------------------------------------------
    def kill(self, node: int) -> None:
        """Crash `node`: its own calls and every receive from it raise from now on."""
        self.wires.kill(node)

    def cut(self, src: int, dst: int) -> None:
        """Fail the link src -> dst: dst's next receive from src raises; later frames are lost."""
        self.faults.cut.add((src, dst))
        self.wires.close_edge(src, dst, f"link {src} -> {dst} was cut")

    def heal(self, a: int, b: int) -> None:
        """A cut link a - b works again (both ways); its ends reconnect it by their heal
        negotiation (`MemoryTransport.heal`), as any dropped edge between live members."""
        self.faults.cut -= {(a, b), (b, a)}

    def crash_in(self, node: int, exchanges: int, reach: int) -> None:
        """Crash `node` inside its exchange `exchanges` from now (0 = the next): its frame of that
        exchange reaches only its first `reach` peers (in id order), then it dies."""
        self.faults.dying[node] = (exchanges, reach)

    def stall(self, node: int) -> None:
        """Freeze `node` (SIGSTOP): its next exchange blocks until `unstall`; its heartbeat stops."""
        self.faults.resumed[node] = threading.Event()
        self.faults.stalled[node] = time.monotonic()

    def unstall(self, node: int) -> None:
        """Let a stalled node go on (SIGCONT); its neighbours may have dropped it meanwhile."""
        self.faults.stalled.pop(node, None)
        if (event := self.faults.resumed.pop(node, None)) is not None:
            event.set()

    def revive(self, node: int) -> None:
        """Restart a killed node (a new incarnation, same id): fresh edges to every neighbour,
        none connected yet (`MemoryTransport.connect`); its next `endpoint` call makes a new one."""
        with self._lock:
            if node not in self.dead:
                raise ValueError(f"node {node} is alive")
            self.wires.renew(node)
            del self.dead[node]
            self.wires.closed.discard(node)
            self._endpoints.pop(node, None)
            self.faults.incarnations[node] = self.faults.incarnations.get(node, 0) + 1

    def add(self, node: int) -> None:
        """Start a brand-new id (open membership): no edges; it waits for a member to sponsor it
        (`MemoryTransport.newcomers`), and the join rule gives it its edges (`grow`)."""
        self.wires.add(node)

    def held_by(self, node: int) -> list[int]:
        """Live nodes whose endpoint still exchanges with `node` (a dead node's old edges: a
        restart before they are dropped would have them wait on the new incarnation's frames,
        where between processes the old edge is closed with the old process)."""
        with self._lock:
            return [p for p, e in self._endpoints.items() if p != node and p not in self.dead and node in e.peers]
