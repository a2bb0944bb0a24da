"""What a client and its step strategy see of each other (docs/design.md, Processes and the step loop; docs/churn-design.md).

Owns: the interfaces between `client.Client` (the step loop common to every run: estimate,
originate, hop, apply in canonical order) and the strategy it is handed, chosen once where the
process is put together — `strict.Strict` (every step complete after its hops; optional
overlap) or `churn.Churn` (apply only committed steps; rejoin, sponsoring, agreement) — and the
record types they share. `Strategy` is what the client is handed (the flood the strategy needs,
and the strategy itself, made for the client); `Host` is what a strategy may use of its client;
`Mode` is what the client calls on its strategy. All are structural, so neither strategy module
imports the client (no cycle).

Assumes: one thread uses a client and its strategy at a time (the overlap hop thread is the only
other thread, and it only runs `Host.hops` between its start and the join).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from seedflood.core.flood.flooding import Flood
from seedflood.core.flood.protocol import Protocol as RunProtocol
from seedflood.core.flood.transport import Transport
from seedflood.core.membership.roster import Change
from seedflood.core.wire.message import Message
from seedflood.core.zo.replay import Applier

StepListener = Callable[[int, list[Message]], None]
Records = Sequence[tuple[int, Sequence[Message]]]
"""Complete steps (step, messages) in order from step 0, as a log holds them."""


class Host(Protocol):
    """The client as its strategy sees it (`client.Client` implements it)."""

    node: int
    protocol: RunProtocol
    transport: Transport
    flood: Flood
    applier: Applier
    listeners: list[StepListener]
    next_step: int  # the next local step to run
    logged: int  # steps that were already in the log (or catch-up) this client started from
    hops_run: int  # the hop clock: the index of the next exchange
    hop_timeout_s: float | None
    meet_timeout_s: float | None  # how long a rejoining neighbour's edge waits for its other end

    def estimate(self, t: int) -> list[Message]: ...

    def hop(self, t: int) -> None: ...

    def hops(self, t: int) -> None: ...

    def exchange(self, t: int) -> dict[int, bytes]:
        """One exchange of the flood's outbox (the hop clock moves on): the frames received."""
        ...

    def received(self, items: Sequence[object], t: int) -> None:
        """New items a frame of local step t brought (an auditor recomputes their scalars)."""
        ...


class Strategy(Protocol):
    """How a client applies steps, handed to it once: `strict.STRICT`, `churnstart.ChurnStrategy`."""

    @property
    def routed(self) -> bool:
        """Forward each origin's messages along shortest-path routes (False: to every neighbour)."""
        ...

    @property
    def tolerates_conflicts(self) -> bool:
        """The flood holds conflicting copies of a message until a commit settles them."""
        ...

    def mode(self, host: Host) -> Mode:
        """The strategy of `host`, made once its flood exists."""
        ...


class Mode(Protocol):
    """A step strategy, chosen once per client: what differs between a strict and a churn run."""

    @property
    def changes(self) -> Mapping[int, Change]:
        """Committed roster changes (step -> Change); none in a strict run."""
        ...

    def resume(self, records: Records, cut: int, changes: Mapping[int, Change]) -> None:
        """Before the client restores the first L logged steps (steps < cut get applied)."""

    def step(self, t: int) -> None:
        """Local step t: estimate, originate, hop, apply what is due; then next_step = t + 1."""

    def apply_through(self, upto: int, t: int | None) -> None:
        """Apply every step <= upto (`t`: the local step the client is at, churn)."""

    def drain(self) -> None:
        """After the last step: hop until every step is applied."""

    def poll(self) -> None:
        """Between forwards of an estimate: surface a failure of work running meanwhile."""

    def join(self) -> None:
        """Wait for work in flight (if any) and raise its error in this thread."""
