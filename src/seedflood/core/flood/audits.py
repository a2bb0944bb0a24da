"""Who recomputes whose scalar at each step (docs/trust.md, Verification by recomputation).

Owns the sample of verification by recomputation (`trust.audit`): whether auditor a recomputes
origin o's K scalars of step s (`chosen`), a deterministic draw of rate `Protocol.audit` from a
hash of
- `basis`: what every client holds when step s is estimated — the messages of the last step
  applied before it (s − 1 − delay; nothing before step delay + 1), so the draw changes every
  step and is known to nobody before that step's scalars were sent; and
- in a signed run, `private`: the auditor's own Ed25519 signature over (run tag, step), which is
  deterministic but which nobody without the auditor's key can compute, so nobody else can
  predict its sample.

Limits (stated in docs/trust.md): without signatures every origin computes the same hash at step
s and knows whether it is audited, so it can lie exactly on the steps nobody audits (only rate 1
leaves no such step); with signatures it cannot predict the sample, and each lie is caught with
probability 1 − (1 − rate)^(honest auditors).

Assumes: pure Python (the core); every client applies the same messages in canonical order.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from seedflood.core.flood import message
from seedflood.core.flood.message import Message
from seedflood.core.flood.signing import Signing

_DRAW = struct.Struct("<III")  # auditor, origin, step
_STEP = struct.Struct("<Q")
_SCALE = float(1 << 64)


def basis(applied: Sequence[Message]) -> bytes:
    """16 bytes every client holds alike: blake2b over the last applied step's messages in
    canonical order (empty before any step is applied)."""
    return hashlib.blake2b(message.encode(sorted(applied)) if applied else b"", digest_size=16).digest()


def private(signing: Signing | None, step: int) -> bytes:
    """The auditor's own part of the draw of `step`: its signature over (run tag, step) in a
    signed run (Ed25519 signatures are deterministic), else nothing."""
    if signing is None:
        return b""
    return signing.sign(b"a" + signing.tag + _STEP.pack(step))


def chosen(basis: bytes, secret: bytes, auditor: int, origin: int, step: int, rate: float) -> bool:
    """Whether `auditor` recomputes `origin`'s scalars of `step`: a uniform draw in [0, 1) below
    `rate` (rate 1: always; 0: never; nobody audits itself)."""
    if auditor == origin or rate <= 0.0:
        return False
    h = hashlib.blake2b(basis + secret + _DRAW.pack(auditor, origin, step), digest_size=8).digest()
    return int.from_bytes(h, "little") / _SCALE < rate
