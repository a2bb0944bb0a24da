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
from seedflood.core.churn import joining, loop, prefix
from seedflood.core.churn.agreement import Agreement
from seedflood.core.churn.health import Health
from seedflood.core.churn.history import History
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
    def history(self) -> History:
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
        if isinstance(cmd, c.Exchange):
            return c.Exchanged(h.exchange(cmd.t), transport.take_lost())
        if isinstance(cmd, c.Neighbours):
            return tuple(transport.neighbours), self.healer is not None and bool(self.healer.peers)
        if isinstance(cmd, c.Received):
            h.received(cmd.items, cmd.t)
        elif isinstance(cmd, c.Estimate):
            return h.estimate(cmd.t)
        elif isinstance(cmd, c.Follow):
            if self.feed is not None and self.roster.attach == h.node:
                self.follow(self.feed)
        elif isinstance(cmd, c.Clock):
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

    # -- the host's hooks: each runs the member's schedule (core/churn/loop.py) -----------------
    def resume(self, records: Records, cut: int, changes: Mapping[int, Change]) -> None:
        """Every logged step is committed (keeping its decision); those >= cut wait to be applied."""
        self.member.resume(records, cut, changes)

    def step(self, t: int) -> None:
        self._run(loop.step(self.member, t))
        self.host.next_step = self.member.next_step

    def _knock(self, t: int) -> None:
        self._run(joining.knock(self.member, t, self.member.clock))

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
        sent = self.history[max(needs, 0) :]  # a slice, not a filter: a negative value would wrap
        blob = stepstream.encode_pushes((s, step_payload(self, s, m)) for s, m in sent)
        try:
            feed.send_blob(EVALUATOR, blob)
        except TransportError as e:  # the evaluator is dropped; it greets again
            log.warning("node %d: catch-up to the evaluator failed: %s", self.host.node, e)
            return
        log.warning(
            "node %d: the evaluator follows this node; %s", self.host.node, _catch_up_said(sent, needs, self.history)
        )

    def drain(self) -> None:
        """After the last step: hop until every step is applied (loop.drain)."""
        self._run(loop.drain(self.member))

    def apply_through(self, upto: int, t: int | None = None) -> None:
        """Apply every step <= upto, each once committed; the client hops on (as local step t)
        until it is."""
        self._run(loop.apply_through(self.member, upto, self.host.next_step if t is None else t))

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
        blob = self._run(joining.sponsor(self.member, t, p, inc, have, self.member.clock))
        transport.send_blob(p, blob)
        h.flood.add_peer(p)

    def catch_up(self, t: int, e: int, inc: int, have: Have = prefix.NOTHING) -> bytes:
        """What a rejoining neighbour needs before step t (`joining.catch_up`)."""
        return joining.catch_up(self.member, t, e, inc, self.member.clock, have)

    def rejoin(self, blob: bytes, held: Sequence[tuple[int, bytes]] = ()) -> None:
        """Catch up from a sponsor's payload as a restarted client (`joining.rejoin`)."""
        h = self.host
        if h.next_step or h.applier.last_step >= 0:
            raise FloodError(f"node {h.node}: rejoin must come before the first step")
        h.next_step = self.member.next_step = self._run(joining.rejoin(self.member, blob, held))
        h.logged = self.member.logged

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
