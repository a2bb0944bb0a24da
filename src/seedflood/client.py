"""The client role: the step loop of docs/design.md §2.

Owns: one client's progress through steps — estimate, originate, hops, apply complete steps in
canonical order — and the schedule of when each step is applied. It is handed its collaborators
(the run's `Protocol`, a transport, a direction family, a loss) and knows nothing about
processes or models beyond them.

Step t at every client:
1. for k in 0..K-1: seed = protocol.seed(node, t, k); scalar = two-point estimate on batch(t);
2. originate the K messages; run `hops` hops (encode outbox → exchange → decode → receive);
3. apply step t − delay, where delay = ⌈diameter / hops⌉ − 1 (0 with full flooding). Every
   client applies every step at the same local step, so with delayed flooding too all clients hold
   identical bits after every step (bounded staleness); the last `delay` steps are applied by
   `drain()`, which runs hops without originating.

Resume at step L from a log of L complete steps reproduces the state the uninterrupted client had
when it began step L: steps < L − delay applied, steps L − delay .. L − 1 held complete but not
yet applied (`resume`). Step L is then estimated on the same bits as in the uninterrupted run.

Assumes: every client of the run shares one `Protocol`; `loss_at(step)` evaluates the current
model (including any perturbation context) on this client's batch of `step`, a pure function of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from seedflood import message, zo
from seedflood.directions import Direction
from seedflood.flooding import Flood, FloodError
from seedflood.message import Message
from seedflood.protocol import Protocol
from seedflood.replay import Applier
from seedflood.transport import Transport

log = logging.getLogger(__name__)

StepListener = Callable[[int, list[Message]], None]
Records = Sequence[tuple[int, Sequence[Message]]]
"""Complete steps (step, messages) in order from step 0, as a log holds them."""


class Client:
    def __init__(
        self,
        node: int,
        peers: Sequence[int],
        protocol: Protocol,
        direction: Direction,
        loss_at: Callable[[int], float],
        transport: Transport,
    ) -> None:
        self.node = node
        self.protocol = protocol
        self.direction = direction
        self.loss_at = loss_at
        self.transport = transport
        self.flood = Flood(node, peers, range(protocol.n_origins), protocol.perturbations)
        self.applier = Applier(direction, protocol)
        self.listeners: list[StepListener] = []
        """Called with (step, messages) for each step applied beyond the resumed log."""
        self.next_step = 0
        self.logged = 0  # steps that were already in the log this client resumed from

    # -- resume --------------------------------------------------------------------------------
    def resume(self, records: Records) -> None:
        """Catch up from the first L logged steps, as the uninterrupted client stood before step
        L: apply steps < L − delay (O(messages) for subcge), hold the rest complete in the flood.
        Listeners are not called for any of the L logged steps, including those applied later."""
        if self.next_step or self.applier.last_step >= 0:
            raise FloodError(f"node {self.node}: resume must come before the first step")
        cut = max(0, len(records) - self.protocol.delay)
        self.applier.apply_all(records[:cut])
        self.flood.applied_through = cut - 1
        for _, msgs in records[cut:]:
            self.flood.restore(msgs)
        self.next_step = self.logged = len(records)

    # -- the loop --------------------------------------------------------------------------------
    def run(self, stop: int | None = None) -> None:
        """Steps next_step..stop-1 (default: to the end of the run, then drain)."""
        stop = self.protocol.steps if stop is None else stop
        while self.next_step < stop:
            self.step(self.next_step)
        if stop == self.protocol.steps:
            self.drain()

    def step(self, t: int) -> None:
        own = []
        for k in range(self.protocol.perturbations):
            seed = self.protocol.seed(self.node, t, k)
            scalar = zo.two_point(lambda: self.loss_at(t), self.direction, seed, t, self.protocol.eps)
            zo.check_scalar(scalar, self.protocol.max_scalar, t)
            own.append(Message.make(self.node, t, seed, scalar, k))
        self.flood.originate(own)
        for _ in range(self.protocol.hops):
            self.hop(t)
        self.apply_through(t - self.protocol.delay)
        self.next_step = t + 1

    def drain(self) -> None:
        """After the last step: hop until every step is applied (only with delayed flooding)."""
        last = self.protocol.steps - 1
        while self.applier.last_step < last:
            t = self.applier.last_step + 1 + self.protocol.delay  # local step that applies the next one
            for _ in range(self.protocol.hops):
                self.hop(t)
            self.apply_through(min(t - self.protocol.delay, last))

    def hop(self, t: int) -> None:
        frames = {p: message.encode(msgs) for p, msgs in self.flood.outbox().items()}
        incoming = self.transport.exchange(frames, t)
        limits = self.protocol.wire_limits(t)
        for peer in sorted(incoming):
            try:
                msgs = message.decode(incoming[peer], limits)
            except message.FrameError as e:
                raise message.FrameError(f"node {self.node}: bad frame from node {peer} at step {t}: {e}") from None
            self.flood.receive(peer, msgs)

    def apply_through(self, upto: int) -> None:
        """Apply every step <= upto; each must be complete (else the topology/hops are wrong)."""
        while self.applier.last_step < upto:
            s = self.applier.last_step + 1
            if not self.flood.is_complete(s):
                raise FloodError(
                    f"node {self.node}: step {s} incomplete after its hops (missing "
                    f"{self.flood.missing(s)[:4]}): a peer failed or the diameter is wrong"
                )
            msgs = self.flood.pop_step(s)
            self.applier.apply(s, msgs)
            if s >= self.logged:
                for listener in self.listeners:
                    listener(s, msgs)
