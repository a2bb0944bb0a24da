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

With `protocol.overlap` the hops of step t run on a background thread while step t+1 is
estimated, so a step costs about max(compute, communication) instead of their sum. Step t is then:
estimate(t) while hops(t−1) run → join them (their error is raised here) → apply t − delay →
originate t → start hops(t). The estimates of step t cannot see what hops(t−1) complete, which is
the extra step in `protocol.delay` (D + 1): every state change happens in the same order as in a
plain client with delay D + 1, so the bits are exactly that client's. The flood and the transport
are used by one thread at a time: the hop thread between its start and the join, the main thread
(applies, listeners, pushes to the evaluator) otherwise; the join is the hand-over.

Resume at step L from a log of L complete steps reproduces the state the uninterrupted client had
when it began step L: steps < L − delay applied, steps L − delay .. L − 1 held complete but not
yet applied (`resume`). Step L is then estimated on the same bits as in the uninterrupted run.

Churn (`protocol.settle` > 0, docs/design.md §13): the transport drops a failed peer instead of
raising (`take_lost`), the flood stops sending to it, and no step is applied until a strict
majority of its roster committed its content (agreement.py): at the end of local step t the
client votes on step t − vote_lag (what it holds), reviews the votes it holds (commits, next
ballots), and applies step t − delay once committed and held; until then it keeps hopping without
originating (bounded by `protocol.patience_hops`, then it stops with one line). Every
`audit_every` steps the client floods an AUDIT note of its state hash; a client whose hash differs
from the majority's is left out of the proposals of the others and excluded once that commits. A
client that cannot reach an agreeing majority, or is excluded, raises
`membership.MembershipError` (one line) and stops, having applied only committed steps.

Assumes: every client of the run shares one `Protocol`; `loss_at(step)` evaluates the current
model (including any perturbation context) on this client's batch of `step`, a pure function of it;
the transport bounds each exchange by its own timeout (so a hop thread always ends).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from seedflood.core import membership, zo
from seedflood.core.agreement import Agreement, Voter
from seedflood.core.directions import Direction
from seedflood.core.flooding import Flood, FloodError
from seedflood.core.graph import Topology
from seedflood.core.membership import AUDIT, JOIN, Change, Note, Roster
from seedflood.core.message import FrameError, Message
from seedflood.core.protocol import Protocol
from seedflood.core.replay import Applier
from seedflood.core.transport import EVALUATOR, Transport, TransportError

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
        *,
        routes: Mapping[int, Sequence[int]] | None = None,
        hop_timeout_s: float | None = None,
        meet_timeout_s: float | None = None,
        state_hash: Callable[[], str] | None = None,
        attach: int = 0,
        evaluator: bool = False,
        incarnation: int = 0,
    ) -> None:
        """`routes` (graph.Topology.routes(node)): per origin, the neighbours to forward its
        messages to; None = every neighbour. Either way every message arrives at the same hop.
        `hop_timeout_s` (overlap only): how long the main thread waits for one step's hops
        beyond its own work before it gives up on them; None = as long as the transport takes
        (each exchange is bounded by the transport's timeout). Give hops × transport timeout.
        `meet_timeout_s` (churn): how long a rejoining neighbour's edge waits for its other end
        (`_link`); None = hop_timeout_s. Give the transport's timeout: both ends reach the hop
        within one exchange of each other, and a longer wait delays this client's frames to
        peers that drop it after LATE_FACTOR timeouts.
        `state_hash`: the state's hash, for audits (needed when the protocol audits).
        `attach`: the evaluator's first attach node; `evaluator` (churn with a process
        transport): this client streams the steps it decides to the evaluator whenever it is the
        roster's attach node (`_follow`), instead of a listener doing it. `incarnation`: this
        process's incarnation of its node (churn: its votes carry it; a rejoin checks it)."""
        if protocol.audit_every and state_hash is None:
            raise ValueError(f"node {node}: the protocol audits every {protocol.audit_every} steps: pass state_hash")
        self.node = node
        self.protocol = protocol
        self.direction = direction
        self.loss_at = loss_at
        self.transport = transport
        # Churn floods to every neighbour: shortest-path routes break when a relay dies.
        self.flood = Flood(
            node,
            peers,
            range(protocol.n_origins),
            protocol.perturbations,
            None if protocol.churn else routes,
            note_horizon=protocol.step_window,
            tolerate_conflicts=protocol.churn,
        )
        self.agreement = Agreement(
            node,
            protocol.n_origins,
            protocol.perturbations,
            incarnation,
            Roster(protocol.n_origins, attach=attach),
        )
        """Churn: the committed chain and roster, and this client's votes."""
        self.voter = Voter(protocol, self.flood, self.agreement, lambda line: log.error("node %d: %s", node, line))
        self.state_hash = state_hash
        self.evaluator = evaluator
        self._fed = 0  # the transport's evaluator edge (count) that got its catch-up blob
        self.history: list[tuple[int, list[Message]]] = []
        """Churn: every decided step from 0, what a sponsor hands a rejoining neighbour."""
        self.joined_at = 0  # first step this client originates (a rejoined client: its JOIN step)
        self.applier = Applier(direction, protocol)
        self.listeners: list[StepListener] = []
        """Called with (step, messages) for each step applied beyond the resumed log."""
        self.next_step = 0
        self.logged = 0  # steps that were already in the log this client resumed from
        # the hop clock: the index of the next exchange, shared by every client of a connected
        # run (a newcomer starts at its sponsor's); the agreement's clock and `_link`'s schedule
        self.hops_run = 0
        self._deferred: set[int] = set()  # restarted neighbours still members under their old incarnation
        self._links: dict[int, list[Note]] = {}  # hop index -> JOIN notes whose edges connect then
        self.hop_timeout_s = hop_timeout_s
        self.meet_timeout_s = hop_timeout_s if meet_timeout_s is None else meet_timeout_s
        self._inflight: _Hops | None = None  # overlap: the hops of step next_step − 1, running

    @property
    def roster(self) -> Roster:
        """The committed roster: members of the next step to commit; `roster.changes` holds every
        committed change (step -> Change)."""
        return self.agreement.roster

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
        state_hash: Callable[[], str] | None = None,
        **options: Any,
    ) -> Client:
        """Node `node` of `top` as every runtime builds it: its neighbours, shortest-path routes,
        and a hop thread given `timeout_s` (the transport's) per exchange of a step, plus one;
        a rejoining neighbour's edges wait `timeout_s` for their other end.
        `options`: the constructor's `attach` / `evaluator`."""
        return cls(
            node,
            transport.peers if protocol.churn else top.neighbors(node),  # a restarted node: none yet
            protocol,
            direction,
            loss_at,
            transport,
            routes=top.routes(node),
            hop_timeout_s=timeout_s * (protocol.hops + 1),
            meet_timeout_s=timeout_s,
            state_hash=state_hash,
            **options,
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
        logged = dict(changes or {})
        if self.protocol.churn:  # every logged step is committed; those >= cut wait to be applied
            for s, msgs in records:
                self.agreement.extend(s, msgs, logged.get(s), pending=s >= cut)
        self.applier.apply_all(records[:cut])
        if self.protocol.churn:
            self.history = [(s, list(msgs)) for s, msgs in records[:cut]]
        self.flood.applied_through = cut - 1
        for _, msgs in records[cut:]:
            self.flood.restore(msgs)
        self.next_step = self.logged = self.voter.logged = len(records)

    # -- the loop --------------------------------------------------------------------------------
    def run(self, stop: int | None = None) -> None:
        """Steps next_step..stop-1 (default: to the end of the run, then drain)."""
        stop = self.protocol.steps if stop is None else stop
        while self.next_step < stop:
            self.step(self.next_step)
        if stop == self.protocol.steps:
            self.drain()
        else:
            self._join()  # a run stopped early (a kill in the tests): nothing may keep hopping

    def step(self, t: int) -> None:
        if self.protocol.churn:
            self._boundary(t)
            if t >= self.joined_at:  # a rejoining client relays and votes, originates from its JOIN step
                self.flood.originate(self._estimate(t))
            self._hops(t)
            self._agree(t)
            self.apply_through(t - self.protocol.delay, t)
            self.next_step = t + 1
            return
        if not self.protocol.overlap:
            own = self._estimate(t)
            self.flood.originate(own)
            self._hops(t)
            self.apply_through(t - self.protocol.delay)
        else:
            try:
                own = self._estimate(t)  # hops(t − 1) run meanwhile
            except BaseException:
                self._settle()  # hand the transport back before the caller closes it
                raise
            self._join()
            self.apply_through(t - self.protocol.delay)
            self.flood.originate(own)
            self._inflight = _Hops(self, t)
        self.next_step = t + 1

    # -- rejoin (churn) -------------------------------------------------------------------------
    def _boundary(self, t: int) -> None:
        """Before step t: sponsor a restarted neighbour that is ours to catch up (its other edges
        connect later, at the hop its JOIN note names: `_link`)."""
        transport = self.transport
        timeout = self.hop_timeout_s
        revived = getattr(transport, "revived", list)() if t >= self.joined_at else []  # members sponsor
        # a restarted neighbour whose old incarnation is still a member waits until a committed
        # step has left it out: the new process must never vote or count as its old self
        revived = sorted(set(revived) | self._deferred)
        self._deferred = {p for p in revived if p in self.roster.members}
        for p in (p for p in revived if p not in self._deferred):
            inc = transport.claim(p)  # type: ignore[attr-defined]
            if inc is None or not transport.connect([p], timeout):  # type: ignore[attr-defined]
                continue  # another neighbour sponsors it, or it is gone again
            # JOIN at e = t + delay + 1: the note gets the hops a message of step t gets before it
            # is applied, so it normally reaches every voter before they propose step e (one that
            # lacks it proposes e without the newcomer, and the ballots settle which commits).
            # Its other edges connect at the hop index where step e's first hop falls if nobody
            # waits: a hop index, not a step, because a client waiting for a commit hops on at
            # its step (its neighbours' steps move on), and because the newcomer and this sponsor
            # may both wait before e for votes that only those edges can bring (F5)
            e = t + self.protocol.delay + 1
            link = self.hops_run + self.protocol.hops * (self.protocol.delay + 1)
            note = membership.join_note(e, p, inc, link)
            self.flood.originate_notes([note])
            self._note_links([note])
            transport.send_blob(p, self._catch_up(t, e, inc))  # type: ignore[attr-defined]
            self.flood.add_peer(p)
            log.warning(
                "node %d: sponsoring node %d (incarnation %d): joins at step %d, its edges connect at hop %d",
                self.node,
                p,
                inc,
                e,
                link,
            )
        if self.evaluator and self.roster.attach == self.node:
            self._follow()

    def _note_links(self, items: Sequence[object]) -> None:
        """Remember the JOIN notes among `items` by the hop index their edges connect at."""
        for n in items:
            if isinstance(n, Note) and n.kind == JOIN and membership.link_hop(n) >= self.hops_run:
                self._links.setdefault(membership.link_hop(n), []).append(n)

    def _link(self) -> None:
        """Right before exchange number `hops_run`: connect the edges of rejoining neighbours
        whose JOIN note names this hop. Every client of a connected run shares one hop clock
        (each exchange pairs the i-th frames of both ends of an edge, and a newcomer's clock
        starts at its sponsor's), so both ends of an edge connect at the same exchange, whatever
        steps they are at or wait in. One rule on both ends (their rosters agree): the newcomer
        connects its member neighbours, and each member connects it; a neighbour that is itself
        still rejoining connects neither way (connecting one end alone leaves the edge's hops
        unpaired). Each edge is a meeting (the transport connects it only if both ends ask
        within `meet_timeout_s`): a client that gets the note only after its hop (a part farther
        than the note travels in delay + 1 steps, or cut off from a sponsor that stalled right
        after it sponsored) does not ask, and the edge stays down at both ends."""
        due = self._links.pop(self.hops_run, [])
        for h in [h for h in self._links if h < self.hops_run]:
            del self._links[h]
        edges: list[int] = []
        for n in due:
            if n.origin == self.node:
                if n.value != self.agreement.incarnation:
                    continue  # an earlier incarnation's join
                edges += [q for q in self._neighbours() if q in self.roster.members]
            elif self.node in self.roster.members:
                edges.append(n.origin)
        edges = sorted({q for q in edges if q != self.node and q not in self.flood.peers and q in self._neighbours()})
        for q in self.transport.connect(edges, self.meet_timeout_s) if edges else []:  # type: ignore[attr-defined]
            self.flood.add_peer(q)

    def _follow(self) -> None:
        """As the attach node, between steps: answer the evaluator if it greets us (a start, a
        restart, or a failover from the attach node before us), and open each new evaluator edge
        with the committed steps it lacks; those applied from then on are pushed (`_apply_committed`)."""
        transport = self.transport
        transport.attach = True  # type: ignore[attr-defined]
        if not transport.evaluator_connected:  # type: ignore[attr-defined]
            transport.poll(evaluator_only=True)  # type: ignore[attr-defined]
        link = transport.evaluator_links  # type: ignore[attr-defined]
        if not transport.evaluator_connected or link == self._fed:  # type: ignore[attr-defined]
            return
        self._fed = link
        needs = transport.evaluator_needs()  # type: ignore[attr-defined]
        blob = membership.encode_pushes(
            (s, membership.encode_step(m, self.roster.changes.get(s))) for s, m in self.history if s >= needs
        )
        try:
            transport.send_blob(EVALUATOR, blob)  # type: ignore[attr-defined]
        except TransportError as e:  # the evaluator is dropped; it greets again
            log.warning("node %d: catch-up to the evaluator failed: %s", self.node, e)
            return
        log.warning(
            "node %d: the evaluator follows this node; sent it steps %d..%d", self.node, needs, len(self.history) - 1
        )

    def _neighbours(self) -> tuple[int, ...]:
        """Topology neighbours, connected or not (what a churn transport may connect)."""
        return getattr(self.transport, "neighbours", self.flood.peers)

    def _catch_up(self, t: int, e: int, inc: int) -> bytes:
        """What a rejoining neighbour needs before step t (`membership.CatchUp`): every decided
        step (with its change), the messages and notes held for undecided steps, its JOIN step."""
        msgs, notes = self.flood.held_items()
        steps = [(s, membership.encode_step(m, self.roster.changes.get(s))) for s, m in self.history]
        held = membership.encode_hop(msgs, notes)
        return membership.CatchUp(self.node, t, e, inc, steps, held, self.hops_run).to_bytes()

    def rejoin(self, blob: bytes) -> None:
        """Catch up from a sponsor's payload (`_catch_up`) as a restarted client: replay every
        decided step (O(messages)), hold the undecided ones, and originate from the JOIN step."""
        if self.next_step or self.applier.last_step >= 0:
            raise FloodError(f"node {self.node}: rejoin must come before the first step")
        d = membership.CatchUp.from_bytes(blob)
        if self.agreement.incarnation and d.incarnation != self.agreement.incarnation:
            raise FrameError(
                f"node {self.node}: node {d.sponsor}'s catch-up admits incarnation {d.incarnation}, "
                f"this process is incarnation {self.agreement.incarnation}"
            )
        self.agreement.incarnation = d.incarnation
        steps = []
        for s, payload in d.steps:
            if s != len(steps):
                raise FrameError(f"node {self.node}: catch-up from node {d.sponsor} jumps to step {s}")
            msgs, change = membership.decode_step(payload, s, seed_of=self.protocol.seed)
            # the chain is checked later, not here: this client commits nothing until a majority's
            # votes name the digest its replayed history ends on (a forked sponsor is found there)
            self.agreement.extend(s, msgs, change)
            self.protocol.check_step(s, msgs, members=self.roster.members)
            steps.append((s, msgs))
        self.applier.apply_all(steps)
        self.history = steps
        self.flood.applied_through = len(steps) - 1
        msgs, notes = membership.decode_hop(d.held, self.protocol.limits(0, 2**32 - 1))
        self.flood.restore(msgs)
        self.flood.originate_notes(notes)
        self.hops_run = d.hop  # the sponsor's hop clock: this client's first exchange is its hop d.hop
        self._note_links(notes)
        self.next_step = d.next_step
        self.logged = self.voter.logged = len(steps)
        self.joined_at = d.join_step
        self.transport.connect([d.sponsor], self.hop_timeout_s)  # type: ignore[attr-defined]
        self.flood.add_peer(d.sponsor)
        log.warning(
            "node %d: rejoined by replaying %d steps from node %d; originates from step %d",
            self.node,
            len(steps),
            d.sponsor,
            self.joined_at,
        )

    def _estimate(self, t: int) -> list[Message]:
        """The K messages of step t (2K forwards). With overlap, a failure of the hop thread is
        raised before each forward, so it surfaces within one forward, not one step."""

        def loss() -> float:
            if self._inflight is not None and self._inflight.done():
                self._join()
            return self.loss_at(t)

        own = []
        for k in range(self.protocol.perturbations):
            seed = self.protocol.seed(self.node, t, k)
            scalar = zo.two_point(loss, self.direction, seed, t, self.protocol.eps)
            zo.check_scalar(scalar, self.protocol.max_scalar, t)
            own.append(Message.make(self.node, t, seed, scalar, k))
        return own

    def drain(self) -> None:
        """After the last step: hop until every step is applied (only with delayed flooding or
        overlap). After the hops of step t, steps <= t − D are complete (D = ⌈diameter/hops⌉ − 1
        = delay − overlap: overlap's extra step comes from estimates running during hops, and
        drain estimates nothing, so it applies each step as soon as it is complete)."""
        last = self.protocol.steps - 1
        if self.protocol.churn:
            self._drain_churn(last)
            return
        lag = self.protocol.delay - int(self.protocol.overlap)
        if self._inflight is not None:
            t = self._inflight.step
            self._join()
            self.apply_through(min(t - lag, last))
        while self.applier.last_step < last:
            t = self.applier.last_step + 1 + lag  # local step whose hops complete the next one
            self._hops(t)
            self.apply_through(min(t - lag, last))

    def _drain_churn(self, last: int) -> None:
        """Churn, after the last step: hop, vote and commit on without originating until every
        step is applied, then hop on for as long as a vote takes to spread, so that the votes this
        client holds reach a neighbour still waiting for them."""
        t = max(self.next_step, self.protocol.steps)
        while self.applier.last_step < last:
            self._hops(t)
            self._agree(t)
            self.apply_through(min(t - self.protocol.delay, last), t)
            t += 1
        for _ in range(self.protocol.delay - self.protocol.vote_lag):
            self._hops(t)
            t += 1

    def _hops(self, t: int) -> None:
        for _ in range(self.protocol.hops):
            self.hop(t)

    def _join(self) -> None:
        """Wait for the hops in flight (if any) and raise their error in this thread."""
        hops, self._inflight = self._inflight, None
        if hops is not None:
            hops.join(self.hop_timeout_s)

    def _settle(self) -> None:
        """On an error of the main thread: let the hops in flight end (bounded) and drop their
        own error, so the caller closes a transport no other thread is using."""
        try:
            self._join()
        except Exception as e:  # the main thread's error is the one to report
            log.debug("node %d: hops in flight also failed: %s", self.node, e)

    def hop(self, t: int) -> None:
        if self.protocol.churn:
            self._link()
        self.hops_run += 1
        frames = {}
        for p, items in self.flood.outbox().items():
            msgs = [m for m in items if isinstance(m, Message)]
            frames[p] = membership.encode_hop(msgs, [n for n in items if isinstance(n, Note)])
        incoming = self.transport.exchange(frames, t)
        if self.protocol.churn:
            for peer, why in sorted(getattr(self.transport, "take_lost", dict)().items()):
                log.warning("node %d: lost peer %d at step %d: %s", self.node, peer, t, why)
                self.flood.drop_peer(peer)
        limits = self.protocol.wire_limits(t)
        for peer in sorted(incoming):
            if peer not in self.flood.peers:
                continue
            try:
                msgs, notes = membership.decode_hop(incoming[peer], limits)
            except FrameError as e:
                raise FrameError(f"node {self.node}: bad frame from node {peer} at step {t}: {e}") from None
            new = self.flood.receive(peer, [*msgs, *notes])
            if notes:
                self._note_links(new)

    def apply_through(self, upto: int, t: int | None = None) -> None:
        """Apply every step <= upto; each must be complete (else the topology/hops are wrong).
        Churn: each must be committed; the client hops on (as local step t) until it is."""
        while self.applier.last_step < upto:
            s = self.applier.last_step + 1
            if self.protocol.churn:
                self._apply_committed(s, self.next_step if t is None else t)
                continue
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

    # -- agreement (churn) ------------------------------------------------------------------------
    def _agree(self, t: int) -> None:
        """End of local step t (or of a hop waited at t): vote, commit, move votes on."""
        for _, change in self.voter.after(t, self.hops_run):
            if change:
                log.warning("node %d: membership %s", self.node, change.describe())

    def _apply_committed(self, s: int, t: int) -> None:
        """Churn: apply step s once it is committed and its messages are here, hopping on (as
        local step t, originating nothing) until then; tell the listeners, push it to the
        evaluator if this client is the attach node, and audit the state if this step is audited."""
        waited = 0
        while (msgs := self.voter.take(s)) is None:
            if waited >= self.protocol.patience_hops:
                raise self.voter.stuck(s, waited)
            self.hop(t)
            self._agree(t)
            waited += 1
        self.applier.apply(s, msgs)
        self.history.append((s, msgs))
        if s >= self.logged:
            for listener in self.listeners:
                listener(s, msgs)
            if self.evaluator and self.roster.attach == self.node and getattr(self.transport, "attach", False):
                payload = membership.encode_step(msgs, self.roster.changes.get(s))
                self.transport.push(membership.encode_push(s, payload), s)
            if self.protocol.audits(s) and self.state_hash is not None:
                value = membership.audit_value(self.state_hash())
                self.flood.originate_notes([Note(s, AUDIT, self.node, value)])


class _Hops:
    """The hops of one step on a daemon thread (overlap). A daemon, so a hop stuck in a broken
    transport can never keep the process alive; the transport's timeout ends it anyway."""

    def __init__(self, client: Client, step: int) -> None:
        self.client = client
        self.step = step
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"seedflood-hops-{client.node}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.client._hops(self.step)
        except BaseException as e:  # raised again by join() in the main thread
            self.error = e

    def done(self) -> bool:
        return not self.thread.is_alive()

    def join(self, timeout: float | None) -> None:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TransportError(
                f"node {self.client.node}: the hops of step {self.step} did not finish within {timeout} s"
            )
        if self.error is not None:
            raise self.error
