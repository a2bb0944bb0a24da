"""How a churn client starts: the strategy it is handed, and a restarted one's sponsor handshake.

Owns `ChurnStrategy` (a `host.Strategy`: the flood a churn client needs — every neighbour, no
routes, conflicting copies held until a commit settles them — and its `churn.Churn`, over the
transport it hops on), chosen once where the process is put together (churnwiring.py, the
in-process simulation), and `sponsored_catch_up`: a restarted process's half of the sponsor
handshake, the one both the launched client and the simulation use (docs/churn-design.md,
Rejoin across processes).

May import: seedflood.core; roles' host, churn and rejoinproof.

Assumes: the transport handed over is the one the client hops on (`Churn` connects and drops
its edges there).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from seedflood.core.churn import prefix
from seedflood.core.churn.prefix import Have
from seedflood.core.flood.signing import Signing
from seedflood.core.flood.transport import ChurnTransport, EvaluatorFeed, TransportError
from seedflood.core.membership.growth import Growth
from seedflood.roles import rejoinproof
from seedflood.roles.churn import Churn
from seedflood.roles.strategy import Host

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChurnStrategy:
    """A churn client (`host.Strategy`): its `Churn` over `transport`, the same object the client
    hops on. `state_hash`: the state's hash, for audits (needed when the protocol audits).
    `attach`: the evaluator's first attach node. `evaluator`: where this client feeds the
    evaluator whenever it is the roster's attach node (`Churn.follow`; a launched client's
    EdgeTransport), None where no evaluator follows the clients (the in-process simulation).
    `incarnation`: this process's life of its node (its votes carry it; a rejoin checks it; 0
    takes whichever a catch-up admits). `growth`: the join rule of a run open to brand-new ids
    (churn.max_nodes) and graph repair (churn.repair), over a `transport.Growing` transport;
    None where neither is on."""

    transport: ChurnTransport
    state_hash: Callable[[], str] | None = None
    attach: int = 0
    evaluator: EvaluatorFeed | None = None
    incarnation: int = 0
    growth: Growth | None = None
    routed: ClassVar[bool] = False  # flood every neighbour: shortest-path routes break when a relay dies
    tolerates_conflicts: ClassVar[bool] = True  # conflicting copies are held until a commit settles them

    def mode(self, host: Host) -> Churn:
        return Churn(
            host,
            self.transport,
            state_hash=self.state_hash,
            attach=self.attach,
            evaluator=self.evaluator,
            incarnation=self.incarnation,
            growth=self.growth,
        )


def sponsored_catch_up(
    transport: ChurnTransport,
    wait_s: float,
    signing: Signing | None = None,
    new: bool = False,
    have: Have = prefix.NOTHING,
) -> bytes:
    """A restarted process's half of the sponsor handshake (docs/churn-design.md, Rejoin across
    processes): wait up to `wait_s` s for the neighbour that claims this incarnation (its
    `joining.boundary`), meet it, in a signed run answer its challenge with this node's key
    (`rejoinproof`), tell it the steps it holds already (`have`: a log server's prefix, checked;
    the sponsor then sends only the steps after it when its chain agrees), and take the catch-up
    it sends, for `Churn.rejoin` to replay.
    TransportError when no neighbour claims it, the meeting fails, the sponsor refuses the
    answer, or no catch-up comes. `new`: this process is a brand-new node id (launched, its
    first incarnation is 1; in process, 0)."""
    if transport.incarnation and not new:
        log.warning(
            "node %d: restarted as incarnation %d: waiting for a neighbour to sponsor the rejoin",
            transport.node,
            transport.incarnation,
        )
    else:  # a brand-new id (docs/churn-design.md, A new id joins)
        log.warning("node %d: a new node id: waiting for a member to sponsor its join", transport.node)
    sponsor = transport.sponsor(wait_s)
    if not transport.connect([sponsor], wait_s):
        raise TransportError(f"node {transport.node}: could not connect to its sponsor node {sponsor}")
    rejoinproof.answer(transport, signing, sponsor, wait_s)
    transport.send_blob(sponsor, have.to_bytes())
    blob = transport.recv_blob(sponsor, wait_s)
    rejoinproof.refused(blob, sponsor)
    return blob
