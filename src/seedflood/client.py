"""The client role: the step loop of DESIGN.md §2.

Owns: one client's progress through steps — estimate, originate, hops, apply complete steps in
canonical order — and the schedule of when each step is applied. It is handed its collaborators
(a transport, a direction family, a loss) and knows nothing about processes or models beyond them.

Step t at every client:
1. for k in 0..K-1: seed = derive(run_seed, node, t, k); scalar = two-point estimate on batch(t);
2. originate the K messages; run `hops` hops (encode outbox → exchange → decode → receive);
3. apply step t − delay, where delay = ⌈diameter / hops⌉ − 1 (0 with full flooding). Every
   client applies every step at the same local step, so with delayed flooding too all clients hold
   identical bits after every step (bounded staleness); the last `delay` steps are applied by
   `drain()`, which runs hops without originating.

Assumes: every client of the run uses the same config; `loss_at(step)` evaluates the current model
(including any perturbation context) on this client's batch of `step`, a pure function of it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

from seedflood import message, rng, zo
from seedflood.config import Config
from seedflood.directions import Direction
from seedflood.flooding import Flood, FloodError
from seedflood.message import Limits, Message
from seedflood.replay import Applier

log = logging.getLogger(__name__)

StepListener = Callable[[int, list[Message]], None]


def hops_and_delay(cfg: Config, diameter: int) -> tuple[int, int]:
    """Hops per step (0 in the config = the diameter) and the application delay in steps."""
    hops = cfg.flood.hops_per_step or max(1, diameter)
    delay = max(0, math.ceil(diameter / hops) - 1)
    return hops, delay


class Client:
    def __init__(
        self,
        node: int,
        peers: Sequence[int],
        n_clients: int,
        diameter: int,
        cfg: Config,
        direction: Direction,
        loss_at: Callable[[int], float],
        transport,  # seedflood.transport.Transport: exchange(frames) -> frames
    ) -> None:
        self.node = node
        self.cfg = cfg
        self.direction = direction
        self.loss_at = loss_at
        self.transport = transport
        self.hops, self.delay = hops_and_delay(cfg, diameter)
        self.flood = Flood(node, peers, range(n_clients), cfg.zo.perturbations)
        self.applier = Applier(direction, cfg.zo, cfg.run.steps, n_clients)
        self.n_clients = n_clients
        self.listeners: list[StepListener] = []
        if cfg.flood.step_window <= self.delay:
            raise ValueError(f"flood.step_window must exceed the flooding delay {self.delay}")

    # -- resume --------------------------------------------------------------------------------
    def resume_at(self, next_step: int) -> None:
        """The canonical state already holds steps < next_step (restored by the caller)."""
        self.flood.applied_through = next_step - 1
        self.applier.last_step = next_step - 1

    # -- the loop --------------------------------------------------------------------------------
    def run(self, start: int = 0, stop: int | None = None) -> None:
        stop = self.cfg.run.steps if stop is None else stop
        for t in range(start, stop):
            self.step(t)
        if stop == self.cfg.run.steps:
            self.drain()

    def step(self, t: int) -> None:
        self.transport.counter.step = t
        own = []
        for k in range(self.cfg.zo.perturbations):
            seed = rng.derive(self.cfg.run.seed, self.node, t, k)
            scalar = zo.two_point(lambda: self.loss_at(t), self.direction, seed, t, self.cfg.zo.eps)
            zo.check_scalar(scalar, self.cfg.flood.max_scalar, t)
            own.append(Message.make(self.node, t, seed, scalar, k))
        self.flood.originate(own)
        for _ in range(self.hops):
            self.hop(t)
        self.apply_through(t - self.delay)

    def drain(self) -> None:
        """After the last step: hop until every step is applied (only with delayed flooding)."""
        last = self.cfg.run.steps - 1
        for t in range(self.cfg.run.steps, self.cfg.run.steps + self.delay):
            self.transport.counter.step = t
            for _ in range(self.hops):
                self.hop(t)
            self.apply_through(min(t - self.delay, last))

    def hop(self, t: int) -> None:
        frames = {p: message.encode(msgs) for p, msgs in self.flood.outbox().items()}
        incoming = self.transport.exchange(frames)
        limits = self.limits(t)
        for peer in sorted(incoming):
            try:
                msgs = message.decode(incoming[peer], limits)
            except message.FrameError as e:
                raise message.FrameError(f"node {self.node}: bad frame from node {peer} at step {t}: {e}") from None
            self.flood.receive(peer, msgs)

    def limits(self, t: int) -> Limits:
        window = self.cfg.flood.step_window
        run_seed = self.cfg.run.seed
        return Limits(
            n_origins=self.n_clients,
            min_step=max(0, t - window),
            max_step=t + window,
            max_k=self.cfg.zo.perturbations,
            max_scalar=self.cfg.flood.max_scalar,
            seed_of=lambda o, s, k: rng.derive(run_seed, o, s, k),
        )

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
            for listener in self.listeners:
                listener(s, msgs)
