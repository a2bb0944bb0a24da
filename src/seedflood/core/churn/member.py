"""A churn member as one deterministic state machine (docs/churn-design.md): what a churn client
decides, with no I/O of its own.

Owns `Member`: the committed chain and this client's votes (`agreement.Agreement`, built here
with its settings, driven by its `voter.Voter`), every decided step (`history`, with the
certificates of a signed run), its clocks (`clock`: the index of its next exchange;
`next_step`; `applied`: the last step applied), the step it originates from (`joined_at`),
whether it is leaving (`leaving`), its edge lifecycle (`edges.Edges`) and its health counters.
Each entry point is a generator: it yields `commands` (exchange, set the clock, connect, part,
drop, ask to heal, restore, grow, claim, sponsor, apply, log) and is sent each one's result by
whoever runs it (roles/churn.py on a transport; tests/explorer.py on a simulated network), which
does the I/O. The time is an input (`commands.Now`), so a trace of (command, result) pairs
replayed into a fresh member yields the same commands.

The decisions, and where each lives: the order of a step and a hop, how long to wait for a
commit, a leaver's goodbye (loop.py), voting and committing (`agree`, the voter), sponsoring a
restarted neighbour or a brand-new id (joining.boundary, joining.knock), a newcomer's catch-up
and rejoin (joining.py), graceful leave (`leave`, edges.unlink), heals, links and lost peers
(edges.py), graph repair after a committed leave (`repair`).

Assumes: pure Python (the core); the member owns its flood's membership bookkeeping but not its
exchanges (the driver's host runs the hops); one thread uses it at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

from seedflood.core.churn.agreement import Agreement
from seedflood.core.churn.commands import WARNING, Command, Drop, Grow, Say
from seedflood.core.churn.edges import Edges
from seedflood.core.churn.health import Health
from seedflood.core.churn.history import History
from seedflood.core.churn.voter import Voter
from seedflood.core.flood.flooding import Flood
from seedflood.core.flood.protocol import Protocol
from seedflood.core.membership.growth import Growth
from seedflood.core.membership.notes import JOIN, LEAVE, Note, link_hop
from seedflood.core.membership.roster import Change, Roster
from seedflood.core.wire.message import FrameError, Limits, Message

Steps = Generator[Command, Any, None]
Records = Sequence[tuple[int, Sequence[Message]]]


class Left(Exception):
    """This client left the run gracefully: a committed step left it out after it was asked to
    leave (`Member.leave`), and its edges are closed. Its message is the one line to print;
    the process exits 0."""

    def __init__(self, node: int, step: int) -> None:
        super().__init__(f"node {node} left at step {step}")
        self.node = node
        self.step = step


class Member:
    """One churn client's decisions (see the module doc). `grows`: its transport can add edges
    (brand-new ids, graph repair); `healing`: its down edges heal."""

    def __init__(
        self,
        protocol: Protocol,
        flood: Flood,
        node: int,
        *,
        incarnation: int,
        attach: int,
        neighbours: Sequence[int] = (),
        growth: Growth | None = None,
        grows: bool = False,
        healing: bool = False,
        liars: dict[int, str] | None = None,
        on_error: Callable[[str], None] = lambda _: None,
        meet_timeout_s: float = 0.0,
        audits: bool = False,
    ) -> None:
        p = protocol
        self.protocol = protocol
        self.flood = flood
        self.node = node
        self.agreement = Agreement(node, p.ids, p.perturbations, incarnation, p.roster(attach=attach), due=p.due)
        """The committed chain and roster, and this client's votes."""
        self.voter = Voter(p, flood, self.agreement, on_error, growth=growth, liars=liars)
        self.growth = growth
        """The join rule of a run open to new ids (churn.max_nodes) and graph repair
        (churn.repair), None where neither is on."""
        self.grows = growth is not None and grows
        self.healing = healing
        self.neighbours: tuple[int, ...] = tuple(neighbours)
        """Topology neighbours, connected or not (what its transport may connect): an input, as
        the driver's transport holds them before each hop (`loop.hop`) and after each `Grow`."""
        self.history = History(p.seed)
        """Every decided step from 0 (packed), what a sponsor hands a rejoining neighbour."""
        self.certificates: dict[int, bytes] = {}  # signed: step -> the certificate of its commit
        self.joined_at = 0  # first step this client originates (a rejoined client: its JOIN step)
        self.leaving = False
        """Asked to leave (`leave`): originates nothing more, sponsors nobody, and ends with
        `Left` once a committed step leaves it out."""
        self.edges = Edges()
        self.health = Health()  # counts for the sinks: nothing decides on them
        self.meet_timeout_s = meet_timeout_s
        """Seconds a meeting waits (the driver's transport setting): the wait past patience is
        HEAL_FACTOR of them."""
        self.audits = audits  # this client can hash its state (audited runs)
        self.clock = 0  # the hop clock: the index of this client's next exchange
        self.exchanges = 0  # exchanges run (never held or jumped, unlike the clock)
        self.next_step = 0  # the next local step to run
        self.applied = -1  # the last step applied (to the model: `Apply`, `ApplyAll`)
        self.logged = 0  # steps that came from a log or a catch-up (applied, not told to the listeners again)
        self._limits: tuple[int, Limits] | None = None  # (step, its wire limits): a step has `hops` hops

    def limits(self, t: int) -> Limits:
        """`protocol.wire_limits(t)`, made once per step."""
        if self._limits is None or self._limits[0] != t:
            self._limits = (t, self.protocol.wire_limits(t))
        return self._limits[1]

    @property
    def roster(self) -> Roster:
        """The committed roster: members of the next step to commit; `roster.changes` holds every
        committed change (step -> Change)."""
        return self.agreement.roster

    @property
    def changes(self) -> Mapping[int, Change]:
        return self.roster.changes

    def originates(self, t: int) -> bool:
        """Whether local step t originates: a rejoining client from its JOIN step, a leaving one never."""
        return t >= self.joined_at and not self.leaving

    def resume(self, records: Records, cut: int, changes: Mapping[int, Change]) -> None:
        """Every logged step is committed (keeping its decision); those >= cut wait to be applied."""
        for s, msgs in records:
            self.agreement.extend(s, msgs, changes.get(s), pending=s >= cut)
        self.history = History(self.protocol.seed, records[:cut])
        self.voter.skip(len(records))
        self.applied = cut - 1  # the client applies those before its first step
        self.next_step = self.logged = len(records)

    def leave(self) -> None:
        """Asked to leave: from the next step on this client originates nothing, so the voters'
        proposals leave it out like a silent client, and the step that commits without it is the
        same at every client. It keeps hopping (relaying, voting) until it commits that step
        itself (`agree`)."""
        self.leaving = True

    # -- notes and hops -----------------------------------------------------------------------
    def on_notes(self, new: Sequence[object], hop: int, sender: int | None = None) -> Steps:
        """Remember the JOIN notes among `new` by the hop index their edges connect at, and the
        LEAVE note of `sender` itself by the hop index its edge closes before: only the leaver's
        own frame closes its edge (it carries the note first, straight from it), so a relay
        cannot close the edge between two others with a LEAVE note it made up."""
        for n in new:
            if isinstance(n, Note) and n.kind == JOIN:
                yield from self.grow(n.origin, n.step)
            if isinstance(n, Note) and n.kind == JOIN and link_hop(n) >= hop:
                self.edges.links.setdefault(link_hop(n), []).append(n)
            if isinstance(n, Note) and n.kind == LEAVE and n.origin == sender and sender in self.flood.peers:
                self.edges.unlink[n.origin] = n.value

    def after_exchange(self, t: int, lost: Mapping[int, str]) -> Steps:
        """Drop the peers the transport lost in this exchange: the flood stops sending to them."""
        for peer, why in sorted(lost.items()):
            yield Say(WARNING, "node %d: lost peer %d at step %d: %s", (self.node, peer, t, why))
            self.flood.drop_peer(peer)
            self.health.drops += 1

    def on_bad_frame(self, peer: int, t: int, error: FrameError) -> Steps:
        """Nothing of the frame is taken; the edge to its sender closes, as if the sender had
        failed, so a peer that sends garbage, bogus ids or oversize frames is cut off by its
        neighbours and left out by a committed step like a silent client, and no honest client
        stops for it."""
        yield Say(WARNING, "node %d: dropped peer %d at step %d: bad frame: %s", (self.node, peer, t, error))
        yield Drop(peer, f"bad frame at step {t}: {error}")
        self.flood.drop_peer(peer)
        self.health.drops += 1

    def grow(self, node: int, step: int) -> Steps:
        """A brand-new id `node` joins at `step` (its JOIN note, or the committed step that
        admitted it): add the edges the join rule gives it at this end, the newcomer's own or this
        member's one to it (`growth.Growth.edges`). A client that has not committed step − lag yet
        cannot tell; it adds the edge when it commits `step`, and the edge heals then."""
        g, me = self.growth, self.node
        if not self.grows or g is None or not g.new(node) or self.agreement.through < step - g.lag:
            return
        edges = g.edges(node, step, self.roster.changes)
        if node == me:
            self.neighbours = yield Grow(tuple(edges))
        elif me in edges:
            self.neighbours = yield Grow((node,))
            if node not in self.roster.members:  # expected: its edge heals before admission too
                self.edges.expected[node] = step
                self.edges.noted.add(node)

    # -- agreement ----------------------------------------------------------------------------
    def agree(self, t: int, hop: int) -> Steps:
        """End of local step t (or of a hop waited at t; `hop` the clock): vote, commit, move
        votes on, and grow the edges committed joins and repairs give this member. Raises
        `ExcludedError` where a committed step left it out (loop.agree: a leaver's goodbye)."""
        for s, change in self.voter.after(t, hop):
            mine = self.agreement.mine.get(s)
            self.health.commit(s, hop, None if mine is None else mine.ballot)
            if change:
                yield Say(WARNING, "node %d: membership %s", (self.node, change.describe()))
            for j, _ in change.join:
                yield from self.grow(j, change.step)
            if change.leave:
                yield from self.repair(change.step)

    def repair(self, step: int) -> Steps:
        """Committed step `step` left members out: add this member's ends of the edges graph
        repair gives the graph committed through it (`growth.Growth.repaired`: the same at every
        client that commits it). Each edge then heals like any down edge between live members."""
        g, me = self.growth, self.node
        if not self.grows or g is None or not g.repair or me not in self.roster.members:
            return
        for a, b in g.repaired(self.roster.changes, step):
            if me in (a, b):
                other = b if me == a else a
                self.neighbours = yield Grow((other,))
                yield Say(WARNING, "node %d: graph repair after step %d links node %d", (me, step, other))
