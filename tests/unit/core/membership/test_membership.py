"""The roster, its changes and the notes (seedflood.core.membership) and the hop payload (core.flood.hop): pure, milliseconds."""

from __future__ import annotations

import pytest

from seedflood.core.flood.flooding import Flood
from seedflood.core.flood.hop import decode_hop, encode_hop
from seedflood.core.flood.stepstream import (
    CatchUp,
    StepSequence,
    decode_push,
    decode_pushes,
    decode_step,
    encode_push,
    encode_pushes,
    encode_step,
)
from seedflood.core.membership.notes import AUDIT, JOIN, LEAVE, VOTE, Note, join_note, leave_note, link_hop
from seedflood.core.membership.roster import Change, ExcludedError, MembershipError, Roster, audit_verdict, next_attach
from seedflood.core.wire import message
from seedflood.core.wire.message import FrameError, Limits, Message

SEED = 7


def seed_of(o: int, s: int, k: int) -> int:
    return (SEED * 1_000_003 + o * 7919 + s * 104_729 + k) % 2**63


LIMITS = Limits(n_origins=8, min_step=0, max_step=100, max_k=1, seed_of=seed_of)


def msg(o: int, s: int) -> Message:
    return Message.make(o, s, seed_of(o, s, 0), 0.5 + o)


def test_hop_payload_without_notes_is_exactly_the_message_frame():
    msgs = [msg(0, 3), msg(2, 3)]
    assert encode_hop(msgs) == message.encode(msgs)
    assert decode_hop(encode_hop(msgs), LIMITS) == (msgs, [])
    assert decode_hop(b"", LIMITS) == ([], [])


def test_hop_payload_with_notes_round_trips_and_any_flipped_bit_is_refused():
    msgs = [msg(1, 4)]
    notes = [join_note(4, 3, 2, 17), Note(2, AUDIT, 1, 0xDEADBEEF12345678), Note(5, VOTE, 0, 1, b"\x01" * 29)]
    payload = encode_hop(msgs, notes)
    assert decode_hop(payload, LIMITS) == (msgs, sorted(notes))
    for i in range(len(payload)):
        bad = bytearray(payload)
        bad[i] ^= 0x10
        try:
            got = decode_hop(bytes(bad), LIMITS)
        except FrameError:
            continue
        pytest.fail(f"flipping byte {i} went unnoticed: {got}")


def test_notes_beyond_the_window_or_of_unknown_origin_are_refused_and_stale_ones_dropped():
    with pytest.raises(FrameError, match="origin 9"):
        decode_hop(encode_hop([], [Note(3, AUDIT, 9, 1)]), LIMITS)
    with pytest.raises(FrameError, match="step 101"):
        decode_hop(encode_hop([], [Note(101, AUDIT, 1, 1)]), LIMITS)
    with pytest.raises(FrameError, match="a vote has a body, an audit none"):
        decode_hop(encode_hop([], [Note(3, AUDIT, 1, 1, b"x")]), LIMITS)
    with pytest.raises(FrameError, match="8-byte link hop, got 0 bytes"):
        decode_hop(encode_hop([], [Note(3, JOIN, 1, 1)]), LIMITS)
    assert link_hop(join_note(3, 1, 1, 2**40)) == 2**40
    # F8: a sponsor owes a late neighbour every note it still holds, older than the receiver's
    # window too; such a note is stale, not an error (it crashed sponsor and newcomer before)
    window = Limits(n_origins=8, min_step=105, max_step=233, max_k=1, seed_of=seed_of)
    fresh = Note(110, AUDIT, 2, 5)
    assert decode_hop(encode_hop([], [Note(104, AUDIT, 3, 1), fresh]), window) == ([], [fresh])


def test_a_leave_note_names_its_unlink_hop_travels_and_carries_no_body():
    note = leave_note(4, 5, 2**40)
    assert (note.step, note.kind, note.origin, note.value, note.body) == (4, LEAVE, 5, 2**40, b"")
    assert note.id == ("leave", 5, 4)  # one per origin and step, apart from a join's or an audit's
    assert decode_hop(encode_hop([msg(1, 4)], [note]), LIMITS) == ([msg(1, 4)], [note])
    with pytest.raises(FrameError, match="a leave has no body, got 1 bytes"):
        decode_hop(encode_hop([], [Note(4, LEAVE, 5, 9, b"x")]), LIMITS)


def test_step_payload_carries_its_change_and_binds_it_to_the_step():
    msgs = [msg(0, 6), msg(1, 6)]
    change = Change(6, leave=(2,), join=((3, 1),))
    payload = encode_step(msgs, change)
    assert decode_step(payload, 6, seed_of=seed_of) == (msgs, change)
    assert encode_step(msgs) == message.encode(msgs) and encode_step(msgs, Change(6)) == message.encode(msgs)
    with pytest.raises(FrameError, match="CRC"):
        decode_step(payload, 7, seed_of=seed_of)  # the same record presented as another step's


def test_change_validates_itself():
    with pytest.raises(ValueError, match="audited"):
        Change(1, leave=(), audit=(2,))
    with pytest.raises(ValueError, match="both leaves and joins"):
        Change(1, leave=(2,), join=((2, 1),))
    assert not Change(1) and Change(1, leave=(2,))


def test_roster_apply_refuses_impossible_changes():
    r = Roster(3)
    with pytest.raises(FrameError, match="already members"):
        r.apply(Change(0, join=((1, 1),)))
    r.apply(Change(0, leave=(1,)))
    with pytest.raises(FrameError, match="not members"):
        r.apply(Change(1, leave=(1,)))


def test_audit_verdict_names_the_odd_one_or_refuses_without_a_majority():
    notes = [Note(9, AUDIT, o, 5) for o in (0, 1, 2)] + [Note(9, AUDIT, 3, 6), Note(8, AUDIT, 4, 7)]
    assert audit_verdict(0, 9, notes, {0, 1, 2, 3, 4}) == [3]
    assert audit_verdict(0, 9, notes, {0, 1, 2}) == []
    with pytest.raises(ExcludedError, match="node 3: the audit of step 9"):
        audit_verdict(3, 9, notes, {0, 1, 2, 3})
    with pytest.raises(MembershipError, match="no majority state"):
        audit_verdict(0, 9, notes[2:4], {2, 3})
    assert audit_verdict(0, 9, [], {0, 1}) == []


def test_flood_carries_notes_keeps_them_past_the_step_and_catches_up_a_new_peer():
    a = Flood(0, [1], range(2))
    b = Flood(1, [0], range(2))
    a.originate([msg(0, 0)])
    a.originate_notes([Note(0, AUDIT, 0, 11)])
    b.originate([msg(1, 0)])
    for src, dst in ((a, b), (b, a)):
        dst.receive(src.node, src.outbox()[dst.node])
    assert a.held(0) == b.held(0) == {0: 1, 1: 1}
    assert b.take_step(0, [0, 1]) == [msg(0, 0), msg(1, 0)]
    assert b.notes(0, AUDIT) == [Note(0, AUDIT, 0, 11)]  # kept after its step was taken
    # a late copy of an applied step's message is a duplicate, a note still is not lost
    assert b.receive(0, [msg(0, 0)]) == []
    # drop the peer, then take it back: it is owed everything held (its state is unknown)
    a.drop_peer(1)
    assert a.peers == () and a.idle
    a.originate([msg(0, 1)])
    a.add_peer(1)
    owed = a.outbox()[1]
    assert msg(0, 1) in owed and Note(0, AUDIT, 0, 11) in owed


def test_the_attach_node_moves_to_the_next_member_only_when_it_leaves():
    r = Roster(5, attach=3)
    r.apply(Change(1, leave=(1,)))
    assert r.attach == 3  # another node's leave moves nothing
    r.apply(Change(2, leave=(3, 4)))
    assert r.attach == 0  # 4 left too: the first member after 3, cyclically
    r.apply(Change(3, join=((3, 2),)))
    assert r.attach == 0  # a rejoined predecessor does not take it back
    r.apply(Change(4, leave=(0,)))
    assert r.attach == 2
    assert next_attach(2, {2}, 5) == 2 and next_attach(4, {0, 1}, 5) == 0
    with pytest.raises(ValueError):
        next_attach(0, set(), 5)


def test_pushes_and_catch_up_blobs_round_trip_and_refuse_defects():
    payloads = [
        (0, encode_step([msg(0, 0), msg(1, 0)])),
        (1, encode_step([msg(0, 1)], Change(1, leave=(1,)))),
        (2, b""),
    ]
    for s, p in payloads:
        assert decode_push(encode_push(s, p)) == (s, p)
    blob = encode_pushes(payloads)
    assert decode_pushes(blob) == payloads and decode_pushes(encode_pushes([])) == []
    with pytest.raises(FrameError):
        decode_push(b"\x01\x00")
    for bad in (blob[:-1], blob[:3], blob[:5] + bytes([blob[5] ^ 1]) + blob[6:]):
        with pytest.raises(FrameError):
            decode_pushes(bad)


def test_step_sequence_takes_each_step_once_in_order_and_refuses_gaps():
    seq = StepSequence(3)
    assert [seq.offer(s) for s in (0, 1, 2, 3, 3, 4)] == [False, False, False, True, False, True]
    assert seq.next == 5
    with pytest.raises(FrameError, match="jumps from step 5 to step 7"):
        seq.offer(7)


def test_step_sequence_refuses_a_step_that_arrives_again_with_other_contents():
    # F6: two senders that both believe they are the attach node must not interleave two histories
    seq = StepSequence(0)
    assert seq.offer(0, b"step zero") and seq.offer(1, b"step one")
    assert not seq.offer(1, b"step one")  # the same bytes again: a repeat, dropped
    with pytest.raises(FrameError, match="step 1 arrived again with other contents"):
        seq.offer(1, b"another step one")


def test_catch_up_payload_round_trips_and_any_flipped_bit_is_refused():
    held = encode_hop([msg(2, 5)], [join_note(5, 3, 2, 40)])
    steps = [(0, encode_step([msg(0, 0)])), (1, encode_step([msg(1, 1)], Change(1, leave=(0,))))]
    c = CatchUp(sponsor=1, next_step=7, join_step=8, incarnation=2, steps=steps, held=held, hop=2**33 + 5)
    data = c.to_bytes()
    assert CatchUp.from_bytes(data) == c
    assert CatchUp.from_bytes(CatchUp(0, 0, 1, 2, [], b"").to_bytes()).steps == []
    for at in range(0, len(data), 7):  # a flipped bit anywhere: magic, CRC, head, held or steps
        with pytest.raises(FrameError):
            CatchUp.from_bytes(data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1 :])
    with pytest.raises(FrameError):
        CatchUp.from_bytes(data[:-3])


def test_a_copy_note_is_checked_as_its_message_would_be_and_a_bad_one_refuses_the_hop():
    """A COPY note round-trips to the message it carries; one whose body has the wrong length,
    whose seed is not the derived one, whose k is out of range or whose scalar is not finite or
    too large refuses the whole hop payload (FrameError), so nothing of it is taken."""
    import dataclasses
    import math
    import struct

    from seedflood.core.membership.notes import COPY, Note, copied, copy_note

    m = Message.make(3, 7, seed_of(3, 7, 0), 0.25)
    note = copy_note(m)
    assert copied(note) == m and decode_hop(encode_hop([], [note]), LIMITS) == ([], [note])
    bad = [
        dataclasses.replace(note, body=note.body + b"\x00"),
        Note(7, COPY, 3, 0, struct.pack("<Qf", m.seed + 1, 0.25)),  # a seed nobody derives
        Note(7, COPY, 3, 1, note.body),  # k beyond perturbations
        *(Note(7, COPY, 3, 0, struct.pack("<Qf", m.seed, x)) for x in (math.inf, math.nan, 1e30)),
    ]
    for n in bad:
        with pytest.raises(FrameError):
            decode_hop(encode_hop([], [n]), LIMITS)
