"""The churn step strategy: a driver that runs a pure churn member on a churn transport
(docs/churn-design.md).

Owns `Churn`: the host's `Mode` for a churn run. Every decision is its `core.churn.member.Member`'s
(votes, commits, applying only committed steps, sponsoring, joins, leaves, heals, links, graph
repair: see that module and core/churn/edges.py, joining.py); this driver calls the member's
entry points at the host's hooks and runs the commands they yield (`_run`): hops and the clock
on the host, edge work on the `transport.ChurnTransport`, the time, the model's apply and state
hash, log lines. Beside the member it owns the I/O of sponsoring (`_sponsor`: meet, challenge
in a signed run, the newcomer's word of what it holds, the catch-up sent) and of following the
evaluator as the attach node (`follow`).

The transport drops a failed peer instead of raising (`take_lost`), the flood stops sending to it,
and no step is applied until a strict majority of its roster committed its content: at the end of
local step t the client votes on step t − vote_lag (what it holds), reviews the votes it holds
(commits, next ballots), and applies step t − delay once committed and held; until then it keeps
hopping without originating (bounded by `protocol.patience_hops`, then it stops with one line;
over a healing transport up to `Protocol.HEAL_FACTOR` timeouts more, whatever its own edges).
A client that cannot reach an agreeing majority, or is excluded, raises `MembershipError` (one
line) and stops, having applied only committed steps.

Assumes: the client floods to every neighbour (shortest-path routes break when a relay dies) and
tolerates conflicting copies until a commit settles them (`churnstart.ChurnStrategy` says so to
the client, and hands this module its `transport.ChurnTransport` and, on an attach node that
feeds the evaluator, the `transport.EvaluatorFeed` to do it with).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

from seedflood.core.churn import commands as c
from seedflood.core.churn import edges, joining, prefix
from seedflood.core.churn.agreement import Agreement
from seedflood.core.churn.health import Health
from seedflood.core.churn.member import Left, Member
from seedflood.core.churn.prefix import Have
from seedflood.core.churn.voter import Voter
from seedflood.core.flood import stepstream
from seedflood.core.flood.flooding import FloodError
from seedflood.core.flood.transport import EVALUATOR, ChurnTransport, EvaluatorFeed, Growing, Healing, TransportError
from seedflood.core.membership.growth import Growth
from seedflood.core.membership.roster import Change, Roster
from seedflood.core.wire.message import FrameError, Message
from seedflood.roles import rejoinproof
from seedflood.roles.strategy import Host, Records

log = logging.getLogger(__name__)

IDLE_S = 0.01  # a client waiting past its patience for an edge to heal hops at most this often (s)

__all__ = ["IDLE_S", "Churn", "Left", "step_payload"]


class Churn:
    """A churn client's schedule and membership (`host.Mode`): its `Member` driven on `transport`."""

    def __init__(
        self,
        host: Host,
        transport: ChurnTransport,
        *,
        state_hash: Callable[[], str] | None,
        attach: int,
        evaluator: EvaluatorFeed | None,
        incarnation: int,
        growth: Growth | None = None,
    ) -> None:
        """See `churnstart.ChurnStrategy`; `transport` is the one `host` hops on."""
        p = host.protocol
        if p.audit_every and state_hash is None:
            raise ValueError(f"node {host.node}: the protocol audits every {p.audit_every} steps: pass state_hash")
        self.host = host
        self.transport = transport
        self.healer = transport if isinstance(transport, Healing) else None
        """The transport, where its down edges heal (in memory and over gloo: both are `Healing`)."""
        self.grower = transport if growth is not None and isinstance(transport, Growing) else None
        """The transport, where brand-new ids may join and repair may add edges."""
        self.member = Member(
            p,
            host.flood,
            host.node,
            incarnation=incarnation,
            attach=attach,
            growth=growth,
            grows=self.grower is not None,
            healing=self.healer is not None,
            on_error=lambda line: log.error("node %d: %s", host.node, line),
            meet_timeout_s=host.meet_timeout_s or 0.0,
            audits=state_hash is not None,
        )
        self.state_hash = state_hash
        self.feed = evaluator
        self._fed = 0  # the transport's evaluator edge (count) that got its catch-up blob

    # -- the member's state, as the host and the tests read it ----------------------------------
    @property
    def agreement(self) -> Agreement:
        return self.member.agreement

    @property
    def voter(self) -> Voter:
        return self.member.voter

    @property
    def health(self) -> Health:
        return self.member.health

    @property
    def roster(self) -> Roster:
        return self.member.roster

    @property
    def changes(self) -> Mapping[int, Change]:
        return self.member.changes

    @property
    def history(self) -> list[tuple[int, list[Message]]]:
        return self.member.history

    @property
    def certificates(self) -> dict[int, bytes]:
        return self.member.certificates

    @property
    def joined_at(self) -> int:
        return self.member.joined_at

    @property
    def leaving(self) -> bool:
        return self.member.leaving

    @property
    def growth(self) -> Growth | None:
        return self.member.growth

    # -- running the member's commands ----------------------------------------------------------
    def _run(self, steps: Generator[c.Command, Any, Any]) -> Any:
        """Run the commands `steps` yields, in order, sending each its result; return its value."""
        result: Any = None
        while True:
            try:
                cmd = steps.send(result)
            except StopIteration as done:
                return done.value
            result = self._do(cmd)

    def _do(self, cmd: c.Command) -> Any:  # noqa: C901 (one dispatch)
        h, transport = self.host, self.transport
        if isinstance(cmd, c.Hop):
            h.hop(cmd.t)
            return h.hops_run
        if isinstance(cmd, c.Clock):
            h.hops_run = cmd.hop
        elif isinstance(cmd, c.Say):
            log.log(cmd.level, cmd.msg, *cmd.args)
        elif isinstance(cmd, c.Now):
            return time.monotonic()
        elif isinstance(cmd, c.Idle):
            time.sleep(IDLE_S)
        elif isinstance(cmd, c.Apply):
            self._apply(cmd.step, cmd.msgs, cmd.fresh)
        elif isinstance(cmd, c.ApplyAll):
            h.applier.apply_all(cmd.steps)
        elif isinstance(cmd, c.StateHash):
            assert self.state_hash is not None  # the member asks only where it audits
            return self.state_hash()
        elif isinstance(cmd, c.Revived):
            return transport.revived()
        elif isinstance(cmd, c.Newcomers):
            assert self.grower is not None  # the member asks only where it grows
            return self.grower.newcomers()
        elif isinstance(cmd, c.Claim):
            return transport.claim(cmd.peer)
        elif isinstance(cmd, c.Sponsor):
            self._sponsor(cmd.t, cmd.peer, cmd.inc)
        elif isinstance(cmd, c.Grow):
            assert self.grower is not None
            self.grower.grow(list(cmd.peers))
            return transport.neighbours
        elif isinstance(cmd, c.Connect):
            return transport.connect(list(cmd.peers), h.meet_timeout_s if cmd.meet else h.hop_timeout_s)
        elif isinstance(cmd, c.Part):
            transport.part(cmd.peer)
        elif isinstance(cmd, c.Drop):
            transport.drop(cmd.peer, cmd.why)
        elif isinstance(cmd, c.AskHeal):
            assert self.healer is not None
            return self.healer.heal(dict(cmd.want), cmd.hop)
        elif isinstance(cmd, c.Restore):
            assert self.healer is not None
            self.healer.restore(cmd.peer)
        else:  # pragma: no cover - every command is handled above
            raise TypeError(f"unknown command {cmd!r}")
        return None

    def _apply(self, s: int, msgs: list[Message], fresh: bool) -> None:
        """Apply committed step s to the model; beyond the resumed log tell the listeners and push
        it to the evaluator if this client is the attach node."""
        h = self.host
        h.applier.apply(s, msgs)
        if fresh:
            for listener in h.listeners:
                listener(s, msgs)
            feed = self.feed
            if feed is not None and self.roster.attach == h.node and feed.attach:
                feed.push(stepstream.encode_push(s, step_payload(self, s, msgs)), s)

    # -- the host's hooks -------------------------------------------------------------------------
    def resume(self, records: Records, cut: int, changes: Mapping[int, Change]) -> None:
        """Every logged step is committed (keeping its decision); those >= cut wait to be applied."""
        self.member.resume(records, cut, changes)

    def step(self, t: int) -> None:
        h = self.host
        self.boundary(t)
        self.health.begin(t, h.hops_run)
        if self.member.originates(t):  # a rejoining client originates from its JOIN step
            h.flood.originate(h.estimate(t))
        self.step_hops(t)
        self.agree(t)
        self.apply_through(t - h.protocol.delay, t)
        h.next_step = t + 1

    def boundary(self, t: int) -> None:
        """Before step t: sponsor a restarted neighbour that is ours to catch up; as the attach
        node, follow the evaluator."""
        self._run(joining.boundary(self.member, t))
        if self.feed is not None and self.roster.attach == self.host.node:
            self.follow(self.feed)

    def step_hops(self, t: int) -> None:
        """The hops of local step t: up to the next exchange index that is a multiple of
        `protocol.hops` (`hops` of them where the step began on one, as every step does while
        nobody waits), so a client whose steps begin off the hop clock's phase (it waited a hop or
        two for a commit, a newcomer starts at its sponsor's clock mid-step) puts its step
        boundaries back on it (measured: 1.8x per step after a cut healed, docs/benchmarks.md).
        Timing only: which exchange carries a frame changes no committed value."""
        h = self.host
        n = h.protocol.hops
        for _ in range(n - h.hops_run % n):  # counted once: a client alone holds its clock (`heal`)
            h.hop(t)

    def on_notes(self, new: Sequence[object], sender: int | None = None) -> None:
        self._run(self.member.on_notes(new, self.host.hops_run, sender))

    def before_hop(self) -> None:
        h, m = self.host, self.member
        # the edge work reads the transport's neighbours as they are now (a newcomer's transport
        # adds its sponsor when it is claimed; the member's `Grow`s add the rest)
        m.neighbours = tuple(self.transport.neighbours)
        if self.grower is not None and h.next_step < h.protocol.steps:
            self._knock(h.next_step)
        self._run(edges.unlink(m, h.hops_run))
        self._run(edges.link(m, h.hops_run))
        if self.healer is not None:
            self._run(edges.heal(m, h.hops_run, bool(self.healer.peers)))

    def _knock(self, t: int) -> None:
        self._run(joining.knock(self.member, t, self.host.hops_run))

    def after_exchange(self, t: int) -> None:
        self._run(self.member.after_exchange(t, self.transport.take_lost()))

    def on_bad_frame(self, peer: int, t: int, error: FrameError) -> None:
        self._run(self.member.on_bad_frame(peer, t, error))

    def leave(self) -> None:
        self.member.leave()

    def follow(self, feed: EvaluatorFeed) -> None:
        """As the attach node, between steps: answer the evaluator if it greets us (a start, a
        restart, or a failover from the attach node before us), and open each new evaluator edge
        with the committed steps it lacks; those applied from then on are pushed (`_apply`)."""
        feed.attach = True
        if not feed.evaluator_connected:
            feed.poll(evaluator_only=True)
        link = feed.evaluator_links
        if not feed.evaluator_connected or link == self._fed:
            return
        self._fed = link
        needs = feed.evaluator_needs()
        sent = [(s, m) for s, m in self.history if s >= needs]
        blob = stepstream.encode_pushes((s, step_payload(self, s, m)) for s, m in sent)
        try:
            feed.send_blob(EVALUATOR, blob)
        except TransportError as e:  # the evaluator is dropped; it greets again
            log.warning("node %d: catch-up to the evaluator failed: %s", self.host.node, e)
            return
        log.warning(
            "node %d: the evaluator follows this node; %s", self.host.node, _catch_up_said(sent, needs, self.history)
        )

    # -- agreement --------------------------------------------------------------------------------
    def drain(self) -> None:
        """After the last step: hop, vote and commit on without originating until every step is
        applied, then hop on for as long as a vote takes to spread, so that the votes this client
        holds reach a neighbour still waiting for them."""
        h = self.host
        last = h.protocol.steps - 1
        t = max(h.next_step, h.protocol.steps)
        while h.applier.last_step < last:
            self.step_hops(t)
            self.agree(t)
            self.apply_through(min(t - h.protocol.delay, last), t)
            t += 1
        for _ in range(h.protocol.delay - h.protocol.vote_lag):
            h.hops(t)
            t += 1

    def agree(self, t: int) -> None:
        """End of local step t (or of a hop waited at t): vote, commit, move votes on."""
        self._run(self.member.agree(t, self.host.hops_run))

    def apply_through(self, upto: int, t: int | None = None) -> None:
        """Apply every step <= upto, each once committed; the client hops on (as local step t)
        until it is."""
        h = self.host
        while h.applier.last_step < upto:
            self.apply_committed(h.applier.last_step + 1, h.next_step if t is None else t)

    def apply_committed(self, s: int, t: int) -> None:
        self._run(self.member.apply_committed(s, t, self.host.logged))

    # -- sponsoring and rejoining -----------------------------------------------------------------
    def _sponsor(self, t: int, p: int, inc: int) -> None:
        """Before step t: catch up neighbour `p` (incarnation `inc`), which this client claimed:
        meet it, challenge it in a signed run, flood its JOIN note and send it the log."""
        h, transport = self.host, self.transport
        timeout = h.hop_timeout_s
        if not transport.connect([p], timeout):
            return  # it is gone again
        if why := rejoinproof.challenge(transport, h.flood.signing, p, inc, timeout):  # signed runs
            log.warning("node %d: refused node %d's rejoin (incarnation %d): %s", h.node, p, inc, why)
            transport.drop(p, f"rejoin refused: {why}")
            return
        if (have := _have_of(transport, p, timeout)) is None:  # what it holds already (a log server's prefix)
            log.warning("node %d: node %d said nothing of what it holds: not sponsoring it", h.node, p)
            transport.drop(p, "no word of what it holds")
            return
        blob = self._run(joining.sponsor(self.member, t, p, inc, have, h.hops_run))
        transport.send_blob(p, blob)
        h.flood.add_peer(p)

    def catch_up(self, t: int, e: int, inc: int, have: Have = prefix.NOTHING) -> bytes:
        """What a rejoining neighbour needs before step t (`joining.catch_up`)."""
        return joining.catch_up(self.member, t, e, inc, self.host.hops_run, have)

    def rejoin(self, blob: bytes, held: Sequence[tuple[int, bytes]] = ()) -> None:
        """Catch up from a sponsor's payload as a restarted client (`joining.rejoin`)."""
        h = self.host
        if h.next_step or h.applier.last_step >= 0:
            raise FloodError(f"node {h.node}: rejoin must come before the first step")
        h.next_step = self._run(joining.rejoin(self.member, blob, held))
        h.logged = len(self.history)

    def poll(self) -> None:
        pass  # nothing runs beside the estimate

    def join(self) -> None:
        pass


def step_payload(churn: Churn, s: int, msgs: list[Message]) -> bytes:
    """Decided step s of `churn` for the evaluator or a rejoining neighbour (`joining.step_payload`)."""
    return joining.step_payload(churn.member, s, msgs)


def _have_of(transport: ChurnTransport, peer: int, timeout_s: float | None) -> Have | None:
    """A newcomer's word of the steps it holds (`churnstart.sponsored_catch_up` sends it right
    after the meeting, and the signed challenge): None when none comes (it is gone); one that is
    not a `Have` counts as holding nothing (the whole log goes)."""
    try:
        data = transport.recv_blob(peer, rejoinproof.WAIT_S if timeout_s is None else timeout_s)
    except TransportError:
        return None
    try:
        return Have.from_bytes(data)
    except FrameError:
        return prefix.NOTHING


def _catch_up_said(sent: Records, needs: int, history: Records) -> str:
    """What an attach node logs having sent a (re)connected evaluator that needs the steps from
    `needs` on: the steps its catch-up held, ascending, or that it held none and why (the
    evaluator is ahead of this node's decided steps: they reach it as pushes once decided)."""
    if sent:
        return f"sent it steps {sent[0][0]}..{sent[-1][0]}"
    held = f"steps {history[0][0]}..{history[-1][0]}" if history else "no step yet"
    return f"sent it no steps: it needs steps from {needs} on, this node has decided {held}"
