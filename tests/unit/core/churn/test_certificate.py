"""What the evaluator verifies before it takes a step of a signed run (seedflood.core.churn.certificate,
core/flood/stepstream.py's signed payload): pure, milliseconds. Signatures are a keyed hash here, as in
test_signing.py (the core takes sign and verify as functions).

docs/trust.md, What the evaluator and the log verify.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from seedflood.core.churn.agreement import GENESIS, Agreement, Proof, Value, Vote, byzantine_quorum, step_digest
from seedflood.core.churn.certificate import Certificate, StepVerifier, certify
from seedflood.core.flood import stepstream
from seedflood.core.flood.signing import Signing
from seedflood.core.membership.notes import VOTE, Note
from seedflood.core.membership.roster import Change, Roster
from seedflood.core.wire import message
from seedflood.core.wire.message import Message

TAG = b"run-tag-16-bytes"
N = 4


def seed_of(o: int, s: int, k: int) -> int:
    return 1000 + 10 * o + s + k


def _verify(node: int, payload: bytes, sig: bytes) -> bool:
    return 0 <= node < 8 and hashlib.sha512(f"key {node}".encode() + payload).digest() == sig


def signing(node: int) -> Signing:
    return Signing(node, TAG, lambda p: hashlib.sha512(f"key {node}".encode() + p).digest(), _verify)


def verifier(churn: bool = True) -> StepVerifier:
    return StepVerifier(Signing(-1, TAG, lambda p: b"", _verify), churn, N)


def msgs_of(step: int, members=range(N), scalar: float = 0.25) -> list[Message]:
    return [signing(o).seal(Message.make(o, step, seed_of(o, step, 0), scalar + o)) for o in members]


def value_of(step: int, msgs, prev: int = GENESIS, members=None) -> Value:
    members = frozenset(m.origin for m in msgs) if members is None else frozenset(members)
    return Value(prev, members, (), step_digest(prev, step, msgs, ()))


def signed_votes(step: int, value: Value, voters, ballot: int = 0) -> list[Note]:
    return [signing(o).seal(Vote(step, ballot, o, 0, value).note(N)) for o in voters]


def certificate(step: int, value: Value, voters=range(N), ballot: int = 0) -> bytes:
    """The votes of `voters` as a certificate, a quorum or not (certify builds only quorums)."""
    notes = signed_votes(step, value, voters, ballot)
    rows = tuple((n.origin, 0, n.sig) for n in notes)
    return Certificate(ballot, notes[0].body[4:], rows).to_bytes()


def test_a_certificate_holds_a_quorum_of_signed_votes_in_72_bytes_a_voter_and_proves_its_step():
    msgs = msgs_of(0)
    value = value_of(0, msgs)
    q = byzantine_quorum(N, 0)
    made = certify(0, signed_votes(0, value, range(N)), value, Proof(0, frozenset(range(N)), {}), N)
    assert made is not None
    raw = made.to_bytes()
    cert = Certificate.from_bytes(raw)
    assert len(cert.voters) == q == 3, "the first quorum by origin, not every vote held"
    assert Certificate.from_bytes(raw) == cert and len(raw) == 6 + len(cert.body) + 72 * q
    v = verifier()
    assert v.check(0, msgs, None, raw, Roster(N)) is None
    assert v.prev == value.digest, "the chain moves on to the step's digest"
    # the next step chains on it; a certificate for a value on another chain is refused
    nxt = msgs_of(1)
    assert v.check(1, nxt, None, certificate(1, value_of(1, nxt, prev=GENESIS)), Roster(N)) is not None
    assert v.check(1, nxt, None, certificate(1, value_of(1, nxt, prev=value.digest)), Roster(N)) is None


def test_an_altered_scalar_a_short_certificate_or_an_unsigned_step_is_refused_and_counted():
    msgs = msgs_of(0)
    value = value_of(0, msgs)
    roster = Roster(N)
    v = verifier()
    lied = [replace(msgs[2], scalar=msgs[2].scalar * 10)] + msgs[:2] + msgs[3:]  # node 2's signature, another scalar
    r = v.check(0, lied, None, certificate(0, value), roster)
    assert r is not None and "node 2's" in r.reason and r.items == 1 and v.refused == 1
    short = certificate(0, value, voters=(0, 1))
    r = v.check(0, msgs, None, short, roster)
    assert r is not None and "2 valid signed votes of the 4 voters (ballot 0 needs 3)" in r.reason and v.refused == 2
    # a forged voter's signature does not count; nor does a vote by a non-member
    cert = Certificate.from_bytes(certificate(0, value))
    forged = replace(cert, voters=cert.voters[:2] + ((3, 0, bytes(64)),))
    assert "2 valid" in v.check(0, msgs, None, forged.to_bytes(), roster).reason  # type: ignore[union-attr]
    gone = Roster(N, frozenset({0, 1, 3}))
    r = v.check(0, msgs, None, certificate(0, value, voters=(0, 1, 2)), gone)
    assert r is not None and "2 valid signed votes of the 3 voters" in r.reason
    assert "no signatures" in v.check(0, msgs, None, None, roster).reason  # type: ignore[union-attr]
    assert "no commit certificate" in v.check(0, msgs, None, b"", roster).reason  # type: ignore[union-attr]
    # other (well-signed) messages than the certificate commits, or another roster change
    other = msgs_of(0, scalar=0.5)
    assert "not the ones" in v.check(0, other, None, certificate(0, value), roster).reason  # type: ignore[union-attr]
    change = Change(0, leave=(3,))
    assert "roster change" in v.check(0, msgs, change, certificate(0, value), roster).reason  # type: ignore[union-attr]
    assert v.prev == GENESIS, "nothing refused moved the chain"
    assert v.check(0, msgs, None, certificate(0, value), roster) is None


def test_a_strict_step_needs_each_messages_signature_and_no_certificate():
    msgs = msgs_of(5)
    v = verifier(churn=False)
    assert v.check(5, msgs, None, b"", Roster(N)) is None
    unsigned = [replace(m, sig=b"") for m in msgs]
    r = v.check(5, unsigned, None, b"", Roster(N))
    assert r is not None and r.items == 4 and "4 of its 4 messages" in r.reason
    # no roster change is ever decided without votes: one would leave an origin out unproven
    r = v.check(5, msgs[:3], Change(5, leave=(3,)), b"", Roster(N))
    assert r is not None and "roster change (step 5: leave 3 (silent)) in a run without votes" in r.reason


def test_a_committed_step_is_certified_by_the_votes_of_its_ballot_for_its_value():
    msgs = msgs_of(0)
    value = value_of(0, msgs)
    other = value_of(0, msgs[:3], members=range(3))
    held = signed_votes(0, other, (0,)) + signed_votes(0, value, (1, 2, 3)) + signed_votes(0, value, (0,), ballot=1)
    proof = Proof(0, frozenset(range(N)), {})
    cert = certify(0, held, value, proof, N)
    assert cert is not None and [o for o, _, _ in cert.voters] == [1, 2, 3]
    assert certify(0, held[:3], value, proof, N) is None, "two votes for it in ballot 0: no quorum"
    # an Agreement records how it committed each step (signed votes only)
    a = Agreement(0, N, 1, byzantine=True)
    votes = {n: Vote.of(n, N) for n in signed_votes(0, value, range(N))}
    commits, _ = a.review(lambda s: list(votes.values()) if s == 0 else [], lambda s: None)
    assert [s for s, _ in commits] == [0] and a.proofs[0] == Proof(0, frozenset(range(N)), {})
    assert not Agreement(0, N, 1).proofs


def test_the_signed_payload_round_trips_its_seals_and_an_unsigned_one_is_unchanged():
    msgs = msgs_of(3)
    change = Change(3, leave=(1,))
    # unsigned: exactly the bytes before signing existed (the plain frame; the change prefix)
    assert stepstream.encode_step(msgs) == message.encode(msgs)
    assert stepstream.encode_step(msgs, change).startswith(b"SC\x01")
    assert stepstream.decode_signed_step(stepstream.encode_step(msgs), 3, seed_of=seed_of)[2] is None
    cert = certificate(3, value_of(3, msgs))
    payload = stepstream.encode_step(msgs, change, cert)
    got, got_change, got_cert = stepstream.decode_signed_step(payload, 3, seed_of=seed_of)
    assert got == msgs and [m.sig for m in got] == [m.sig for m in msgs] and got_change == change and got_cert == cert
    # two honest senders' certificates differ: the step's content does not
    other = certificate(3, value_of(3, msgs), voters=(1, 2, 3))
    assert stepstream.content(payload) == stepstream.content(stepstream.encode_step(msgs, change, other))
    assert stepstream.content(payload) != stepstream.content(
        stepstream.encode_step(msgs_of(3, scalar=0.5), change, cert)
    )
    seq = stepstream.StepSequence(3)
    assert seq.offer(3, payload) and not seq.offer(3, stepstream.encode_step(msgs, change, other))
    # the seals alone (the log's seal record)
    seals = stepstream.encode_seals(msgs, cert)
    assert stepstream.decode_seals(seals, [replace(m, sig=b"") for m in msgs]) == (msgs, cert)
    assert len(seals) == 4 + 64 * len(msgs) + len(cert)


def test_a_vote_note_rebuilt_from_its_certificate_is_the_note_its_voter_signed():
    value = value_of(2, msgs_of(2))
    notes = signed_votes(2, value, (0, 1, 3))
    cert = Certificate.from_bytes(certificate(2, value, voters=(0, 1, 3)))
    rebuilt = cert.notes(2)
    assert [(n, n.sig, n.signer, n.body) for n in rebuilt] == [(n, n.sig, n.signer, n.body) for n in notes]
    assert all(n.kind == VOTE for n in rebuilt)
