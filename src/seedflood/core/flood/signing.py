"""What a signed run signs, who may sign what, and the check a flood makes before it takes an item.

Owns (docs/trust.md, Identities):
- the bytes a signature covers: `message_payload` (origin, step, k and the f32 scalar the wire
  carries; the seed is derived from those, so it adds nothing) and `note_payload` (kind, origin,
  step, value, signer and body), each prefixed by the run's tag, so a signature made in one run
  (other settings, other keys) is worth nothing in another;
- who may sign what (`may_sign`): a message and a VOTE or AUDIT note only by their origin; a JOIN
  note by any member (its sponsor admits the origin); a COPY note by any member that saw the two
  copies — what it proves rests on the copy's own signature by its origin, which it carries and
  which is checked too, so a relay cannot make an honest origin look like an equivocator;
- the bytes a restarted process signs to prove, before a sponsor hands it anything, that it holds
  its node's key: `rejoin_payload` (the node, its incarnation, the sponsor and the sponsor's fresh
  nonce), so a proof is worth nothing for another incarnation, sponsor or handshake;
- `Signing`: one node's seal for what it originates (`seal`), the check on what it receives
  (`authentic`) and the rejoin proof (`prove_rejoin`, `proves_rejoin`), around two injected
  functions — the core does no cryptography.

Assumes: pure Python (the core). `sign(payload) -> 64 bytes` is this node's private key;
`verify(node, payload, sig) -> bool` holds the roster's public keys and returns False (never
raises) for anything it cannot check. comm/identity.py provides both (Ed25519).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from seedflood.core.membership.notes import COPY, JOIN, SIG_SIZE, Note, copied
from seedflood.core.wire.message import Message

_MESSAGE = struct.Struct("<IIIf")  # origin, step, k, scalar (f32: the wire's bits)
_NOTE = struct.Struct("<BIIQi")  # kind, origin, step, value, signer
_REJOIN = struct.Struct("<III")  # node, incarnation, sponsor
NONCE_SIZE = 16

Item = Message | Note
_Sealed = TypeVar("_Sealed", Message, Note)  # `seal` hands back what it was given
Sign = Callable[[bytes], bytes]
Verify = Callable[[int, bytes, bytes], bool]


def message_payload(tag: bytes, m: Message) -> bytes:
    """The bytes an origin signs for message `m`."""
    return b"m" + tag + _MESSAGE.pack(m.origin, m.step, m.k, m.scalar)


def note_payload(tag: bytes, n: Note, signer: int) -> bytes:
    """The bytes `signer` signs for note `n` (its body included: a vote's content, a copy's seed,
    scalar and origin signature)."""
    return b"n" + tag + _NOTE.pack(n.kind, n.origin, n.step, n.value, signer) + n.body


def rejoin_payload(tag: bytes, node: int, incarnation: int, sponsor: int, nonce: bytes) -> bytes:
    """The bytes a restarted `node` signs for `sponsor`'s challenge `nonce` (NONCE_SIZE bytes)."""
    return b"r" + tag + _REJOIN.pack(node, incarnation, sponsor) + nonce


def may_sign(item: Item, signer: int) -> bool:
    """Whether `signer` may vouch for `item`: its origin always; another member only for a
    JOIN (the sponsor) or a COPY (the witness)."""
    if signer == item.origin:
        return True
    return isinstance(item, Note) and item.kind in (JOIN, COPY)


@dataclass(frozen=True)
class Signing:
    """Node `node`'s signatures in a run tagged `tag` (bytes that name the run: its settings and
    its roster's keys)."""

    node: int
    tag: bytes
    sign: Sign
    verify: Verify

    def seal(self, item: _Sealed) -> _Sealed:
        """`item` with this node's signature; one that carries a signature already (a note handed
        on from another client's dump, a copy) is returned as it is."""
        if item.sig:
            return item
        if not may_sign(item, self.node):
            raise ValueError(f"node {self.node} may not sign {item}")
        if isinstance(item, Message):
            return replace(item, sig=self.sign(message_payload(self.tag, item)))
        return replace(item, signer=self.node, sig=self.sign(note_payload(self.tag, item, self.node)))

    def authentic(self, item: Item) -> bool:
        """A valid signature by someone who may sign `item` (and, for a COPY, a valid signature
        by the copy's origin on the copy it carries)."""
        if len(item.sig) != SIG_SIZE:
            return False
        if isinstance(item, Message):
            return self.verify(item.origin, message_payload(self.tag, item), item.sig)
        if not may_sign(item, item.signer) or not self.verify(
            item.signer, note_payload(self.tag, item, item.signer), item.sig
        ):
            return False
        if item.kind == COPY:
            m = copied(item)
            return len(m.sig) == SIG_SIZE and self.verify(m.origin, message_payload(self.tag, m), m.sig)
        return True

    def prove_rejoin(self, incarnation: int, sponsor: int, nonce: bytes) -> bytes:
        """This node's answer to `sponsor`'s rejoin challenge: its signature (SIG_SIZE bytes)."""
        return self.sign(rejoin_payload(self.tag, self.node, incarnation, sponsor, nonce))

    def proves_rejoin(self, node: int, incarnation: int, nonce: bytes, proof: bytes) -> bool:
        """Whether `proof` is `node`'s signature on this node's challenge `nonce` to its
        `incarnation` (made with node's key, in this run)."""
        payload = rejoin_payload(self.tag, node, incarnation, self.node, nonce)
        return len(nonce) == NONCE_SIZE and len(proof) == SIG_SIZE and self.verify(node, payload, proof)
