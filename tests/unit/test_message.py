import math
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seedflood import message, rng
from seedflood.message import FrameError, Limits, Message

msg_st = st.builds(
    Message.make,
    origin=st.integers(0, 63),
    step=st.integers(0, 10_000),
    seed=st.integers(0, 2**64 - 1),
    scalar=st.floats(-1e5, 1e5, allow_nan=False, width=32),
    k=st.integers(0, 3),
)


@given(st.lists(msg_st, max_size=40, unique_by=lambda m: m.id))
@settings(max_examples=200, deadline=None)
def test_round_trip(msgs):
    frame = message.encode(msgs)
    assert len(frame) == message.HEADER_SIZE + message.RECORD_SIZE * len(msgs)
    assert message.decode(frame, Limits(n_origins=64, max_k=4)) == msgs


def test_scalar_is_rounded_to_float32_at_origin():
    m = Message.make(0, 0, 1, 0.1)
    assert m.scalar == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert message.decode(message.encode([m]))[0].scalar == m.scalar


def test_empty_frame_is_header_only():
    assert message.decode(message.encode([])) == []
    assert len(message.encode([])) == 16


def _frame(n=3):
    return message.encode([Message.make(i, 5, rng.derive(0, i, 5), 0.5 * i) for i in range(n)])


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda f: f[:-1], "does not match"),
        (lambda f: f[:10], "shorter"),
        (lambda f: b"XXXX" + f[4:], "magic"),
        (lambda f: f[:4] + b"\x02\x00" + f[6:], "version"),
        (lambda f: f[:20] + bytes([f[20] ^ 1]) + f[21:], "checksum"),
        (lambda f: f + b"\x00" * 24, "does not match"),
    ],
)
def test_corrupt_frames_are_rejected(mutate, words):
    with pytest.raises(FrameError, match=words):
        message.decode(mutate(_frame()))


def _reframe(records):
    """Build a frame with a valid checksum around arbitrary records (to test field validation)."""
    import zlib

    body = b"".join(message.RECORD.pack(*r) for r in records)
    return message.HEADER.pack(b"SFLD", 1, 24, len(records), zlib.crc32(body)) + body


@pytest.mark.parametrize(
    "record, words",
    [
        ((9, 5, 1, 0.5, 0, 0), "origin 9 out of range"),
        ((1, 500, 1, 0.5, 0, 0), "outside window"),
        ((1, 5, 1, math.nan, 0, 0), "not finite"),
        ((1, 5, 1, math.inf, 0, 0), "not finite"),
        ((1, 5, 1, 3e7, 0, 0), "exceeds"),
        ((1, 5, 1, 0.5, 2, 0), "k=2 out of range"),
        ((1, 5, 1, 0.5, 0, 7), "reserved"),
        ((1, 5, 12345, 0.5, 0, 0), "seed"),
    ],
)
def test_invalid_records_reject_the_whole_frame(record, words):
    good = (0, 5, rng.derive(0, 0, 5, 0), 0.25, 0, 0)
    limits = Limits(
        n_origins=4, min_step=0, max_step=100, max_k=1, max_scalar=1e6, seed_of=lambda o, s, k: rng.derive(0, o, s, k)
    )
    assert len(message.decode(_reframe([good]), limits)) == 1
    with pytest.raises(FrameError, match=words):
        message.decode(_reframe([good, record]), limits)


def test_duplicate_ids_in_one_frame_are_rejected():
    m = Message.make(1, 2, 3, 0.5)
    with pytest.raises(FrameError, match="repeats"):
        message.decode(message.encode([m, m]))


def test_random_bytes_never_decode_to_messages():
    r = random.Random(0)
    for _ in range(2000):
        blob = bytes(r.getrandbits(8) for _ in range(r.randrange(0, 100)))
        with pytest.raises(FrameError):
            message.decode(blob, Limits(n_origins=4))


def test_mutated_frames_are_rejected_or_unchanged():
    """Flipping any single byte of a valid frame is caught (header checks or the CRC)."""
    frame = _frame(4)
    for i in range(len(frame)):
        for bit in (0, 7):
            bad = bytearray(frame)
            bad[i] ^= 1 << bit
            with pytest.raises(FrameError):
                message.decode(bytes(bad), Limits(n_origins=4, seed_of=lambda o, s, k: rng.derive(0, o, s, k)))


def test_canonical_order_is_step_origin_k():
    ms = [
        Message.make(2, 1, 0, 0.0),
        Message.make(0, 2, 0, 0.0),
        Message.make(1, 1, 0, 0.0, k=1),
        Message.make(1, 1, 0, 0.0, k=0),
    ]
    assert [m.id for m in sorted(ms)] == [(1, 1, 0), (1, 1, 1), (2, 1, 0), (0, 2, 0)]
