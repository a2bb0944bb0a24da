"""What a churn step holds and what a vote on it says: the values, the chain's digest, a vote's bytes.

Owns (docs/churn-design.md, "One history"; the rule that counts these is agreement.py's):
- `GENESIS` and `step_digest`: the hash chain over the committed history, H(prev, step, the
  step's messages in canonical order, its joins) as a u64 — every client's and the evaluator's
  digests of a step are this function's, so its bytes are pinned.
- `Value`: what a step holds — the origins whose messages it applies (`members`), the newcomers
  among them with their incarnations (`joins`), the digest of the step before (`prev`), its own
  digest, and the voters it leaves out on evidence — and the roster change it makes.
- `Vote`: (step, ballot, origin, incarnation, value), and its VOTE note body (the wire bytes:
  incarnation, prev, digest, joins count, the members' and the evidence's bit masks, the joins).

Assumes: pure Python (the core); a note reaching `Vote.of` was checked by its codec (kind,
origin, step), only its body is read here; origins are below `n_origins` (the masks' width).
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from seedflood.core.membership.notes import VOTE, Note
from seedflood.core.membership.roster import Change, Roster
from seedflood.core.wire import message
from seedflood.core.wire.message import FrameError, Message

GENESIS = 0
"""The digest before step 0."""

_HEAD = struct.Struct("<IQQH")  # incarnation, prev, digest, joins count
_JOIN = struct.Struct("<II")  # origin, incarnation
_CHAIN = struct.Struct("<QI")  # prev, step


def step_digest(prev: int, step: int, msgs: Sequence[Message], joins: Sequence[tuple[int, int]]) -> int:
    """H(prev, step, the step's messages in canonical order, its joins) as a u64."""
    if any(m.scalar == 0.0 for m in msgs):  # ±0 compare equal but encode apart: never from the cache
        return _step_digest(prev, step, msgs, joins)
    return _cached_digest(prev, step, tuple(msgs), tuple(joins))


@functools.lru_cache(maxsize=4096)
def _cached_digest(prev: int, step: int, msgs: tuple[Message, ...], joins: tuple[tuple[int, int], ...]) -> int:
    """`_step_digest`, remembered: every client digests the same messages of a step (its proposal,
    then the step it takes), so most calls in one process repeat one. Messages that compare
    equal encode alike (their fields but `sig`, which no digest reads; a nonzero float equals
    only itself bit for bit), so a hit is the digest the call would compute."""
    return _step_digest(prev, step, msgs, joins)


def _step_digest(prev: int, step: int, msgs: Sequence[Message], joins: Sequence[tuple[int, int]]) -> int:
    h = hashlib.blake2b(_CHAIN.pack(prev, step), digest_size=8)
    h.update(message.encode(sorted(msgs)))
    for o, inc in sorted(joins):
        h.update(_JOIN.pack(o, inc))
    return int.from_bytes(h.digest(), "little")


@dataclass(frozen=True)
class Value:
    """What step s holds: messages of `members` (K each), `joins` ⊆ members are newcomers;
    `evidence`: voters left out on evidence (an audit, two copies of one message), logged as
    the change's `audit` reason."""

    prev: int
    members: frozenset[int]
    joins: tuple[tuple[int, int], ...]
    digest: int
    evidence: frozenset[int] = frozenset()

    def change(self, step: int, roster: Roster) -> Change:
        """The roster change this value makes to the members of the step before."""
        leave = roster.members - self.members
        return Change(step, leave=tuple(sorted(leave)), join=self.joins, audit=tuple(sorted(leave & self.evidence)))


@dataclass(frozen=True)
class Vote:
    step: int
    ballot: int
    origin: int
    incarnation: int
    value: Value

    def note(self, n_origins: int) -> Note:
        v = self.value
        body = _HEAD.pack(self.incarnation, v.prev, v.digest, len(v.joins))
        body += _mask(v.members, n_origins) + _mask(v.evidence, n_origins)
        body += b"".join(_JOIN.pack(o, i) for o, i in v.joins)
        return Note(self.step, VOTE, self.origin, self.ballot, body)

    @classmethod
    def of(cls, note: Note, n_origins: int) -> Vote:
        """The vote a VOTE note carries; FrameError if its body is malformed."""
        got = _vote_body(note.body, n_origins)
        if isinstance(got, str):
            raise FrameError(f"vote of node {note.origin} for step {note.step}: {got}")
        inc, value = got
        return cls(note.step, note.value, note.origin, inc, value)


@functools.lru_cache(maxsize=4096)
def _vote_body(b: bytes, n_origins: int) -> tuple[int, Value] | str:
    """A VOTE note's body as (incarnation, value), or what is wrong with it. Remembered: every
    client decodes every vote it holds, and the clients of one process hold the same ones (a
    Value is immutable, so sharing it changes nothing)."""
    width = (n_origins + 7) // 8
    if len(b) < _HEAD.size + 2 * width:
        return f"{len(b)} body bytes"
    inc, prev, digest, count = _HEAD.unpack_from(b)
    members = _unmask(b[_HEAD.size : _HEAD.size + width], n_origins)
    evidence = _unmask(b[_HEAD.size + width : _HEAD.size + 2 * width], n_origins)
    rest = b[_HEAD.size + 2 * width :]
    if len(rest) != count * _JOIN.size:
        return "bad joins length"
    joins = tuple(_JOIN.iter_unpack(rest))
    if not {o for o, _ in joins} <= members:
        return "a join outside its members"
    return inc, Value(prev, members, joins, digest, evidence)


def _mask(origins: frozenset[int], n_origins: int) -> bytes:
    mask = bytearray((n_origins + 7) // 8)
    for o in origins:
        mask[o // 8] |= 1 << (o % 8)
    return bytes(mask)


def _unmask(mask: bytes, n_origins: int) -> frozenset[int]:
    return frozenset(o for o in range(n_origins) if mask[o // 8] >> (o % 8) & 1)
