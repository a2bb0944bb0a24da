"""The flood as a pure state machine over integer neighbour ids.

Owns: which messages a node has seen, what it still owes each neighbour, when a step is complete,
and forgetting old steps. It knows nothing of bytes, processes or models: a hop is
`outbox()` on every node, delivery, then `receive()` on every node, driven by the caller.

Rules (docs/design.md, Vocabulary; Processes and the step loop):
- a message new to this node is forwarded to every neighbour except those known to have it
  (the one it came from, any other that also sent it, and any we already sent it to); with
  `routes` (graph.Topology.routes) only to the neighbours one hop further from its origin,
  which reach every node at the same hop with fewer copies;
- a step is complete when it holds all `per_origin` messages of every member origin due at it
  (`due(origin, step)`, the protocol's zo.stride schedule; None: every member every step);
- steps are handed out for application strictly in order, each once; after that every message of
  an applied step is a duplicate by construction (completeness means we saw all of them), so the
  node forgets the step's ids and only remembers `applied_through`.
Two copies of one id that differ in seed or scalar are a protocol violation: in a strict run a
`FloodError`; under churn evidence against their origin, never a crash of the receiver
(docs/churn-design.md, Equivocation): the first copy is the one held, the origin is named in
`conflicts` (the agreement leaves it out of what this node proposes), and the node that sees
two copies of one id floods both as COPY notes (membership.copy_note), so every client comes
to hold the same evidence however the copies were spread. A frame carries one copy per id, a
note can carry the other. Bounded: a node keeps and forwards at most two copies of an id
(`MAX_COPIES`), whatever an origin sends. `copies(step, origins)` hands every held copy to a
client that must pick the one a majority committed. Signed votes are evidence the same way: two
different votes an origin signed in one ballot have two ids (membership.Note.id), so both flood
and every client comes to hold the proof; the origin is named in `conflicts`, and at most
MAX_COPIES votes of one ballot are kept.

Churn (docs/churn-design.md, Notes on the wire): notes (membership.Note: joins, audits) flood exactly like messages
but are kept for `note_horizon` steps after their step is applied (a later decision reads them),
except a LEAVE note, which travels one hop: its origin sends it to its neighbours, nobody relays
it or owes it to a newcomer (only the leaver's neighbours act on it, and only on the leaver's own
frame, so neither a relay nor a later incarnation of the leaver can close another edge with it);
neighbours come and go (`drop_peer`, and `add_peer`, which owes the newcomer everything held;
`owe` adds what a newcomer may lack of steps applied already);
and `take_step(step, origins)` hands out a decided step's messages from the given origins only,
without the completeness check (the caller decided the step by the churn rule).

A signed run (`signing`, flood.signing): what this node originates is sealed with its key; an item
received without a valid signature by someone who may sign it is counted (`stats.forged`) and
dropped before anything else looks at it, so it is never held, forwarded, voted on or applied.

Assumes: message ids were validated by the codec (origin < n_origins, k < per_origin).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

from seedflood.core.flood.signing import Signing
from seedflood.core.membership.notes import COPY, LEAVE, VOTE, Note, copied, copy_note
from seedflood.core.wire.message import Message

MessageId = tuple[int, int, int]  # (origin, step, k)
NoteId = tuple  # (kind, origin, step[, ballot or k[, the copy]]): membership.Note.id
Item = Message | Note
_canonical = attrgetter("step", "origin", "k", "seed", "scalar")  # Message's order, as a sort key
MAX_COPIES = 2  # distinct copies of one message id (or signed votes of one ballot) a node keeps and forwards


def _two_copies(a: Message, b: Message) -> str:
    """What differs between two copies of one id, in a few words."""
    what = f"scalars {a.scalar:.9g} and {b.scalar:.9g}"
    return what if a.seed == b.seed else f"{what}, seeds {a.seed} and {b.seed}"


class FloodError(RuntimeError):
    """The flood reached a state the protocol forbids (conflicting copies, incomplete due step)."""


@dataclass
class FloodStats:
    originated: int = 0
    received: int = 0
    new: int = 0
    duplicates: int = 0
    forwarded: int = 0
    forged: int = 0
    """Items received without a valid signature (a signed run): dropped, never held or applied."""


class Flood:
    def __init__(
        self,
        node: int,
        peers: Sequence[int],
        members: Iterable[int],
        per_origin: int = 1,
        routes: Mapping[int, Sequence[int]] | None = None,
        note_horizon: int = 64,
        tolerate_conflicts: bool = False,
        signing: Signing | None = None,
        due: Callable[[int, int], bool] | None = None,
    ) -> None:
        self.node = node
        self.due = due
        """(origin, step) -> origin originates at step (protocol.Protocol.due); None: always."""
        self.signing = signing
        """A signed run: what this node originates is sealed, what it receives must be authentic."""
        self.peers: tuple[int, ...] = tuple(sorted(peers))
        # origin -> neighbours its messages are forwarded to (None: every neighbour)
        self.routes: dict[int, frozenset[int]] | None = None
        if routes is not None:
            self.routes = {o: frozenset(ps) for o, ps in routes.items()}
            if stray := {p for ps in self.routes.values() for p in ps} - set(self.peers):
                raise FloodError(f"node {self.node}: routes name non-neighbours {sorted(stray)}")
        self.members: frozenset[int] = frozenset(members)
        self.per_origin = per_origin
        self.applied_through = -1  # every step <= this was handed out and forgotten
        self.stats = FloodStats()
        self.note_horizon = note_horizon  # notes of steps < applied_through - this are forgotten
        self.tolerate_conflicts = tolerate_conflicts
        self.conflicts: dict[int, str] = {}
        """origin -> the first pair of conflicting copies of one of its ids (churn: evidence)."""
        self._store: dict[int, dict[MessageId, Message]] = {}  # step -> id -> message
        # id -> its distinct copies, for ids that had a second copy or a COPY note
        self._copies: dict[MessageId, list[Message]] = {}
        self._notes: dict[int, dict[NoteId, Note]] = {}  # step -> id -> note
        # (step, kind) -> `notes(step, kind)` as last sorted, dropped when a note of it comes or goes
        # (a client reads a step's votes after every hop; most hops add none)
        self._sorted: dict[tuple[int, int], list[Note]] = {}
        self._known: dict[MessageId | NoteId, set[int]] = {}  # id -> peers that have it
        self._pending: dict[int, dict[MessageId | NoteId, Item]] = {p: {} for p in self.peers}

    # -- traffic -------------------------------------------------------------------------------
    def originate(self, messages: Iterable[Message]) -> None:
        """Add this node's own messages; they go to every neighbour."""
        for m in messages:
            if m.origin != self.node:
                raise FloodError(f"node {self.node} cannot originate a message of origin {m.origin}")
            if self.signing is not None:
                m = self.signing.seal(m)
            if not self._add(m, source=None):
                raise FloodError(f"message {m.id} originated twice")
            self.stats.originated += 1

    def originate_notes(self, notes: Iterable[Note]) -> None:
        """Add notes this node made (an audit of its state, a join it sponsors)."""
        for n in notes:
            self._add(n if self.signing is None else self.signing.seal(n), source=None)

    def receive(self, peer: int, messages: Iterable[Item]) -> list[Item]:
        """Take a neighbour's messages and notes; returns those new to this node."""
        if peer not in self._pending:
            raise FloodError(f"node {self.node} received from {peer}, which is not a neighbour")
        new = []
        for m in messages:
            self.stats.received += 1
            if self.signing is not None and not self.signing.authentic(m):
                self.stats.forged += 1  # never held, forwarded or applied
                continue
            if self._add(m, source=peer):
                new.append(m)
                self.stats.new += 1
            else:
                self.stats.duplicates += 1
        return new

    def restore(self, messages: Iterable[Message]) -> None:
        """Hold messages that every node already has (a resume from the log): they count towards
        completeness and are never sent. Their steps must not be applied yet."""
        for m in messages:
            if m.step <= self.applied_through:
                raise FloodError(f"cannot restore message {m.id}: step {m.step} is already applied")
            step = self._store.setdefault(m.step, {})
            if m.id in step:
                raise FloodError(f"message {m.id} restored twice")
            step[m.id] = m
            self._known[m.id] = set(self.peers)

    def outbox(self) -> dict[int, list[Item]]:
        """What to send each neighbour this hop (messages, then notes, each canonically
        ordered); clears it."""
        out: dict[int, list[Item]] = {}
        known_of = self._known
        for peer, pending in self._pending.items():
            for i in pending:
                known = known_of.get(i)
                if known is not None:
                    known.add(peer)
            items: list[Item] = list(pending.values())
            if len(items) > 1:
                msgs: list[Item] = sorted((m for m in items if isinstance(m, Message)), key=_canonical)
                msgs += sorted(n for n in items if isinstance(n, Note))
                items = msgs
            pending.clear()
            out[peer] = items
            self.stats.forwarded += len(items)
        return out

    def _add(self, m: Item, source: int | None) -> bool:
        """Record m; True if it is new. Queues it for every neighbour not known to have it."""
        if type(m) is Message:  # the hot path: `_add_note`'s rules for a plain message
            step = m.step
            if step <= self.applied_through:
                return False  # its step is complete and applied: we have seen it
            held = self._store.get(step)
            if held is None:
                held = self._store[step] = {}
            mid = (m.origin, step, m.k)
            old = held.get(mid)
            if old is not None or mid in self._copies:
                return self._add_note(m, source)  # a second copy, or one a COPY note named: the full rules
            held[mid] = m
            known = {source} if source is not None else set()
            self._known[mid] = known
            pending = self._pending
            for p in self.peers if self.routes is None else self.routes.get(m.origin, ()):
                if p not in known:
                    pending[p][mid] = m
            return True
        return self._add_note(m, source)

    def _add_note(self, m: Item, source: int | None) -> bool:
        """`_add` for a note, a message subclass, or a message id seen before."""
        if isinstance(m, Note):
            if m.step < self.applied_through - self.note_horizon:
                return False  # too old to matter, and forgotten
            if m.kind == COPY and not self._witness(copied(m)):
                return False  # a copy of an applied step, or past the bound: dropped
            notes = self._notes.setdefault(m.step, {})
            old: Item | None = notes.get(m.id)
        elif m.step <= self.applied_through:
            return False  # its step is complete and applied: we have seen it
        else:
            msgs = self._store.setdefault(m.step, {})
            old = msgs.get(m.id)
        if old is not None:
            if old != m:
                if not self.tolerate_conflicts:
                    raise FloodError(f"conflicting copies of message {m.id}: {old} vs {m}")
                if isinstance(m, Message):
                    self._witness(m)
                else:  # a note (a vote) sent twice with different contents
                    self.conflicts.setdefault(m.origin, f"two copies of {m.id}: {old} vs {m}")
            if source is not None:
                self._known[m.id].add(source)
                self._pending[source].pop(m.id, None)
            return False
        if isinstance(m, Note):
            if m.kind == VOTE and m.sig and not self._second_vote(m, notes.values()):
                return False
            notes[m.id] = m
            self._sorted.pop((m.step, m.kind), None)
        else:
            msgs[m.id] = m
            if m.id in self._copies:
                self._witness(m)  # a COPY note of this id came first
        known = {source} if source is not None else set()
        self._known[m.id] = known
        targets = self.peers if self.routes is None or isinstance(m, Note) else self.routes.get(m.origin, ())
        if isinstance(m, Note) and m.kind == LEAVE and source is not None:
            targets = ()  # one hop: never relayed
        for p in targets:
            if p not in known:
                self._pending[p][m.id] = m
        return True

    def _witness(self, m: Message) -> bool:
        """Note copy `m` of its id (churn); False if it is dropped (its step was applied, or the
        id already has MAX_COPIES other copies). The moment an id has two copies: its origin is
        named in `conflicts`, and both copies flood as COPY notes (evidence for every client)."""
        if m.step <= self.applied_through:
            return False
        held = self._store.get(m.step, {}).get(m.id)
        copies = self._copies.setdefault(m.id, [held] if held is not None else [])
        if m not in copies:
            if len(copies) >= MAX_COPIES:
                return False
            copies.append(m)
            if len(copies) == 2:
                a, b = copies
                self.conflicts.setdefault(m.origin, f"two copies of {m.id}: {_two_copies(a, b)}")
                self.originate_notes([copy_note(a), copy_note(b)])  # new ids only; repeats are no-ops
        return True

    def _second_vote(self, vote: Note, held: Iterable[Note]) -> bool:
        """A signed vote with a new body (flood.signing vouched for it): False if its origin's
        ballot (same incarnation: a vote body's first 4 bytes) already has MAX_COPIES votes
        here; the second one names the origin in `conflicts` and floods with the first, the
        proof of a double vote every client comes to hold."""
        same = [
            n for n in held if (n.kind, n.origin, n.value, n.body[:4]) == (VOTE, vote.origin, vote.value, vote.body[:4])
        ]
        if len(same) >= MAX_COPIES:
            return False
        if same:
            self.conflicts.setdefault(vote.origin, f"two signed votes in ballot {vote.value} of step {vote.step}")
        return True

    def copies(self, step: int, origins: Iterable[int]) -> list[list[Message]]:
        """Every copy seen of each held message of `step` from `origins`, canonically ordered:
        one list per id (more than one only where an origin equivocated)."""
        return [self._copies.get(m.id) or [m] for m in self.messages(step, origins)]

    def choose(self, chosen: Iterable[Message]) -> None:
        """Hold these copies (each one of `copies`) in place of the first ones, before `take_step`
        hands the step out (a client applies the copy a majority committed)."""
        for m in chosen:
            self._store[m.step][m.id] = m

    # -- completeness --------------------------------------------------------------------------
    def expected(self, step: int) -> list[int]:
        """The member origins due at `step`, ascending."""
        due = self.due
        return sorted(self.members if due is None else (o for o in self.members if due(o, step)))

    def is_complete(self, step: int) -> bool:
        """All messages of `step` from every member origin due at it are here (or it was applied)."""
        if step <= self.applied_through:
            return True
        have = self._store.get(step, {})
        origins = self.members if self.due is None else self.expected(step)
        return len(have) >= len(origins) * self.per_origin and all(
            (o, step, k) in have for o in origins for k in range(self.per_origin)
        )

    def missing(self, step: int) -> list[MessageId]:
        have = self._store.get(step, {})
        return [(o, step, k) for o in self.expected(step) for k in range(self.per_origin) if (o, step, k) not in have]

    def pop_step(self, step: int) -> list[Message]:
        """Hand out the next step's messages in canonical order and forget its ids."""
        if step != self.applied_through + 1:
            raise FloodError(f"steps are applied in order: expected {self.applied_through + 1}, got {step}")
        if not self.is_complete(step):
            raise FloodError(f"step {step} is not complete at node {self.node}: missing {self.missing(step)[:8]}")
        return self.take_step(step, self.expected(step))

    def take_step(self, step: int, origins: Iterable[int]) -> list[Message]:
        """Hand out the messages of `step` (the next one) from `origins`, canonically ordered;
        forget the step and notes older than the horizon. No completeness check: the caller
        decided the step (churn), or checked it (`pop_step`)."""
        if step != self.applied_through + 1:
            raise FloodError(f"steps are applied in order: expected {self.applied_through + 1}, got {step}")
        keep = set(origins)
        held = self._store.pop(step, {})
        msgs = sorted(m for m in held.values() if m.origin in keep)
        for m in held.values():
            self._known.pop(m.id, None)
        self._copies = {i: c for i, c in self._copies.items() if i[1] > step}
        self.applied_through = step
        for s in [s for s in self._notes if s < step - self.note_horizon]:
            for n in self._notes.pop(s).values():
                self._known.pop(n.id, None)
        # every sorted list past the horizon, also those of kinds a step never held (read, empty)
        for key in [k for k in self._sorted if k[0] < step - self.note_horizon]:
            del self._sorted[key]
        return msgs

    def held(self, step: int) -> dict[int, int]:
        """origin -> messages of `step` held (the churn rule's input)."""
        out: dict[int, int] = {}
        for o, _, _ in self._store.get(step, {}):
            out[o] = out.get(o, 0) + 1
        return out

    def messages(self, step: int, origins: Iterable[int]) -> list[Message]:
        """The held messages of `step` from `origins`, canonically ordered (nothing is popped)."""
        keep = set(origins)
        return sorted(m for m in self._store.get(step, {}).values() if m.origin in keep)

    def held_items(self) -> tuple[list[Message], list[Note]]:
        """Every message of an undecided step and every note held (a rejoining peer's due)."""
        msgs = sorted(m for table in self._store.values() for m in table.values())
        return msgs, sorted(n for table in self._notes.values() for n in table.values())

    def notes(self, step: int, kind: int) -> list[Note]:
        """Notes of `kind` about `step` held, canonically ordered."""
        held = self._sorted.get((step, kind))
        if held is None:
            held = self._sorted[(step, kind)] = sorted(n for n in self._notes.get(step, {}).values() if n.kind == kind)
        return list(held)

    # -- neighbours ------------------------------------------------------------------------------
    def drop_peer(self, peer: int) -> None:
        """Stop sending to `peer` (it failed); what it was owed is dropped."""
        if self.routes is not None:
            raise FloodError(f"node {self.node}: shortest-path routes cannot survive losing peer {peer}")
        self.peers = tuple(p for p in self.peers if p != peer)
        self._pending.pop(peer, None)

    def _held(self) -> Iterator[tuple[MessageId | NoteId, Item]]:
        """(id, item) of every message, then every note, held: what a new peer is owed."""
        for msgs in self._store.values():
            yield from msgs.items()
        for notes in self._notes.values():
            yield from notes.items()

    def add_peer(self, peer: int) -> None:
        """Start sending to `peer` (it (re)connected): it is owed everything held."""
        if peer in self._pending:
            raise FloodError(f"node {self.node}: peer {peer} is already connected")
        if self.routes is not None:
            raise FloodError(f"node {self.node}: shortest-path routes cannot take a new peer {peer}")
        self.peers = tuple(sorted((*self.peers, peer)))
        owed: dict[MessageId | NoteId, Item] = {}
        for i, item in self._held():
            if isinstance(item, Note) and item.kind == LEAVE and item.origin != self.node:
                continue  # one hop (module docstring)
            owed[i] = item
            self._known.get(i, set()).discard(peer)
        self._pending[peer] = owed

    def owe(self, peer: int, messages: Iterable[Message]) -> None:
        """Send `peer` messages of steps this node applied and forgot (the committed copies, from
        its log): a newcomer whose sponsor failed before it relayed a step lacks them, and its
        other neighbours, which connect it only after they applied that step, no longer hold them
        (docs/churn-design.md, A sponsor that fails before it relays). Nothing is held here; the
        peer drops what it holds or applied already."""
        pending = self._pending.get(peer)
        if pending is None:
            raise FloodError(f"node {self.node}: peer {peer} is not connected")
        for m in messages:
            pending.setdefault(m.id, m)

    def pop_ready(self, upto: int) -> list[tuple[int, list[Message]]]:
        """Pop every consecutive complete step up to `upto` (for followers such as the evaluator)."""
        out = []
        while self.applied_through < upto and self.is_complete(self.applied_through + 1):
            s = self.applied_through + 1
            out.append((s, self.pop_step(s)))
        return out

    @property
    def held_count(self) -> int:
        """Messages held (of steps not applied yet)."""
        return sum(map(len, self._store.values()))

    @property
    def idle(self) -> bool:
        """Nothing owed to any neighbour."""
        return not any(self._pending.values())
