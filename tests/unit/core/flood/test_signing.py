"""Signed runs in the pure core: the signed hop layout, who may sign what, and a flood that drops
what is not authentic. Signatures here are a keyed hash (the core takes sign and verify as
functions; comm/identity.py's Ed25519 is tested in tests/unit/comm)."""

from __future__ import annotations

import hashlib

import pytest

from seedflood.core.flood.flooding import Flood
from seedflood.core.flood.hop import decode_hop, encode_hop
from seedflood.core.flood.signing import Signing, may_sign, note_payload
from seedflood.core.membership.notes import AUDIT, COPY, VOTE, Note, copied, copy_note, join_note
from seedflood.core.wire.message import FrameError, Limits, Message

TAG = b"run-tag-16-bytes"


def seed_of(o: int, s: int, k: int) -> int:
    return (7 * 1_000_003 + o * 7919 + s * 104_729 + k) % 2**63


LIMITS = Limits(n_origins=8, min_step=0, max_step=100, max_k=1, seed_of=seed_of)


def _key(node: int) -> bytes:
    return f"secret of node {node}".encode()


def _sign_as(node: int):
    return lambda payload: hashlib.sha512(_key(node) + payload).digest()  # 64 bytes, like Ed25519


def _verify(node: int, payload: bytes, sig: bytes) -> bool:
    return 0 <= node < 8 and hashlib.sha512(_key(node) + payload).digest() == sig


def signing(node: int, tag: bytes = TAG) -> Signing:
    return Signing(node, tag, _sign_as(node), _verify)


def msg(o: int, s: int, scalar: float | None = None) -> Message:
    return Message.make(o, s, seed_of(o, s, 0), 0.5 + o if scalar is None else scalar)


def test_a_signed_hop_round_trips_every_signature_and_any_flipped_bit_is_refused():
    msgs = [signing(1).seal(msg(1, 4)), signing(2).seal(msg(2, 4))]
    notes = [signing(0).seal(join_note(4, 3, 2, 17)), signing(5).seal(Note(5, VOTE, 5, 1, b"\x01" * 29))]
    payload = encode_hop(msgs, notes, signed=True)
    got_msgs, got_notes = decode_hop(payload, LIMITS)
    assert got_msgs == msgs and [m.sig for m in got_msgs] == [m.sig for m in msgs]
    assert got_notes == sorted(notes)
    assert [(n.signer, n.sig) for n in got_notes] == [(n.signer, n.sig) for n in sorted(notes)]
    assert all(signing(6).authentic(i) for i in [*got_msgs, *got_notes])
    for i in range(len(payload)):
        bad = bytearray(payload)
        bad[i] ^= 0x10
        with pytest.raises(FrameError):
            decode_hop(bytes(bad), LIMITS)
    # 64 bytes per message, 4 + 64 per note, over the unsigned layout with the same notes
    assert len(payload) - len(encode_hop(msgs, notes)) == 2 * 64 + 2 * 68
    assert encode_hop([], [], signed=True) == b""


def test_an_item_without_a_signature_travels_as_one_and_is_never_authentic():
    restored = msg(3, 4)  # as a resume restores it from the log
    payload = encode_hop([restored], [], signed=True)
    (got,), _ = decode_hop(payload, LIMITS)
    assert got == restored and got.sig == b""
    assert not signing(0).authentic(got)


def test_only_the_origin_signs_a_message_a_vote_or_an_audit_any_member_a_join_or_a_copy():
    m, vote, audit = msg(2, 4), Note(4, VOTE, 2, 0, b"v"), Note(4, AUDIT, 2, 9)
    join, copy = join_note(4, 2, 1, 10), copy_note(signing(2).seal(msg(2, 4)))
    assert all(may_sign(i, 2) for i in (m, vote, audit, join, copy))
    assert not any(may_sign(i, 5) for i in (m, vote, audit))
    assert may_sign(join, 5) and may_sign(copy, 5)
    with pytest.raises(ValueError, match="may not sign"):
        signing(5).seal(m)


@pytest.mark.parametrize(
    "forge",
    [
        "wrong-key",  # node 6 signs origin 2's message with its own key (impersonation)
        "altered-scalar",  # a relay changes the scalar of a signed message
        "other-run",  # a signature from another run (other tag) replayed here
        "vote-by-another",  # node 6 signs a vote in node 2's name
        "invented-copy",  # a relay makes up a second copy of an honest origin's message
    ],
)
def test_a_flood_drops_and_counts_what_is_not_authentic_and_never_holds_it(forge):
    honest = signing(2).seal(msg(2, 4))
    item: Message | Note
    if forge == "wrong-key":
        item = Signing(2, TAG, _sign_as(6), _verify).seal(msg(2, 4))  # signs as 2 with 6's key
    elif forge == "altered-scalar":
        item = Message(honest.step, honest.origin, honest.k, honest.seed, 9.0, honest.sig)
    elif forge == "other-run":
        item = signing(2, tag=b"another-run-tag!").seal(msg(2, 4))
    elif forge == "vote-by-another":
        vote = Note(4, VOTE, 2, 0, b"v")
        item = Note(4, VOTE, 2, 0, b"v", 6, _sign_as(6)(note_payload(TAG, vote, 6)))  # 6's valid signature
    else:
        fake = Message(honest.step, honest.origin, honest.k, honest.seed, 9.0, honest.sig)  # origin never signed 9.0
        item = signing(6).seal(copy_note(fake))  # the witness's own signature on the note is valid
    f = Flood(0, [1], range(8), signing=signing(0), tolerate_conflicts=True)
    assert f.receive(1, [item]) == []
    assert f.stats.forged == 1 and f.held(4) == {} and f.notes(4, VOTE) == [] and f.notes(4, COPY) == []
    assert f.outbox() == {1: []} and not f.conflicts
    # the genuine item is taken
    assert f.receive(1, [honest]) == [honest] and f.stats.forged == 1


def test_a_signed_flood_seals_what_it_originates_and_two_signed_copies_convict_their_origin():
    a = Flood(0, [1], range(8), signing=signing(0), tolerate_conflicts=True)
    a.originate([msg(0, 3)])
    a.originate_notes([Note(3, AUDIT, 0, 5)])
    (sent,) = a.outbox().values()
    assert all(signing(1).authentic(i) for i in sent) and {type(i) for i in sent} == {Message, Note}
    # origin 2 signs two scalars under one id; node 1 holds one, gets the other from node 3
    one, two = signing(2).seal(msg(2, 4, 0.5)), signing(2).seal(msg(2, 4, 0.75))
    b = Flood(1, [0, 3], range(8), signing=signing(1), tolerate_conflicts=True)
    b.receive(0, [one])
    b.receive(3, [two])
    assert 2 in b.conflicts and b.stats.forged == 0
    notes = [n for n in b.outbox()[0] if isinstance(n, Note) and n.kind == COPY]
    assert len(notes) == 2 and all(n.signer == 1 for n in notes)
    # the COPY notes are proof for anyone: each verifies, and carries the origin's own signature
    c = Flood(4, [1], range(8), signing=signing(4), tolerate_conflicts=True)
    c.receive(1, notes)
    assert c.stats.forged == 0 and 2 in c.conflicts
    assert sorted(copied(n).scalar for n in notes) == [0.5, 0.75] and all(copied(n).sig for n in notes)


def test_two_votes_signed_in_one_ballot_both_flood_name_their_origin_and_a_third_is_dropped():
    """A signed vote's id holds its body, so a second vote its origin signed in the same ballot
    (same incarnation: the body's first 4 bytes) is held and forwarded beside the first — the
    proof travels — and names the origin; a third is dropped. Another ballot or another
    incarnation is no double vote, and an unsigned vote keeps the old one-per-ballot id."""
    inc0, inc1 = (0).to_bytes(4, "little"), (1).to_bytes(4, "little")
    one, two, three = (signing(2).seal(Note(4, VOTE, 2, 1, inc0 + body)) for body in (b"x", b"y", b"z"))
    f = Flood(0, [1, 3], range(8), signing=signing(0), tolerate_conflicts=True)
    assert f.receive(1, [one]) == [one] and not f.conflicts
    assert f.receive(1, [signing(2).seal(Note(4, VOTE, 2, 2, inc0 + b"y"))])  # ballot 2: its own
    assert f.receive(1, [signing(2).seal(Note(4, VOTE, 2, 1, inc1 + b"y"))]) and not f.conflicts  # a new incarnation
    assert f.receive(1, [two]) == [two] and f.conflicts[2] == "two signed votes in ballot 1 of step 4"
    assert f.receive(1, [three]) == [] and len(f.notes(4, VOTE)) == 4
    assert {n.body for n in f.outbox()[3]} >= {inc0 + b"x", inc0 + b"y"}  # both go on to node 3
    assert Note(4, VOTE, 2, 1, b"x").id == ("vote", 2, 4, 1) and one.id == ("vote", 2, 4, 1, inc0 + b"x")


def test_a_rejoin_proof_holds_only_for_its_node_incarnation_sponsor_nonce_and_run():
    """The rejoin challenge (roles/rejoinproof.py): node 5's answer to sponsor 1's nonce for its
    incarnation 3 verifies at sponsor 1; the same bytes prove nothing for another node, another
    incarnation, another sponsor, another nonce or another run, and an answer made with another
    node's key (a process without node 5's key) proves nothing."""
    nonce = bytes(range(16))
    proof = signing(5).prove_rejoin(3, 1, nonce)
    assert len(proof) == 64 and signing(1).proves_rejoin(5, 3, nonce, proof)
    assert not signing(1).proves_rejoin(4, 3, nonce, proof)  # another node
    assert not signing(1).proves_rejoin(5, 4, nonce, proof)  # a later incarnation
    assert not signing(2).proves_rejoin(5, 3, nonce, proof)  # another sponsor
    assert not signing(1).proves_rejoin(5, 3, bytes(16), proof)  # another handshake's nonce
    assert not signing(1, b"another-run-tag!").proves_rejoin(5, 3, nonce, proof)
    impostor = Signing(5, TAG, _sign_as(6), _verify)  # node 5's id, node 6's key
    assert not signing(1).proves_rejoin(5, 3, nonce, impostor.prove_rejoin(3, 1, nonce))
    assert not signing(1).proves_rejoin(5, 3, nonce[:8], proof) and not signing(1).proves_rejoin(5, 3, nonce, b"")
