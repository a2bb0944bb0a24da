"""A churn member's edge lifecycle (docs/churn-design.md: Graceful leave, Healed edges, Rejoin, A new
id joins): which edges it connects, heals, closes and grows, and when, as pure bookkeeping.

Owns `Edges`: the hop-indexed schedule of edge work and what it rests on —
- `links`: hop index -> the JOIN notes whose edges connect right before that exchange (`link`);
- `heal_at`: peer -> the exchange index its healed edge connects at (`heal`);
- `alone`: the hop clock held while the member has no edge and waits for one;
- `unlink`: leaving neighbour -> the exchange index its edge closes before; `parted`: neighbours
  that left gracefully (never healed);
- `seen`: a knocking brand-new id the member is linked to -> the hop it first saw it (`knocked`:
  -> the member's exchange count then, what its claim waits on); `expected`:
  a brand-new id it grew its end to, not yet admitted -> its JOIN step; `noted`: those whose JOIN
  step is the note's (else the knock's guess); `deferred`: restarted neighbours still members
  under their old incarnation (sponsored once a committed step left them out).
The generators here (`unlink`, `link`, `heal`) yield `commands` for the driver to run; which
edges come up changes no vote, so nothing here touches safety.

Assumes: pure Python (the core); `member.Member` owns one `Edges` and hands it its state.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from seedflood.core.churn.commands import INFO, WARNING, AskHeal, Clock, Command, Connect, Drop, Part, Restore, Say
from seedflood.core.membership.notes import Note
from seedflood.core.wire.message import Message

if TYPE_CHECKING:
    from seedflood.core.churn.member import Member

Steps = Generator[Command, Any, None]


@dataclass
class Edges:
    """The edge bookkeeping of one member (see the module doc)."""

    links: dict[int, list[Note]] = field(default_factory=dict)
    heal_at: dict[int, int] = field(default_factory=dict)
    alone: int | None = None
    unlink: dict[int, int] = field(default_factory=dict)
    parted: set[int] = field(default_factory=set)
    seen: dict[int, int] = field(default_factory=dict)
    knocked: dict[int, int] = field(default_factory=dict)
    expected: dict[int, int] = field(default_factory=dict)
    noted: set[int] = field(default_factory=set)
    deferred: set[int] = field(default_factory=set)


def unlink(m: Member, hop: int) -> Steps:
    """Right before exchange number `hop`: close the edges of neighbours whose LEAVE note names
    this hop (or an earlier one). The note travels straight from the leaver in the exchange
    before, so both ends close before the same exchange and nobody waits on an edge whose other
    end is gone (no timeout, no lost peer)."""
    e = m.edges
    for q in sorted(q for q, at in e.unlink.items() if at <= hop):
        del e.unlink[q]
        e.parted.add(q)
        if q in m.flood.peers:
            yield Part(q)
            m.flood.drop_peer(q)
            yield Say(INFO, "node %d: node %d left gracefully; edge closed before hop %d", (m.node, q, hop))


def heal_ok(m: Member) -> dict[int, int | None]:
    """The edges this member may heal, -> the incarnation the other end must run as (None: its
    first life): while it is an admitted member, to every neighbour that is a member of its
    committed roster (as the roster admitted it) and to every brand-new id it expects
    (`expected`: it grew its end, seeing the knock or the JOIN note, and no committed step has
    decided the join yet); while it is a brand-new id caught up and not yet admitted, to every
    member neighbour (the edges the join rule gave it). So a new id's edges, but its sponsor's,
    come up by the heal negotiation, not by a meeting at its link hop: a member the JOIN note never
    reached (a cut kept it from the sponsor's part) asks too, having seen the knock, and neither
    end waits on a meeting the other never joins."""
    a, roster, e = m.agreement, m.agreement.roster, m.edges
    if m.node not in roster.members or roster.incarnations.get(m.node, a.incarnation) != a.incarnation:
        new = m.growth is not None and m.growth.new(m.node)
        if not new or a.through >= m.joined_at:  # joined_at: its JOIN step, once caught up
            return {}
        return {q: roster.incarnations.get(q) for q in m.neighbours if q in roster.members}
    ok = {q: roster.incarnations.get(q) for q in m.neighbours if q in roster.members}
    for j, step in list(e.expected.items()):
        if j in roster.members or any(j in dict(c.join) for c in roster.changes.values()):
            del e.expected[j]  # admitted: a member's edge from here on
        elif j in e.noted and a.through >= step:
            del e.expected[j]  # its JOIN step committed without it: it stops
        elif j in m.neighbours:
            ok[j] = 0  # a brand-new id's first life (a later one rejoins as a restart)
    return ok


def healable(m: Member) -> dict[int, int | None]:
    """The down edges this member asks to heal (`heal_ok`), less those agreed already and those
    to neighbours that left gracefully."""
    e = m.edges
    return {
        q: inc for q, inc in heal_ok(m).items() if q not in m.flood.peers and q not in e.heal_at and q not in e.parted
    }


def heal(m: Member, hop: int, connected: bool) -> Generator[Command, Any, int]:
    """Right before exchange number `hop` (`connected`: the transport has an edge up): ask to heal
    the down edges to live members (never waiting), and connect those whose agreed exchange index
    is this one. Both ends connect right before the same exchange index (the transport's
    negotiation), so the edge's frames stay paired, and both then owe each other everything they
    hold (`Flood.add_peer`). A member with no edge at all has no exchanges to keep paired: its
    clock jumps to the agreed index (a stalled client wakes behind the others' clocks), and while
    it waits for an edge it holds its clock (it would race ahead). Returns the hop clock after."""
    e = m.edges
    want = healable(m)
    if connected or not (want or e.heal_at):
        e.alone = None
    else:
        # alone and waiting for an edge, an exchange with nobody pairs nothing, so the clock
        # holds where this member lost its last edge (at or behind every connected clock)
        # instead of racing ahead of them and having its edges agreed at an index the other
        # ends reach only after they have committed it out (graph repair: a member left alone;
        # a client whose neighbours all stalled, committed out so over gloo)
        e.alone = hop if e.alone is None else e.alone
        if hop != e.alone:
            hop = e.alone
            yield Clock(hop)
    # asked even when nothing is wanted: a proposal of this end to a peer committed out since is
    # withdrawn there, or handed back if the peer took it first (then it is connected and closed
    # below, so the taker's receive fails at once instead of after the late bound)
    e.heal_at.update((yield AskHeal(want, hop)))
    if not e.heal_at:
        return hop
    first = min(e.heal_at.values())
    if not connected and hop < first:
        hop = (yield from _jump(m, want, first)) if e.alone is not None else first
        yield Clock(hop)
        if e.alone is not None:
            e.alone = hop  # held from here if no edge comes up (never moved back)
    for q in sorted(q for q, at in e.heal_at.items() if at <= hop):
        at = e.heal_at.pop(q)
        if at < hop or q in m.flood.peers:
            continue  # never expected: the negotiation hands every index out ahead of the clock
        yield Restore(q)
        if q not in heal_ok(m):
            # committed out since the heal was agreed: close the edge at once, so the other end's
            # receive fails now (it stops and its restart rejoins) instead of waiting out the
            # late bound on a silent edge
            yield Drop(q, "committed out since the heal was agreed")
            continue
        m.flood.add_peer(q)
        m.health.heals += 1
        yield Say(WARNING, "node %d: edge to node %d healed at hop %d", (m.node, q, at))
    return hop


def _jump(m: Member, want: Mapping[int, int | None], first: int) -> Generator[Command, Any, int]:
    """A member alone (its clock held) about to jump its clock to `first`, the lowest exchange
    index agreed so far: tell the negotiation that clock first, so that a proposal of its own
    below it is withdrawn rather than accepted after the jump (its other end would connect at an
    exchange this end has passed, and wait on it), or turns out accepted already (then that lower
    index is the one to jump to). Returns the index to jump to."""
    e = m.edges
    while pending := {q: i for q, i in want.items() if q not in e.heal_at}:
        e.heal_at.update((yield AskHeal(pending, first)))
        if (low := min(e.heal_at.values())) == first:
            break
        first = low
    return first


def link(m: Member, hop: int) -> Steps:
    """Right before exchange number `hop`: connect the edges of rejoining neighbours whose JOIN
    note names this hop. Every client of a connected run shares one hop clock (each exchange pairs
    the i-th frames of both ends of an edge, and a newcomer's clock starts at its sponsor's), so
    both ends of an edge connect at the same exchange, whatever steps they are at or wait in. One
    rule on both ends (their rosters agree): the newcomer connects its member neighbours, and each
    member connects it; a neighbour that is itself still rejoining connects neither way. Each edge
    is a meeting (the transport connects it only if both ends ask within the meeting timeout): a
    client that gets the note only after its hop does not ask, and the edge stays down at both
    ends. A brand-new id's edges are not connected here: they heal (`heal_ok`)."""
    e, roster = m.edges, m.agreement.roster
    due = e.links.pop(hop, [])
    for k in [k for k in e.links if k < hop]:
        del e.links[k]
    edges: list[int] = []
    joining: dict[int, int] = {}  # newcomer this member connects -> its JOIN step
    for n in due:
        if m.growth is not None and m.growth.new(n.origin):
            continue  # a brand-new id's edges heal (`heal_ok`)
        if n.origin == m.node:
            if n.value != m.agreement.incarnation:
                continue  # an earlier incarnation's join
            edges += [q for q in m.neighbours if q in roster.members]
        elif m.node in roster.members:
            edges.append(n.origin)
            joining[n.origin] = n.step
    edges = sorted({q for q in edges if q != m.node and q not in m.flood.peers and q in m.neighbours})
    for q in (yield Connect(tuple(edges))) if edges else []:
        m.flood.add_peer(q)
        if q in joining:
            m.flood.owe(q, since_catch_up(m, joining[q]))


def since_catch_up(m: Member, join_step: int) -> list[Message]:
    """The committed messages this member applied of the steps a newcomer joining at `join_step`
    may lack (`Protocol.owed_from`): until this hop it had them only through its sponsor, which
    may have failed before it relayed them, and the flood forgets a step once applied (`add_peer`
    owes none of them). At most 2·delay + 1 steps of N·K messages."""
    lo = m.protocol.owed_from(join_step)
    owed: list[Message] = []
    for s, msgs in reversed(m.history):
        if s < lo:
            break
        owed += msgs
    return owed
