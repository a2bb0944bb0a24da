"""When a strict client applies each step: the schedule roles/strict.py runs and lockstep.py replays.

Owns `StepSchedule`, the arithmetic of a strict run's steps (docs/design.md, Processes and the
step loop). At local step t a client estimates, originates its messages, runs the hops of t and
applies every step through t − delay: after the hops without overlap; with overlap before it
originates (the hops of t then run during step t+1's estimates, which is overlap's extra step
in the delay). After the last local step, the drain hops without originating until every step
is applied; its lag is delay − overlap (the drain estimates nothing, so overlap's extra step is
not paid).

Assumes: `delay` as protocol.Protocol.delay (overlap's extra step included). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepSchedule:
    """A strict run's step schedule (see the module doc)."""

    steps: int  # the run's steps: 0 .. steps − 1
    delay: int  # step t applies through t − delay
    overlap: bool  # the hops of step t run during step t+1's estimates

    @property
    def last(self) -> int:
        return self.steps - 1

    @property
    def apply_first(self) -> bool:
        """Whether a local step applies before it originates (overlap) or after its hops."""
        return self.overlap

    def applies_through(self, t: int) -> int:
        """The newest step applied during local step t (negative: none yet)."""
        return t - self.delay

    @property
    def lag(self) -> int:
        """Local steps between a step and the hops that complete it, in the drain."""
        return self.delay - int(self.overlap)

    def drain_hop(self, applied: int, after: int) -> int:
        """In the drain, with every step <= applied applied and the hops of local step `after`
        run last: the local step whose hops complete the next step, but never past after + 1 (a
        run of fewer steps than its lag hops through every local step up to that one: skipping
        them would leave step 0 short of the hops it needs)."""
        return min(applied + 1 + self.lag, after + 1)

    def drained_through(self, t: int) -> int:
        """The newest step the hops of local step t complete in the drain (never past the last)."""
        return min(t - self.lag, self.last)
