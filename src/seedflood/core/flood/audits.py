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

Owns, too, the verdict on one recomputed scalar (`agrees`, `confirms`): exact f32 equality by
default (`trust.audit_tolerance` 0, clients of one kind of hardware and software), or, for a run
that mixes kinds, agreement within an absolute tolerance on the scalar (`Protocol.scalar_tolerance`).

Limits (stated in docs/trust.md): without signatures every origin computes the same hash at step
s and knows whether it is audited, so it can lie exactly on the steps nobody audits (only rate 1
leaves no such step); with signatures it cannot predict the sample, and each lie is caught with
probability 1 − (1 − rate)^(honest auditors).

Assumes: pure Python (the core); every client applies the same messages in canonical order;
with a tolerance, it bounds the difference between any two honest clients' f32 scalars of one
(origin, step, k) (docs/trust.md, Mixed hardware).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from seedflood.core.flood.signing import Signing
from seedflood.core.wire import message
from seedflood.core.wire.message import Message

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


def agrees(scalar: float, recomputed: float, tolerance: float) -> bool:
    """Whether `scalar` passes as `recomputed` (its recomputation here): equal, or at most
    `tolerance` apart (absolute, scalar units; 0 = exact equality, the bits of every run before
    the tolerance existed). Not finite or NaN apart: never within a tolerance."""
    return scalar == recomputed or abs(scalar - recomputed) <= tolerance


def confirms(sent: float, claimed: float, mine: float, tolerance: float) -> bool:
    """Whether another auditor's evidence re-checks here: `claimed`, its recomputation of a scalar
    the origin sent as `sent`, agrees with `mine`, this client's own recomputation on the same
    state (so the note's recomputation is an honest one), and `sent` does not agree with `mine`
    (this client's own verdict: a note alone can never convict an origin whose scalar agrees
    with this client's recomputation, whatever value it claims). Tolerance 0: mine == claimed
    and mine != sent."""
    return agrees(claimed, mine, tolerance) and not agrees(sent, mine, tolerance)
