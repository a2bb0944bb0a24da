"""The audit draw and the RECOMPUTE note (core/flood/audits.py, core/membership/notes.py).

- The draw is a rate: 0 never, 1 always (nobody audits itself), otherwise close to the rate over
  many (auditor, origin, step); it is deterministic, and changes with the basis (the last applied
  step's messages) and with the auditor's private part (its signature in a signed run).
- A RECOMPUTE note carries (accused, k, recomputed f32) through a hop, signed or not; a note no
  correct peer sends (accusing its own signer, a k out of range, a bad body) is a FrameError;
  only its signer (the auditor) may sign it.
"""

from __future__ import annotations

import dataclasses

import pytest
from test_signing import LIMITS, msg, signing  # the signing tests' keys and limits

from seedflood.core.flood import audits
from seedflood.core.flood.hop import decode_hop, encode_hop
from seedflood.core.flood.signing import may_sign
from seedflood.core.membership.notes import RECOMPUTE, Note, check_note, recompute_note, recomputed
from seedflood.core.wire.message import FrameError

BASIS = audits.basis([msg(0, 3), msg(1, 3)])


def test_rate_zero_never_rate_one_always_and_nobody_audits_itself():
    draws = [(a, o, s) for a in range(8) for o in range(8) for s in range(20)]
    assert not any(audits.chosen(BASIS, b"", a, o, s, 0.0) for a, o, s in draws)
    assert all(audits.chosen(BASIS, b"", a, o, s, 1.0) == (a != o) for a, o, s in draws)


@pytest.mark.parametrize("rate", [0.1, 0.25, 0.5])
def test_the_draw_has_the_rate_and_is_deterministic(rate):
    draws = [(a, o, s) for a in range(8) for o in range(8) if a != o for s in range(100)]
    hits = [audits.chosen(BASIS, b"", a, o, s, rate) for a, o, s in draws]
    assert abs(sum(hits) / len(hits) - rate) < 0.03  # 5,600 draws: 3 % is > 4 standard deviations
    assert hits == [audits.chosen(BASIS, b"", a, o, s, rate) for a, o, s in draws]


def test_the_draw_changes_with_the_applied_messages_and_the_auditors_secret():
    draws = [(a, o, s) for a in range(8) for o in range(8) if a != o for s in range(20)]

    def sample(basis: bytes, secret: bytes) -> list[bool]:
        return [audits.chosen(basis, secret, a, o, s, 0.5) for a, o, s in draws]

    other = audits.basis([msg(0, 3), msg(1, 3, scalar=0.25)])  # one scalar differs
    assert other != BASIS and audits.basis([]) != BASIS
    assert sample(BASIS, b"") != sample(other, b"")
    secret = audits.private(signing(2), 7)
    assert secret == audits.private(signing(2), 7) and secret != audits.private(signing(3), 7)
    assert secret != audits.private(signing(2), 8) and audits.private(None, 7) == b""
    assert sample(BASIS, secret) != sample(BASIS, b"")


@pytest.mark.parametrize("signed", [False, True])
def test_a_recompute_note_round_trips_a_hop(signed):
    note = recompute_note(auditor=2, accused=5, step=7, k=0, scalar=0.1)
    assert recomputed(note) == (5, 0, pytest.approx(0.1)) and note.kind == RECOMPUTE and note.origin == 2
    if signed:
        note = signing(2).seal(note)
        assert signing(4).authentic(note)
    _, notes = decode_hop(encode_hop([msg(5, 7)], [note], signed=signed), LIMITS)
    assert notes == [note] and recomputed(notes[0]) == recomputed(note)
    assert may_sign(note, 2) and not may_sign(note, 5) and not may_sign(note, 3)
    # two accusations by one auditor in one step are two notes (its id holds the body)
    assert recompute_note(2, 6, 7, 0, 0.1).id != note.id


@pytest.mark.parametrize(
    "note, words",
    [
        (recompute_note(2, 2, 7, 0, 0.1), "names origin 2"),
        (recompute_note(2, 9, 7, 0, 0.1), "names origin 9"),
        (recompute_note(2, 5, 7, 1, 0.1), "k 1"),
        (dataclasses.replace(recompute_note(2, 5, 7, 0, 0.1), body=b"\0" * 3), "8-byte k and scalar"),
        (Note(7, RECOMPUTE, 2, 5), "8-byte k and scalar"),
    ],
)
def test_a_recompute_note_no_correct_peer_sends_is_refused(note, words):
    with pytest.raises(FrameError, match=words):
        check_note(note, LIMITS)
