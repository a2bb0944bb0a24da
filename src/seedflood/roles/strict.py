"""The strict step strategy: every step complete after its hops (docs/design.md, Processes and the step loop).

Owns: when a strict client applies each step — step t applies t − delay, where delay =
⌈diameter / hops⌉ − 1 (0 with full flooding), so every client applies every step at the same
local step and all hold identical bits after every step (bounded staleness); the last `delay`
steps are applied by `drain`, which hops without originating — and the overlap of hops with the
next estimate. `STRICT` hands it to a client (`host.Strategy`).

With `protocol.overlap` the hops of step t run on a background thread (`Hops`) while step t+1 is
estimated, so a step costs about max(compute, communication) instead of their sum. Step t is then:
estimate(t) while hops(t−1) run → join them (their error is raised here) → apply t − delay →
originate t → start hops(t). The estimates of step t cannot see what hops(t−1) complete, which is
the extra step in `protocol.delay` (D + 1): every state change happens in the same order as in a
plain client with delay D + 1, so the bits are exactly that client's. The flood and the transport
are used by one thread at a time: the hop thread between its start and the join, the main thread
(applies, listeners, pushes to the evaluator) otherwise; the join is the hand-over.

Assumes: a step incomplete after its hops is an error (a failed peer or a wrong diameter); the
transport bounds each exchange by its own timeout (so a hop thread always ends).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import ClassVar

from seedflood.core.flood.flooding import FloodError
from seedflood.core.flood.schedule import StepSchedule
from seedflood.core.flood.transport import TransportError
from seedflood.core.membership.roster import Change
from seedflood.roles.strategy import Host, Records

log = logging.getLogger(__name__)


class StrictStrategy:
    """A strict client (`host.Strategy`): its `Strict`; `STRICT` is the one instance."""

    routed: ClassVar[bool] = True  # every message arrives at the same hop either way; routes send less
    tolerates_conflicts: ClassVar[bool] = False  # two copies of one message that differ are an error

    def mode(self, host: Host) -> Strict:
        return Strict(host)


STRICT = StrictStrategy()
"""What a client is handed unless it runs under churn."""


class Strict:
    """A strict client's schedule (`host.Mode`)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        p = host.protocol
        self.schedule = StepSchedule(p.steps, p.delay, p.overlap)
        self.inflight: Hops | None = None  # overlap: the hops of step next_step − 1, running

    @property
    def changes(self) -> Mapping[int, Change]:
        return {}

    def resume(self, records: Records, cut: int, changes: Mapping[int, Change]) -> None:
        pass  # the client restores the flood and applier; nothing of this strategy's to restore

    def step(self, t: int) -> None:
        h = self.host
        if not self.schedule.apply_first:
            own = h.estimate(t)
            h.flood.originate(own)
            h.hops(t)
            self.apply_through(self.schedule.applies_through(t))
        else:
            try:
                own = h.estimate(t)  # hops(t − 1) run meanwhile
            except BaseException:
                self.settle()  # hand the transport back before the caller closes it
                raise
            self.join()
            self.apply_through(self.schedule.applies_through(t))
            h.flood.originate(own)
            self.inflight = Hops(h, t)
        h.next_step = t + 1

    def drain(self) -> None:
        """After the last step: hop until every step is applied (only with delayed flooding or
        overlap), on the schedule's drain (core/flood/schedule.py: its lag is delay − overlap)."""
        h, sched = self.host, self.schedule
        if self.inflight is not None:
            t = self.inflight.step
            self.join()
            self.apply_through(sched.drained_through(t))
        t = sched.last  # the hops of every local step through the last have run
        while h.applier.last_step < sched.last:
            t = sched.drain_hop(h.applier.last_step, t)
            h.hops(t)
            self.apply_through(sched.drained_through(t))

    def apply_through(self, upto: int, t: int | None = None) -> None:
        """Apply every step <= upto; each must be complete (else the topology/hops are wrong)."""
        h = self.host
        while h.applier.last_step < upto:
            s = h.applier.last_step + 1
            if not h.flood.is_complete(s):
                forged = h.flood.stats.forged
                why = (
                    f"{forged} items from neighbours were dropped as forged (their signatures did not verify)"
                    if forged
                    else "a peer failed, a forgery was dropped on its way here, or the diameter is wrong"
                    if h.flood.signing is not None
                    else "a peer failed or the diameter is wrong"
                )
                raise FloodError(
                    f"node {h.node}: step {s} incomplete after its hops (missing {h.flood.missing(s)[:4]}): {why}"
                )
            msgs = h.flood.pop_step(s)
            h.applier.apply(s, msgs)
            if s >= h.logged:
                for listener in h.listeners:
                    listener(s, msgs)

    def poll(self) -> None:
        """With overlap, a failure of the hop thread is raised before each forward, so it
        surfaces within one forward, not one step."""
        if self.inflight is not None and self.inflight.done():
            self.join()

    def join(self) -> None:
        """Wait for the hops in flight (if any) and raise their error in this thread."""
        hops, self.inflight = self.inflight, None
        if hops is not None:
            hops.join(self.host.hop_timeout_s)

    def settle(self) -> None:
        """On an error of the main thread: let the hops in flight end (bounded) and drop their
        own error, so the caller closes a transport no other thread is using."""
        try:
            self.join()
        except Exception as e:  # the main thread's error is the one to report
            log.debug("node %d: hops in flight also failed: %s", self.host.node, e)


class Hops:
    """The hops of one step on a daemon thread (overlap). A daemon, so a hop stuck in a broken
    transport can never keep the process alive; the transport's timeout ends it anyway."""

    def __init__(self, host: Host, step: int) -> None:
        self.host = host
        self.step = step
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"seedflood-hops-{host.node}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.host.hops(self.step)
        except BaseException as e:  # raised again by join() in the main thread
            self.error = e

    def done(self) -> bool:
        return not self.thread.is_alive()

    def join(self, timeout: float | None) -> None:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TransportError(
                f"node {self.host.node}: the hops of step {self.step} did not finish within {timeout} s"
            )
        if self.error is not None:
            raise self.error
