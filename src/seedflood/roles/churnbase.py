"""The state `churn.Churn` and its two halves (`churnjoin.Joining`, `churnedges.EdgeWork`) share.

Owns: the committed roster as every half reads it (`roster`), the topology neighbours a churn
transport may connect (`_neighbours`), and the declarations of the attributes `Churn.__init__`
sets that both halves use (for the type checker; the values are Churn's).

Assumes: `Churn.__init__` sets every attribute declared here.
"""

from __future__ import annotations

from seedflood.core.churn.agreement import Agreement
from seedflood.core.flood.transport import ChurnTransport
from seedflood.core.membership.growth import Growth
from seedflood.core.membership.roster import Roster
from seedflood.core.wire.message import Message
from seedflood.roles.churnhealth import Health
from seedflood.roles.strategy import Host


class ChurnBase:
    """What every half of a churn client reads: its host, transport, agreement and join rule."""

    host: Host
    transport: ChurnTransport
    agreement: Agreement
    growth: Growth | None
    history: list[tuple[int, list[Message]]]  # every applied step from 0: (step, its committed messages)
    joined_at: int
    leaving: bool
    health: Health  # counts for the sinks (churnhealth.py)
    _expected: dict[int, int]  # a new id this member grew its end to, not yet admitted -> its JOIN step
    _noted: set[int]  # those whose JOIN step is the note's (else the knock's guess)

    @property
    def roster(self) -> Roster:
        """The committed roster: members of the next step to commit; `roster.changes` holds every
        committed change (step -> Change)."""
        return self.agreement.roster

    def _neighbours(self) -> tuple[int, ...]:
        """Topology neighbours, connected or not (what a churn transport may connect)."""
        return self.transport.neighbours
