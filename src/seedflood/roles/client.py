"""The client role: the step loop of docs/design.md, Processes and the step loop.

Owns: one client's progress through steps — estimate, originate, hops, apply complete steps in
canonical order — and what every run shares of it: the flood, the applier, the hop (encode
outbox → exchange → decode → receive) and its clock, resume from a log. When each step is applied
is the strategy it is handed (`host.Strategy`), chosen once where the process is put together:
`strict.STRICT` (step t applies t − delay, complete after its hops; optional overlap of hops
with the next estimate) or a `churnstart.ChurnStrategy` (`protocol.settle` > 0,
docs/churn-design.md: apply only committed steps; rejoin, sponsoring, agreement, audits). It is
handed its collaborators (the run's `Protocol`, a transport, a direction family, a loss, the
strategy) and knows nothing about processes or models beyond them.

Step t at every client:
1. for k in 0..K-1: seed = protocol.seed(node, t, k); scalar = two-point estimate on batch(t)
   (none on a step zo.stride says this node does not originate: it still hops and applies);
2. originate the K messages; run `hops` hops;
3. apply what the strategy says is due; the last steps are applied by `drain()`, which runs hops
   without originating.

Resume at step L from a log of L complete steps reproduces the state the uninterrupted client had
when it began step L: steps < L − delay applied, steps L − delay .. L − 1 held complete but not
yet applied (`resume`). Step L is then estimated on the same bits as in the uninterrupted run.

Assumes: every client of the run shares one `Protocol`; `loss_at(step)` evaluates the current
model (including any perturbation context) on this client's batch of `step`, a pure function of it;
the transport bounds each exchange by its own timeout (so a hop thread always ends).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from seedflood.core.flood.flooding import Flood, FloodError
from seedflood.core.flood.hop import outbox_frames, read_frame
from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.signing import Signing
from seedflood.core.flood.transport import Transport
from seedflood.core.membership.roster import Change
from seedflood.core.topology.graph import Topology
from seedflood.core.wire.message import FrameError, Limits, Message
from seedflood.core.zo import estimate as zo
from seedflood.core.zo.directions import Direction
from seedflood.core.zo.replay import Applier
from seedflood.roles.audit import Auditor
from seedflood.roles.churn import Churn
from seedflood.roles.strategy import Mode, Records, StepListener, Strategy
from seedflood.roles.strict import STRICT


class Client:
    def __init__(
        self,
        node: int,
        peers: Sequence[int],
        protocol: Protocol,
        direction: Direction,
        loss_at: Callable[[int], float],
        transport: Transport,
        *,
        routes: Mapping[int, Sequence[int]] | None = None,
        hop_timeout_s: float | None = None,
        meet_timeout_s: float | None = None,
        strategy: Strategy = STRICT,
        signing: Signing | None = None,
        loss_of: Callable[[int, int], float] | None = None,
    ) -> None:
        """`routes` (graph.Topology.routes(node)): per origin, the neighbours to forward its
        messages to; None (or a strategy that is not `routed`) = every neighbour. Either way
        every message arrives at the same hop.
        `hop_timeout_s` (overlap only): how long the main thread waits for one step's hops
        beyond its own work before it gives up on them; None = as long as the transport takes
        (each exchange is bounded by the transport's timeout). Give hops × transport timeout.
        `meet_timeout_s` (churn): how long a rejoining neighbour's edge waits for its other end
        (`edges.link`); None = hop_timeout_s. Give the transport's timeout: both ends reach the hop
        within one exchange of each other, and a longer wait delays this client's frames to
        peers that drop it after Protocol.LATE_FACTOR timeouts.
        `strategy`: when each step is applied (`strict.STRICT`, or a `churnstart.ChurnStrategy`
        holding what a churn client needs besides: its ChurnTransport, state hash, attach node,
        evaluator feed and incarnation).
        `loss_of(origin, step)`: any origin's loss on its batch of `step` (what `loss_at` is for
        this node); with `protocol.audit` > 0 the client recomputes peers' scalars with it
        (roles/audit.py). None: no audits."""
        self.node = node
        self.protocol = protocol
        self.direction = direction
        self.loss_at = loss_at
        self.transport = transport
        self.flood = Flood(
            node,
            peers,
            range(protocol.n_origins),
            protocol.perturbations,
            routes if strategy.routed else None,
            note_horizon=protocol.step_window,
            tolerate_conflicts=strategy.tolerates_conflicts,
            signing=signing,
            due=protocol.due,
        )
        self.applier = Applier(direction, protocol)
        self.listeners: list[StepListener] = []
        """Called with (step, messages) for each step applied beyond the resumed log."""
        self.next_step = 0
        self.logged = 0  # steps that were already in the log this client resumed from
        # the hop clock: the index of the next exchange, shared by every client of a connected
        # run (a newcomer starts at its sponsor's); the agreement's clock and `edges.link`'s schedule
        self.hops_run = 0
        self.received_bytes = 0  # bytes of hop frames received (payloads): the live status record's
        self.received_from: dict[int, int] = {}  # the same per peer; replaced whole, read by another thread
        self.hop_timeout_s = hop_timeout_s
        self._limits = (0, protocol, protocol.wire_limits(0))  # (step, protocol, its wire limits): `_wire_limits`
        self.meet_timeout_s = hop_timeout_s if meet_timeout_s is None else meet_timeout_s
        self.mode: Mode = strategy.mode(self)
        """When each step is applied: the one place a strict and a churn client part ways."""
        self.audit: Auditor | None = None
        """Verification by recomputation (trust.audit > 0 and `loss_of` given)."""
        if protocol.audit and loss_of is not None:
            churn = isinstance(self.mode, Churn)
            self.audit = Auditor(
                node,
                protocol,
                direction,
                loss_of,
                self.flood,
                self.applier,
                churn=churn,
                targets=(lambda: self.churn.roster.members) if churn else (lambda: range(protocol.n_origins)),
                signing=signing,
                liars=self.churn.voter.liars if churn else None,  # its evidence is the voter's
            )

    @property
    def churn(self) -> Churn:
        """The churn strategy (its roster, history, rejoin); a churn run only."""
        if not isinstance(self.mode, Churn):
            raise TypeError(f"node {self.node}: not a churn run")
        return self.mode

    @classmethod
    def in_topology(
        cls,
        top: Topology,
        node: int,
        protocol: Protocol,
        direction: Direction,
        loss_at: Callable[[int], float],
        transport: Transport,
        timeout_s: float,
        strategy: Strategy = STRICT,
        signing: Signing | None = None,
        loss_of: Callable[[int, int], float] | None = None,
    ) -> Client:
        """Node `node` of `top` as every runtime builds it: the neighbours its transport is
        connected to (a restarted churn node or a brand-new id: none yet), shortest-path routes, and a hop thread
        given `timeout_s` (the transport's) per exchange of a step, plus one; a rejoining
        neighbour's edges wait `timeout_s` for their other end."""
        return cls(
            node,
            transport.peers,
            protocol,
            direction,
            loss_at,
            transport,
            routes=top.routes(node) if node in top.nodes else None,  # a brand-new id: churn floods
            hop_timeout_s=timeout_s * (protocol.hops + 1),
            meet_timeout_s=timeout_s,
            strategy=strategy,
            signing=signing,
            loss_of=loss_of,
        )

    # -- resume --------------------------------------------------------------------------------
    def resume(self, records: Records, changes: Mapping[int, Change] | None = None) -> None:
        """Catch up from the first L logged steps, as the uninterrupted client stood before step
        L: apply steps < L − delay (O(messages) for subcge), hold the rest complete in the flood.
        Listeners are not called for any of the L logged steps, including those applied later.
        `changes`: the log's roster changes (step -> Change); logged steps keep their decision."""
        if self.next_step or self.applier.last_step >= 0:
            raise FloodError(f"node {self.node}: resume must come before the first step")
        cut = max(0, len(records) - self.protocol.delay)
        self.mode.resume(records, cut, dict(changes or {}))
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
        else:
            self.mode.join()  # a run stopped early (a kill in the tests): nothing may keep hopping

    def step(self, t: int) -> None:
        self.mode.step(t)

    def drain(self) -> None:
        """After the last step: hop until every step is applied."""
        self.mode.drain()

    def apply_through(self, upto: int, t: int | None = None) -> None:
        """Apply every step <= upto, as the strategy applies them."""
        self.mode.apply_through(upto, t)

    def estimate(self, t: int) -> list[Message]:
        """The K messages of step t (2K forwards), then, with audits, the peers' scalars of step t
        this client recomputes on the same bits (2 forwards each). Before each forward the
        strategy may raise a failure of work running meanwhile (`Mode.poll`: overlap's hop thread).
        Nothing on a step this client does not originate (zo.stride): no forward, so none of the
        time `loss_at` takes (a launched slow client's paced sleep included)."""
        if not self.protocol.originates(self.node, t):
            return []

        def loss() -> float:
            self.mode.poll()
            return self.loss_at(t)

        own = []
        for k in range(self.protocol.perturbations):
            seed = self.protocol.seed(self.node, t, k)
            scalar = zo.two_point(loss, self.direction, seed, t, self.protocol.eps)
            zo.check_scalar(scalar, self.protocol.max_scalar, t)
            own.append(Message.make(self.node, t, seed, scalar, k))
        if self.audit is not None:
            self.audit.step(t, own)
        return own

    def hops(self, t: int) -> None:
        for _ in range(self.protocol.hops):
            self.hop(t)

    def exchange(self, t: int) -> dict[int, bytes]:
        """One exchange of the hop clock as local step t: the flood's outbox out to every
        neighbour (`hop.outbox_frames`), their frames in (neighbour -> bytes, undecoded), counted."""
        self.hops_run += 1
        incoming = self.transport.exchange(outbox_frames(self.flood), t)
        if incoming:
            self.received_bytes += sum(map(len, incoming.values()))
            got = dict(self.received_from)
            for peer, f in incoming.items():
                got[peer] = got.get(peer, 0) + len(f)
            self.received_from = got
        return incoming

    def hop(self, t: int) -> None:
        """One strict hop: exchange, then take each neighbour's frame; one that does not decode
        stops the run (a churn client drops its sender instead: core/churn/loop.py)."""
        incoming = self.exchange(t)
        flood, limits = self.flood, self._wire_limits(t)
        for peer in sorted(incoming):
            if peer not in flood.peers:
                continue
            try:
                new, _ = read_frame(flood, peer, incoming[peer], limits)
            except FrameError as e:
                raise FrameError(f"node {self.node}: bad frame from node {peer} at step {t}: {e}") from None
            if new:
                self.received(new, t)

    def received(self, items: Sequence[object], t: int) -> None:
        if self.audit is not None:
            self.audit.received(items, t)

    def _wire_limits(self, t: int) -> Limits:
        """`protocol.wire_limits(t)`, made once per step (a step has `hops` hops)."""
        step, protocol, limits = self._limits
        if step != t or protocol is not self.protocol:
            limits = self.protocol.wire_limits(t)
            self._limits = (t, self.protocol, limits)
        return limits
