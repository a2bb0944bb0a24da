"""A churn client's schedule over its member: the order of a step and of a hop (docs/churn-design.md).

Owns the generators a churn client runs, over a `member.Member`, yielding `commands`:
- `step(m, t)`: sponsor at the boundary (joining.boundary), follow the evaluator, originate
  (`Estimate`), the step's hops (`step_hops`), vote (`agree`), apply what is due (`apply_through`);
- `hop(m, t)`: the edge work before an exchange (a knock, graceful unlinks, JOIN links, heals),
  the exchange itself (`Exchange`), then the lost peers, the frames and the notes they carry;
- `agree` (vote, commit, the goodbye of a leaver committed out), `apply_committed` (apply a
  committed step, hopping on until it is: bounded by patience, then by the heal wait), `drain`
  (after the last step).
The driver (roles/churn.py) runs these on a transport and a model; the schedule explorer
(tests/explorer.py) runs the same generators on a simulated network and clock. Nothing here
reads a clock or does I/O: the time is `Now`'s result.

Assumes: pure Python (the core); one thread uses a member at a time; the member's hop clock
(`Member.clock`) moves only here (one per `Exchange`) and where a command sets it (`Clock`).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from seedflood.core.churn import edges, joining
from seedflood.core.churn.commands import (
    Apply,
    Command,
    Estimate,
    Exchange,
    Exchanged,
    Follow,
    Idle,
    Neighbours,
    Now,
    Part,
    Received,
    StateHash,
)
from seedflood.core.churn.member import Left, Member
from seedflood.core.flood.hop import read_frame
from seedflood.core.flood.protocol import Protocol
from seedflood.core.membership.notes import AUDIT, Note, audit_value, leave_note
from seedflood.core.membership.roster import ExcludedError, check_admitted
from seedflood.core.wire.message import FrameError

Steps = Generator[Command, Any, None]


def step(m: Member, t: int) -> Steps:
    """Local step t: sponsor a restarted neighbour that is ours, follow the evaluator (the attach
    node), originate (a rejoining client from its JOIN step), run the step's hops, vote, and
    apply step t − delay once committed."""
    yield from joining.boundary(m, t)
    yield Follow()
    m.health.begin(t, m.clock)
    if m.originates(t):
        m.flood.originate((yield Estimate(t)))
    yield from step_hops(m, t)
    yield from agree(m, t)
    yield from apply_through(m, t - m.protocol.delay, t)
    m.next_step = t + 1


def drain(m: Member) -> Steps:
    """After the last step: hop, vote and commit on without originating until every step is
    applied, then hop on for as long as a vote takes to spread, so that the votes this client
    holds reach a neighbour still waiting for them. While a down edge to a member may heal, it
    waits for it as a client waiting for a commit does (up to `Protocol.HEAL_FACTOR` meeting
    timeouts), and hops on a vote's spread after it connects: a neighbour that wakes behind
    would otherwise find every end gone and stop (found by the explorer: a stall on a ring of 4
    that wakes as the others finish)."""
    p = m.protocol
    last = p.steps - 1
    t = max(m.next_step, p.steps)
    while m.applied < last:
        yield Follow()  # the attach node may change in the drain too (its predecessor committed out)
        yield from step_hops(m, t)
        yield from agree(m, t)
        yield from apply_through(m, min(t - p.delay, last), t)
        t += 1
    spread = left = p.delay - p.vote_lag  # steps of hops a vote takes to spread
    heal_by: float | None = None
    while left > 0:
        agreed = bool(m.edges.heal_at)
        for _ in range(p.hops):
            yield from hop(m, t)
        t += 1
        if agreed or m.edges.heal_at:  # on until the heal connects and a vote has spread over it
            left = spread
        elif m.healing and edges.healable(m):  # a member neighbour is down: wait for it, paced
            now = yield Now()
            heal_by = now + Protocol.HEAL_FACTOR * m.meet_timeout_s if heal_by is None else heal_by
            left = spread if now <= heal_by else left - 1
            yield Idle()
        else:
            left -= 1


def step_hops(m: Member, t: int) -> Steps:
    """The hops of local step t: up to the next exchange index that is a multiple of
    `protocol.hops` (`hops` of them where the step began on one, as every step does while nobody
    waits), so a client whose steps begin off the hop clock's phase (it waited a hop or two for a
    commit, a newcomer starts at its sponsor's clock mid-step) puts its step boundaries back on
    it (measured: 1.8x per step after a cut healed, docs/benchmarks.md). Timing only: which
    exchange carries a frame changes no committed value."""
    n = m.protocol.hops
    for _ in range(n - m.clock % n):  # counted once: a client alone holds its clock (edges.heal)
        yield from hop(m, t)


def hop(m: Member, t: int) -> Steps:
    """One exchange as (or waited at) local step t. Before it: the transport's neighbours as they
    are now (a newcomer's transport adds its sponsor when it is claimed; `Grow`s add the rest), a
    knock to look at, the edges of graceful leavers to close, JOIN links and heals to connect.
    After it: drop the peers the transport lost, then take each neighbour's frame in id order (a
    frame that does not decode closes its edge: `Member.on_bad_frame`) and the notes it carried."""
    p = m.protocol
    m.neighbours, _ = yield Neighbours()
    if m.grows and m.next_step < p.steps:
        yield from joining.knock(m, m.next_step, m.clock)
    yield from edges.unlink(m, m.clock)
    yield from edges.link(m, m.clock)
    if m.healing:  # whether an edge is up now: a sponsored newcomer's, a link's (else its clock holds)
        m.neighbours, connected = yield Neighbours()
        m.clock = yield from edges.heal(m, m.clock, connected)
    got: Exchanged = yield Exchange(t)
    m.clock += 1
    m.exchanges += 1
    yield from m.after_exchange(t, got.lost)
    limits = m.limits(t)
    for peer in sorted(got.frames):
        if peer not in m.flood.peers:
            continue
        try:
            new, notes = read_frame(m.flood, peer, got.frames[peer], limits)
        except FrameError as e:
            yield from m.on_bad_frame(peer, t, e)
            continue
        if new:
            yield Received(new, t)
        if notes:
            yield from m.on_notes(new, m.clock, peer)


def agree(m: Member, t: int) -> Steps:
    """End of local step t (or of a hop waited at t): vote, commit, move votes on. A leaving client
    that a committed step left out says goodbye and ends with `Left`."""
    try:
        yield from m.agree(t, m.clock)
    except ExcludedError:
        if not m.leaving or m.node in m.roster.members:
            raise
        raise (yield from goodbye(m, t)) from None


def goodbye(m: Member, t: int) -> Generator[Command, Any, Left]:
    """A committed step has left this leaving client out: flood the LEAVE note, run the one
    exchange that hands it to every neighbour, close every edge (the neighbours close theirs
    before the same next exchange: edges.unlink) and return the one line it stops with."""
    step = m.agreement.through
    m.flood.originate_notes([leave_note(step, m.node, m.clock + 1)])
    yield from hop(m, t)
    for q in sorted(m.flood.peers):
        yield Part(q)
        m.flood.drop_peer(q)
    return Left(m.node, step)


def apply_through(m: Member, upto: int, t: int) -> Steps:
    """Apply every step <= upto, each once committed; the client hops on (as local step t) until it is."""
    while m.applied < upto:
        yield from apply_committed(m, m.applied + 1, t)


def apply_committed(m: Member, s: int, t: int) -> Steps:
    """Apply step s once it is committed and its messages are here, hopping on (as local step t,
    originating nothing) until then; audit the state if this step is audited."""
    p = m.protocol
    waited = 0
    heal_by: float | None = None  # past its patience: when it stops waiting for a down edge to heal
    while (msgs := m.voter.take(s)) is None:
        if waited >= p.patience_hops:
            if not m.healing:  # nothing that went down comes back by itself
                raise m.voter.stuck(s, waited)
            # an edge may heal anywhere in this client's part (a stalled member wakes, a cut
            # link comes back) and bring a majority: wait for it, paced, before stopping
            now = yield Now()
            if heal_by is None:
                heal_by = now + Protocol.HEAL_FACTOR * m.meet_timeout_s
            if now > heal_by:
                raise m.voter.stuck(s, waited)
            yield Idle()
        yield from hop(m, t)
        yield from agree(m, t)
        waited += 1
    m.history.append(s, msgs)
    if (cert := m.voter.certificates.pop(s, None)) is not None:
        m.certificates[s] = cert
    fresh = s >= m.logged
    yield Apply(s, msgs, fresh)
    m.applied = s
    if fresh and p.audits(s) and m.audits:
        value = audit_value((yield StateHash()))
        m.flood.originate_notes([Note(s, AUDIT, m.node, value)])
    check_admitted(m.node, s, m.joined_at, m.roster)
