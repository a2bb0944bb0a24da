"""Sponsoring and (re)joining, a member's decisions (docs/churn-design.md: Rejoin across processes,
A new id joins, A log server).

Owns, over a `member.Member`: whom to sponsor (`boundary`: a restarted neighbour, deferred while
its old incarnation is a member; `knock`: a brand-new id the join rule links this member to, seen
more than 2·spread exchanges ago, `look`, `knocking`), the sponsor's JOIN note and catch-up
(`sponsor`, `catch_up`, `base`: only the steps after a log server's prefix the newcomer holds,
where this chain has its digest), and the newcomer's side (`rejoin`: replay the decided steps,
hold the undecided ones, originate from the JOIN step). Generators yield `commands`.

Assumes: pure Python (the core); the driver does the sponsor's handshake (meet, challenge, the
newcomer's word of what it holds) and sends the catch-up.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

from seedflood.core.churn import prefix
from seedflood.core.churn.commands import (
    WARNING,
    ApplyAll,
    Claim,
    Clock,
    Command,
    Connect,
    Drop,
    Grow,
    Newcomers,
    Revived,
    Say,
    Sponsor,
)
from seedflood.core.churn.history import History
from seedflood.core.churn.member import Member
from seedflood.core.churn.prefix import Have
from seedflood.core.flood import stepstream
from seedflood.core.flood.hop import decode_hop, encode_hop
from seedflood.core.membership.notes import LEAVE, join_note
from seedflood.core.wire.message import FrameError, Message

Steps = Generator[Command, Any, None]


def boundary(m: Member, t: int) -> Steps:
    """Before step t: sponsor a restarted neighbour that is ours to catch up (its other edges
    connect later, at the hop its JOIN note names: edges.link)."""
    fresh = (yield Revived()) if m.originates(t) else []  # members sponsor
    # a restarted neighbour whose old incarnation is still a member waits until a committed step
    # has left it out: the new process must never vote or count as its old self
    e = m.edges
    revived = sorted(set(fresh) | e.deferred)
    e.deferred = {p for p in revived if p in m.roster.members}
    for p in (p for p in revived if p not in e.deferred):
        if (inc := (yield Claim(p))) is not None:  # None: another neighbour sponsors it
            yield from _sponsor(m, t, p, inc)


def knock(m: Member, t: int, hop: int) -> Steps:
    """Right before exchange `hop` of (or waited at) step t: look for knocks (`look`) and sponsor
    a brand-new id seen more than 2·spread exchanges ago (spread >= the graph's diameter d). An
    exchange completes only once each neighbour has started it, so by then every client within d
    hops of this one has started an exchange after the knock came, and looked before it: every
    member connected to this one sees the knock before the claim hides it. Counted in exchanges,
    not steps, so a member waiting for a commit (a split that a newcomer's edges may bridge)
    claims it too; a member with no edge up claims nobody."""
    for j in (yield from look(m, t, hop)):
        # only while an edge is up: a member that wakes from a stall finds its edges gone, is
        # behind and maybe committed out, and its exchanges with nobody take no time, so it would
        # win every claim with a stale view (the review's ring of 6: the newcomer was lost in most
        # in-process runs; found again by the explorer). Counted in exchanges run (the clock of a
        # member alone holds). So members all alone claim nobody (a stated limit)
        if m.flood.peers and m.exchanges - m.edges.knocked[j] > 2 * m.agreement.quiet:
            if (inc := (yield Claim(j))) is not None:
                yield from _sponsor(m, t, j, inc)


def _sponsor(m: Member, t: int, p: int, inc: int) -> Steps:
    """Sponsor claimed `p` (incarnation `inc`). An edge this member still holds to it belongs to
    an earlier incarnation that failed while this member could not see it (stalled: the review's
    sponsor that sleeps past its newcomer's restart): it is dropped first, as a lost peer."""
    if p in m.flood.peers:
        yield Say(WARNING, "node %d: node %d came back as incarnation %d: its old edge is dropped", (m.node, p, inc))
        yield Drop(p, f"restarted as incarnation {inc}")
        m.flood.drop_peer(p)
        m.health.drops += 1
    yield Sponsor(t, p, inc)


def look(m: Member, t: int, hop: int) -> Generator[Command, Any, list[int]]:
    """The brand-new ids knocking that the join rule links this member to (`knocking`). It grows
    its end of each edge, remembers the hop it first saw each (`knock` claims one 2·spread + 1
    exchanges later at the earliest) and expects it: the edge then heals before the newcomer is
    admitted (edges.heal_ok), even where this member never gets the JOIN note (a cut keeps it
    from the sponsor's part, and that edge may be its only path to the majority whose commit
    would admit the newcomer)."""
    knocking = yield from _knocking(m, t)
    e = m.edges
    e.seen = {j: e.seen.get(j, hop) for j in knocking}
    e.knocked = {j: e.knocked.get(j, m.exchanges) for j in knocking}
    for j in knocking:
        m.neighbours = yield Grow((j,))
        m.voter.expect(j, e.seen[j])
        if j not in e.noted:
            e.expected[j] = t + m.protocol.delay + 1
    return knocking


def _knocking(m: Member, t: int) -> Generator[Command, Any, list[int]]:
    """Brand-new ids this member would link to if a sponsor admitted them at the JOIN step of
    step t (t + delay + 1): the join rule over the graph committed through t − 1 − delay, which
    this client has applied (`growth.Growth`); only those it links to sponsor. An id that is a
    member already is not a newcomer: it rejoins as a restart, by its neighbours (`boundary`)."""
    g = m.growth
    if not m.grows or g is None or not m.originates(t) or m.node not in m.roster.members:
        return []
    e = t + m.protocol.delay + 1
    if m.agreement.through < e - g.lag:
        return []  # never expected: step t − 1 − delay is applied before step t
    knocking = [j for j in (yield Newcomers()) if j not in m.roster.members]
    return [j for j in knocking if m.node in g.edges(j, e, m.roster.changes)]


def sponsor(m: Member, t: int, p: int, inc: int, have: Have, hop: int) -> Generator[Command, Any, bytes]:
    """Before step t (clock `hop`), met and checked: admit neighbour `p` (incarnation `inc`) —
    flood its JOIN note, and return its catch-up. JOIN at e = t + delay + 1: the note gets the
    hops a message of step t gets before it is applied, so it normally reaches every voter
    before they propose step e. Its other edges connect at the hop index where step e's first
    hop falls if nobody waits: a hop index, not a step, because a client waiting for a commit
    hops on at its step, and because the newcomer and this sponsor may both wait before e for
    votes that only those edges can bring."""
    pr = m.protocol
    e = t + pr.delay + 1
    link = hop + pr.hops * (pr.delay + 1)
    note = join_note(e, p, inc, link)
    m.flood.originate_notes([note])
    yield from m.on_notes([note], hop)
    blob = catch_up(m, t, e, inc, hop, have)
    base = _base(m, have)
    yield Say(
        WARNING,
        "node %d: sponsoring node %d (incarnation %d): joins at step %d, its edges connect at hop %d; "
        "catch-up of %d bytes (%s)",
        (m.node, p, inc, e, link, len(blob), f"steps from {base}: it holds 0..{base - 1}" if base else "the whole log"),
    )
    return blob


def catch_up(m: Member, t: int, e: int, inc: int, hop: int, have: Have = prefix.NOTHING) -> bytes:
    """What a rejoining neighbour needs before step t (`stepstream.CatchUp`): every decided step
    (with its change; signed, with its seals) it does not hold already (`have`, checked by
    `_base`), the messages and notes held for undecided steps, its JOIN step."""
    base = _base(m, have)
    msgs, notes = m.flood.held_items()
    steps = [(s, step_payload(m, s, ms)) for s, ms in m.history[base:]]
    held = encode_hop(msgs, notes, signed=m.flood.signing is not None)  # signatures kept
    return stepstream.CatchUp(m.node, t, e, inc, steps, held, hop, base).to_bytes()


def _base(m: Member, have: Have) -> int:
    """The first step a catch-up for a newcomer that holds `have` carries: the one after
    `have.step` where this client applied that step and its chain has the newcomer's digest there,
    else 0 (the whole log: a prefix of another history, or one ahead of this client, is not built on)."""
    if have.step < 0:
        return 0
    if have.step < len(m.history) and m.agreement.digests.get(have.step) == have.digest:
        return have.step + 1
    return 0


def step_payload(m: Member, s: int, msgs: list[Message]) -> bytes:
    """Decided step s for the evaluator or a rejoining neighbour (`stepstream.encode_step`);
    signed, with the step's seals: its messages' signatures and the certificate of its commit
    (this client's, or its sponsor's when it rejoined; none for a step it replayed from a log)."""
    certificate = m.certificates.get(s, b"") if m.flood.signing is not None else None
    return stepstream.encode_step(msgs, m.roster.changes.get(s), certificate)


def rejoin(m: Member, blob: bytes, held: Sequence[tuple[int, bytes]] = ()) -> Generator[Command, Any, int]:
    """Catch up from a sponsor's payload (`catch_up`) as a restarted client: replay every decided
    step, hold the undecided ones, and originate from the JOIN step. `held`: the steps from 0
    this process fetched from a log server and checked, told the sponsor of, and takes below the
    catch-up's `base`. Returns the local step to run next."""
    pr = m.protocol
    d = stepstream.CatchUp.from_bytes(blob)
    if m.agreement.incarnation and d.incarnation != m.agreement.incarnation:
        raise FrameError(
            f"node {m.node}: node {d.sponsor}'s catch-up admits incarnation {d.incarnation}, "
            f"this process is incarnation {m.agreement.incarnation}"
        )
    if d.base > len(held):
        raise FrameError(f"node {m.node}: node {d.sponsor}'s catch-up starts at step {d.base}, past what it holds")
    if held and not d.base:
        yield Say(
            WARNING,
            "node %d: node %d sent its whole log: the log server's steps 0..%d are not its chain (left out)",
            (m.node, d.sponsor, len(held) - 1),
        )
    m.agreement.rejoin(d.incarnation, d.join_step)
    steps: list[tuple[int, list[Message]]] = []
    for s, payload in [*held[: d.base], *d.steps]:
        if s != len(steps):
            raise FrameError(f"node {m.node}: catch-up from node {d.sponsor} jumps to step {s}")
        msgs, change, certificate = stepstream.decode_signed_step(payload, s, seed_of=pr.seed)
        if certificate:  # the sponsor's proof of its commit, for the evaluator should it follow us
            m.certificates[s] = certificate
        # the chain is checked later, not here: this client commits nothing until a majority's
        # votes name the digest its replayed history ends on (a forked sponsor is found there)
        m.agreement.extend(s, msgs, change)
        pr.check_step(s, msgs, members=m.roster.members)
        steps.append((s, msgs))
    yield ApplyAll(steps)
    m.history = History(pr.seed, steps)
    m.applied = len(steps) - 1
    m.logged = len(steps)
    m.flood.applied_through = len(steps) - 1
    msgs, notes = decode_hop(d.held, pr.limits(0, 2**32 - 1))
    notes = [n for n in notes if n.kind != LEAVE]  # one hop: an earlier life's goodbye is not this one's
    m.flood.restore(msgs)
    m.flood.originate_notes(notes)
    m.clock = d.hop  # the sponsor's hop clock: this client's first exchange is its hop d.hop
    yield Clock(d.hop)
    yield from m.on_notes(notes, d.hop)
    m.voter.skip(len(steps))
    m.joined_at = d.join_step
    yield Connect((d.sponsor,), meet=False)
    m.flood.add_peer(d.sponsor)
    # a new id that never left: its first life, so it joins (every other catch-up rejoins)
    first = m.growth is not None and m.growth.new(m.node)
    first = first and not any(m.node in c.leave for c in m.roster.changes.values())
    yield Say(
        WARNING,
        "node %d: %s by replaying %d steps from node %d%s; originates from step %d",
        (
            m.node,
            "joined" if first else "rejoined",
            len(steps),
            d.sponsor,
            f" (steps 0..{d.base - 1} from the log server)" if d.base else "",
            m.joined_at,
        ),
    )
    return d.next_step
