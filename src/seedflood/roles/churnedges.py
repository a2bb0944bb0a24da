"""A churn client's edges (docs/churn-design.md: Graceful leave, Healed edges, Rejoin): the part of
`churn.Churn` that opens and closes them.

Owns: a graceful leave (`leave`: this client stops originating, hops on until a committed step
leaves it out, then floods a LEAVE note and closes its edges with its neighbours at the hop the
note names, raising `Left`; `unlink`, the neighbours' side), healing down edges to live members
and to a brand-new id before its admission (`heal`, `_heal_ok`, over a `transport.Healing`
transport; a client alone holds its hop clock), connecting rejoined edges on the shared hop clock
(`link`, with the committed messages a newcomer may lack since its catch-up: `_since_catch_up`),
and dropping lost peers and senders of bad frames (`after_exchange`, `on_bad_frame`).

Assumes: mixed into `churn.Churn`, which holds the state these methods read and write (declared
below for the type checker); which edges come up changes no vote, so nothing here touches safety.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from seedflood.core.flood.transport import Healing
from seedflood.core.membership.notes import Note, leave_note
from seedflood.core.wire.message import FrameError, Message
from seedflood.roles.churnbase import ChurnBase

log = logging.getLogger("seedflood.roles.churn")  # one logger for the churn client's lines


class Left(Exception):
    """This client left the run gracefully: a committed step left it out after it was asked to
    leave (`Churn.leave`), and its edges are closed. Its message is the one line to print;
    the process exits 0."""

    def __init__(self, node: int, step: int) -> None:
        super().__init__(f"node {node} left at step {step}")
        self.node = node
        self.step = step


class EdgeWork(ChurnBase):
    """The edge half of `churn.Churn` (a mixin: its state is Churn's)."""

    healer: Healing | None
    _links: dict[int, list[Note]]
    _heal_at: dict[int, int]
    _alone: int | None
    _unlink: dict[int, int]
    _parted: set[int]

    def leave(self) -> None:
        """Asked to leave (an in-process `leave` event, SIGTERM to a launched churn client): from
        the next step on this client originates nothing, so the voters' proposals leave it out
        like a silent client, and the step that commits without it is the same at every client.
        It keeps hopping (relaying, voting) until it commits that step itself (`agree`)."""
        self.leaving = True

    def unlink(self) -> None:
        """Right before exchange number `hops_run`: close the edges of neighbours whose LEAVE note
        names this hop (or an earlier one). The note travels straight from the leaver in the
        exchange before, so both ends close before the same exchange and nobody waits on an edge
        whose other end is gone (no timeout, no lost peer)."""
        h = self.host
        for q in sorted(q for q, at in self._unlink.items() if at <= h.hops_run):
            del self._unlink[q]
            self._parted.add(q)
            if q in h.flood.peers:
                self.transport.part(q)
                h.flood.drop_peer(q)
                log.info("node %d: node %d left gracefully; edge closed before hop %d", h.node, q, h.hops_run)

    def _goodbye(self, t: int) -> Left:
        """A committed step has left this leaving client out: flood the LEAVE note, run the one
        exchange that hands it to every neighbour, close every edge (the neighbours close theirs
        before the same next exchange: `unlink`) and return the one line it stops with."""
        h = self.host
        step = self.agreement.through
        h.flood.originate_notes([leave_note(step, h.node, h.hops_run + 1)])
        h.hop(t)
        for q in sorted(h.flood.peers):
            self.transport.part(q)
            h.flood.drop_peer(q)
        return Left(h.node, step)

    def _healable(self) -> dict[int, int | None]:
        """The down edges this client asks to heal (`_heal_ok`), less those agreed already and
        those to neighbours that left gracefully."""
        h = self.host
        return {
            q: inc
            for q, inc in self._heal_ok().items()
            if q not in h.flood.peers and q not in self._heal_at and q not in self._parted
        }

    def _heal_ok(self) -> dict[int, int | None]:
        """The edges this client may heal, -> the incarnation the other end must run as (None:
        its first life): while it is an admitted member, to every neighbour that is a member of
        its committed roster (as the roster admitted it) and to every brand-new id it expects
        (`_expected`: it grew its end, seeing the knock or the JOIN note, and no committed step
        has decided the join yet); while it is a brand-new id caught up and not yet admitted, to
        every member neighbour (the edges the join rule gave it). So a new id's edges, but its
        sponsor's, come up by the heal negotiation, not by a meeting at its link hop: a member
        the JOIN note never reached (a cut kept it from the sponsor's part) asks too, having seen
        the knock, and neither end waits on a meeting the other never joins. Edges carry frames;
        which come up changes no vote, so none of this touches safety."""
        h, a, roster = self.host, self.agreement, self.roster
        if h.node not in roster.members or roster.incarnations.get(h.node, a.incarnation) != a.incarnation:
            new = self.growth is not None and self.growth.new(h.node)
            if not new or a.through >= self.joined_at:  # joined_at: its JOIN step, once caught up
                return {}
            return {q: roster.incarnations.get(q) for q in self._neighbours() if q in roster.members}
        ok = {q: roster.incarnations.get(q) for q in self._neighbours() if q in roster.members}
        for j, e in list(self._expected.items()):
            if j in roster.members or any(j in dict(c.join) for c in roster.changes.values()):
                del self._expected[j]  # admitted: a member's edge from here on
            elif j in self._noted and a.through >= e:
                del self._expected[j]  # its JOIN step committed without it: it stops
            elif j in self._neighbours():
                ok[j] = 0  # a brand-new id's first life (a later one rejoins as a restart)
        return ok

    def heal(self) -> None:
        """Right before exchange number `hops_run`: ask the transport to heal the down edges to
        live members (never waiting), and connect those whose agreed exchange index is this one.
        Both ends connect right before the same exchange index (the transport's negotiation), so
        the edge's frames stay paired, and both then owe each other everything they hold
        (`Flood.add_peer`). A client with no edge at all has no exchanges to keep paired: its
        clock jumps to the agreed index (a stalled client wakes behind the others' clocks), and
        while it waits for an edge it holds its clock (it would race ahead)."""
        healer, h = self.healer, self.host
        if healer is None:
            return
        want = self._healable()
        if healer.peers or not (want or self._heal_at):
            self._alone = None
        else:
            # alone and waiting for an edge, an exchange with nobody pairs nothing, so the clock
            # holds where this client lost its last edge (at or behind every connected clock)
            # instead of racing ahead of them and having its edges agreed at an index the other
            # ends reach only after they have committed it out (graph repair: a member left alone;
            # a client whose neighbours all stalled, committed out so over gloo)
            self._alone = h.hops_run if self._alone is None else self._alone
            h.hops_run = self._alone
        if want:
            self._heal_at.update(healer.heal(want, h.hops_run))
        if not self._heal_at:
            return
        first = min(self._heal_at.values())
        if not healer.peers and h.hops_run < first:
            h.hops_run = self._jump(want, first) if self._alone is not None else first
            if self._alone is not None:
                self._alone = h.hops_run  # held from here if no edge comes up (never moved back)
        for q in sorted(q for q, at in self._heal_at.items() if at <= h.hops_run):
            at = self._heal_at.pop(q)
            if at < h.hops_run or q in h.flood.peers:
                continue  # never expected: the negotiation hands every index out ahead of the clock
            healer.restore(q)
            if q not in self._heal_ok():
                # committed out since the heal was agreed: close the edge at once, so the other
                # end's receive fails now (it stops and its restart rejoins) instead of waiting
                # out the late bound on a silent edge
                self.transport.drop(q, "committed out since the heal was agreed")
                continue
            h.flood.add_peer(q)
            self.health.heals += 1
            log.warning("node %d: edge to node %d healed at hop %d", h.node, q, at)

    def _jump(self, want: Mapping[int, int | None], first: int) -> int:
        """A client alone (its clock held) about to jump its clock to `first`, the lowest exchange
        index agreed so far: tell the negotiation that clock first, so that a proposal of its own
        below it is withdrawn rather than accepted after the jump (its other end would connect
        at an exchange this end has passed, and wait on it), or turns out accepted already (then
        that lower index is the one to jump to). Returns the index to jump to."""
        healer = self.healer
        assert healer is not None
        while pending := {q: i for q, i in want.items() if q not in self._heal_at}:
            self._heal_at.update(healer.heal(pending, first))
            if (low := min(self._heal_at.values())) == first:
                break
            first = low
        return first

    def link(self) -> None:
        """Right before exchange number `hops_run`: connect the edges of rejoining neighbours
        whose JOIN note names this hop. Every client of a connected run shares one hop clock
        (each exchange pairs the i-th frames of both ends of an edge, and a newcomer's clock
        starts at its sponsor's), so both ends of an edge connect at the same exchange, whatever
        steps they are at or wait in. One rule on both ends (their rosters agree): the newcomer
        connects its member neighbours, and each member connects it; a neighbour that is itself
        still rejoining connects neither way (connecting one end alone leaves the edge's hops
        unpaired). Each edge is a meeting (the transport connects it only if both ends ask
        within the host's `meet_timeout_s`): a client that gets the note only after its hop (a
        part farther than the note travels in delay + 1 steps, or cut off from a sponsor that
        stalled right after it sponsored) does not ask, and the edge stays down at both ends.
        A brand-new id's edges are not connected here: they heal (`_heal_ok`)."""
        h = self.host
        due = self._links.pop(h.hops_run, [])
        for k in [k for k in self._links if k < h.hops_run]:
            del self._links[k]
        edges: list[int] = []
        joining: dict[int, int] = {}  # newcomer this member connects -> its JOIN step
        for n in due:
            if self.growth is not None and self.growth.new(n.origin):
                continue  # a brand-new id's edges heal (`_heal_ok`)
            if n.origin == h.node:
                if n.value != self.agreement.incarnation:
                    continue  # an earlier incarnation's join
                edges += [q for q in self._neighbours() if q in self.roster.members]
            elif h.node in self.roster.members:
                edges.append(n.origin)
                joining[n.origin] = n.step
        edges = sorted({q for q in edges if q != h.node and q not in h.flood.peers and q in self._neighbours()})
        for q in self.transport.connect(edges, h.meet_timeout_s) if edges else []:
            h.flood.add_peer(q)
            if q in joining:
                h.flood.owe(q, self._since_catch_up(joining[q]))

    def _since_catch_up(self, e: int) -> list[Message]:
        """The committed messages this member applied of the steps a newcomer joining at step e
        may lack (`Protocol.owed_from`): until this hop it had them only through its sponsor,
        which may have failed before it relayed them, and the flood forgets a step once applied
        (`add_peer` owes none of them). At most 2·delay + 1 steps of N·K messages."""
        lo = self.host.protocol.owed_from(e)
        owed: list[Message] = []
        for s, msgs in reversed(self.history):
            if s < lo:
                break
            owed += msgs
        return owed

    def after_exchange(self, t: int) -> None:
        """Drop the peers the transport lost in this exchange: the flood stops sending to them."""
        h = self.host
        for peer, why in sorted(self.transport.take_lost().items()):
            log.warning("node %d: lost peer %d at step %d: %s", h.node, peer, t, why)
            h.flood.drop_peer(peer)
            self.health.drops += 1

    def on_bad_frame(self, peer: int, t: int, error: FrameError) -> None:
        """Nothing of the frame is taken; the edge to its sender closes, as if the sender had
        failed, so a peer that sends garbage, bogus ids or oversize frames is cut off by its
        neighbours and left out by a committed step like a silent client, and no honest client
        stops for it."""
        h = self.host
        log.warning("node %d: dropped peer %d at step %d: bad frame: %s", h.node, peer, t, error)
        self.transport.drop(peer, f"bad frame at step {t}: {error}")
        h.flood.drop_peer(peer)
        self.health.drops += 1
