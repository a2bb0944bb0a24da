"""A committed step's proof for those who did not vote on it: the evaluator, replay and check.

Owns (docs/trust.md, What the evaluator and the log verify):
- `Certificate`: the signed votes that commit a churn step's value, in the few bytes that carry
  them — one ballot, the value's vote body once (prev, digest, members, evidence, joins), then
  (origin, incarnation, Ed25519 signature) per voter: 72 bytes a voter. Each voter's VOTE note
  is rebuilt from those (`notes`) and checked as the flood checks it (flood.signing).
- `certify`: the certificate a client builds, once it applies a step it committed, from the
  signed VOTE notes its flood holds: the votes of the committing ballot for the committed value,
  by the step's voters under their admitted incarnations, a Byzantine quorum of them.
- `StepVerifier`: the check made before a step is taken from someone not trusted (the client the
  evaluator follows, a log on disk): every message signed by its origin and, under churn, a
  certificate with a Byzantine quorum (`agreement.byzantine_quorum`, the rule the clients commit
  by) of the step's voters R_s, in one ballot, for a value that chains on the last step verified
  (`prev`), whose digest is that of the step's messages and whose change is the step's.
  Anything short of that is a `Refusal` (one line, and how many items it refuses).

May import: seedflood.core.flood (signing, membership, message), core.churn.agreement.

Assumes: pure Python (the core; the cryptography is flood.signing.Signing's injected `verify`);
signed votes (trust.sign), so the agreement counts by the Byzantine quorum; the verifier sees
the steps in order from the first it verifies (`extend` takes those before it as verified).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from seedflood.core.churn.agreement import GENESIS, Proof, Value, Vote, byzantine_quorum, step_digest
from seedflood.core.flood.signing import Signing
from seedflood.core.membership.notes import SIG_SIZE, VOTE, Note
from seedflood.core.membership.roster import Change, Roster
from seedflood.core.wire.message import FrameError, Message

_HEAD = struct.Struct("<IH")  # ballot, value body length
_VOTER = struct.Struct("<II")  # origin, incarnation (then its 64-byte signature)
_INC = struct.Struct("<I")  # a vote body opens with its voter's incarnation


@dataclass(frozen=True)
class Certificate:
    """Votes of `ballot` for one value (`body`: a VOTE note's body after the incarnation), each
    voter's (origin, incarnation, signature)."""

    ballot: int
    body: bytes
    voters: tuple[tuple[int, int, bytes], ...]

    def to_bytes(self) -> bytes:
        """u32 ballot, u16 body length, body, then 72 bytes a voter (u32 origin, u32 incarnation,
        signature)."""
        rows = b"".join(_VOTER.pack(o, inc) + sig for o, inc, sig in self.voters)
        return _HEAD.pack(self.ballot, len(self.body)) + self.body + rows

    @classmethod
    def from_bytes(cls, data: bytes) -> Certificate:
        """FrameError on any defect."""
        if len(data) < _HEAD.size:
            raise FrameError(f"a commit certificate of {len(data)} bytes")
        ballot, n = _HEAD.unpack_from(data)
        at = _HEAD.size + n
        row = _VOTER.size + SIG_SIZE
        if len(data) < at or (len(data) - at) % row:
            raise FrameError(f"a commit certificate of {len(data)} bytes does not hold whole votes")
        voters = []
        for i in range(at, len(data), row):
            o, inc = _VOTER.unpack_from(data, i)
            voters.append((o, inc, bytes(data[i + _VOTER.size : i + row])))
        return cls(ballot, bytes(data[_HEAD.size : at]), tuple(voters))

    def notes(self, step: int) -> list[Note]:
        """The signed VOTE notes this certificate stands for."""
        return [
            Note(step, VOTE, o, self.ballot, _INC.pack(inc) + self.body, signer=o, sig=sig)
            for o, inc, sig in self.voters
        ]


def certify(step: int, notes: Iterable[Note], value: Value, proof: Proof, n_origins: int) -> Certificate | None:
    """The certificate of committed `step` (`value`, committed in `proof.ballot` by R_s =
    `proof.members`): the first quorum, by origin, of the signed votes among `notes` (the step's
    VOTE notes) for that value, one per voter under its admitted incarnation; None when those
    held are fewer than a quorum (never, for a step this client committed on them)."""
    need = byzantine_quorum(len(proof.members), proof.ballot)
    chosen: dict[int, Note] = {}
    for n in notes:
        if n.kind != VOTE or n.step != step or n.value != proof.ballot or not n.sig or n.origin in chosen:
            continue
        if n.origin not in proof.members or n.signer != n.origin:
            continue
        try:
            vote = Vote.of(n, n_origins)
        except FrameError:
            continue
        if vote.value == value and proof.incarnations.get(n.origin, vote.incarnation) == vote.incarnation:
            chosen[n.origin] = n
    if len(chosen) < need:
        return None
    picked = [chosen[o] for o in sorted(chosen)[:need]]
    body = picked[0].body[_INC.size :]
    voters = tuple((n.origin, _INC.unpack_from(n.body)[0], n.sig) for n in picked)
    return Certificate(proof.ballot, body, voters)


@dataclass(frozen=True)
class Refusal:
    """Why a step is not taken (one line), and how many of its items that refuses (messages
    without a valid signature, or 1 for a missing or short certificate)."""

    reason: str
    items: int


@dataclass
class StepVerifier:
    """Checks each step before it is taken (module docstring). `signing`: verify-only (the
    roster's public keys and the run's tag); `churn`: steps need a certificate; `n_origins`:
    the ids a vote's member masks span (`Protocol.ids`)."""

    signing: Signing
    churn: bool
    n_origins: int
    prev: int = GENESIS
    """The digest of the last step verified (churn: the next certificate must chain on it)."""
    refused: int = 0
    """Items refused so far."""

    def extend(self, step: int, msgs: Sequence[Message], change: Change | None) -> None:
        """Take `step` as verified without a certificate (the log a resumed evaluator keeps)."""
        self.prev = step_digest(self.prev, step, sorted(msgs), change.join if change else ())

    def check(
        self, step: int, msgs: Sequence[Message], change: Change | None, certificate: bytes | None, roster: Roster
    ) -> Refusal | None:
        """None when `step` (its messages with their signatures, its change, its certificate:
        None for an unsigned payload) is proven, and then the chain moves on; else the Refusal,
        counted in `refused`. `roster`: the members before this step's change (R_s)."""
        refusal = self._refusal(step, sorted(msgs), change, certificate, roster)
        if refusal is not None:
            self.refused += refusal.items
        return refusal

    def _refusal(
        self, step: int, msgs: list[Message], change: Change | None, certificate: bytes | None, roster: Roster
    ) -> Refusal | None:
        if certificate is None:
            return Refusal(
                f"step {step} carries no signatures (an unsigned payload in a signed run)", max(len(msgs), 1)
            )
        forged = [m for m in msgs if not self.signing.authentic(m)]
        if forged:
            m = forged[0]
            more = f" (and {len(forged) - 1} more)" if len(forged) > 1 else ""
            return Refusal(
                f"{len(forged)} of its {len(msgs)} messages carry no valid signature by their origin: "
                f"node {m.origin}'s (k {m.k}, scalar {m.scalar:.6g}){more}",
                len(forged),
            )
        if not self.churn:  # a strict run's roster never changes: a change would drop an origin unproven
            return Refusal(f"a roster change ({change.describe()}) in a run without votes", 1) if change else None
        if not certificate:
            return Refusal(f"step {step} carries no commit certificate", 1)
        try:
            cert = Certificate.from_bytes(certificate)
            notes = cert.notes(step)
            value = Vote.of(notes[0], self.n_origins).value if notes else None
        except FrameError as e:
            return Refusal(f"its commit certificate is malformed: {e}", 1)
        n = len(roster.members)
        need = byzantine_quorum(n, cert.ballot)
        valid = set()
        for note, (o, inc, _) in zip(notes, cert.voters):
            if o in roster.members and roster.incarnations.get(o, inc) == inc and self.signing.authentic(note):
                valid.add(o)
        if value is None or len(valid) < need:
            return Refusal(
                f"its commit certificate holds {len(valid)} valid signed votes of the {n} voters "
                f"(ballot {cert.ballot} needs {need}): no quorum committed it",
                1,
            )
        if value.prev != self.prev:
            return Refusal(
                f"its certificate commits a step on another history (previous digest {value.prev:016x}, "
                f"the evaluator's {self.prev:016x})",
                1,
            )
        if step_digest(self.prev, step, msgs, value.joins) != value.digest:
            return Refusal("its messages are not the ones its certificate's votes committed (another digest)", 1)
        want = value.change(step, roster)
        if (want if want else None) != (change if change else None):
            return Refusal(
                f"its roster change ({change.describe() if change else 'none'}) is not the one its "
                f"certificate's votes committed ({want.describe() if want else 'none'})",
                1,
            )
        self.prev = value.digest
        return None
