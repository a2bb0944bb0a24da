import math
import random
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seedflood.core.config import rng
from seedflood.core.wire import message
from seedflood.core.wire.message import FrameError, Layout, Limits, Message


def seed_of(o: int, s: int, k: int) -> int:
    return rng.derive(0, o, s, k)


@st.composite
def msg_st(draw, derived: bool = True):
    """A message; with `derived` its seed is seed_of's (v2 frames carry no seed)."""
    o, s, k = draw(st.integers(0, 63)), draw(st.integers(0, 10_000)), draw(st.integers(0, 3))
    seed = seed_of(o, s, k) if derived else draw(st.integers(0, 2**64 - 1))
    return Message.make(o, s, seed, draw(st.floats(-1e5, 1e5, allow_nan=False, width=32)), k)


def v2_size(msgs) -> int:
    """The v2 frame size computed by hand from the format (docs in message.py)."""
    if not msgs:
        return 0
    base = min(m.step for m in msgs)
    w = message.width
    offset, origin, k = w(max(m.step - base for m in msgs)), w(max(m.origin for m in msgs)), w(max(m.k for m in msgs))
    return 2 + 1 + 1 + w(len(msgs)) + 4 + 4 + len(msgs) * (offset + origin + k + 4)


@given(st.lists(msg_st(derived=False), max_size=40, unique_by=lambda m: m.id))
@settings(max_examples=100, deadline=None)
def test_round_trip_v1(msgs):
    frame = message.encode(msgs, version=1)
    assert len(frame) == message.HEADER_SIZE + message.RECORD_SIZE * len(msgs)
    assert message.decode(frame, Limits(n_origins=64, max_k=4)) == msgs


@given(st.lists(msg_st(), max_size=40, unique_by=lambda m: m.id))
@settings(max_examples=200, deadline=None)
def test_round_trip_v2(msgs):
    frame = message.encode(msgs)
    assert len(frame) == v2_size(msgs)
    assert message.decode(frame, Limits(n_origins=64, max_k=4, seed_of=seed_of)) == msgs
    assert message.decode(frame, seed_of=seed_of) == msgs
    # v1 and v2 carry the same messages.
    assert message.decode(message.encode(msgs, version=1)) == msgs


def encode_reference(messages) -> bytes:
    """The v2 frame of `messages` built field by field as message.py's docstring spells it out:
    the definition the fast encoder is tested against."""
    if not messages:
        return b""
    base = min(m.step for m in messages)
    offsets = [m.step - base for m in messages]
    origins = [m.origin for m in messages]
    ks = [m.k for m in messages]
    w = message.width
    lay = Layout(w(max(offsets)), w(max(origins)), w(max(ks)), w(len(messages)))
    cols = [col for width, col in zip(lay.fields, (offsets, origins, ks)) if width] + [[m.scalar for m in messages]]
    body = b"".join(lay.record.pack(*row) for row in zip(*cols))
    head = b"SF" + bytes((2, lay.byte)) + len(messages).to_bytes(lay.count, "little") + struct.pack("<I", base)
    return head + struct.pack("<I", zlib.crc32(body, zlib.crc32(head[2:]))) + body


@st.composite
def wide_msgs(draw):
    """Messages whose fields need every width (0, 1, 2, 4 bytes), unique ids, seeds of seed_of."""
    n = draw(st.integers(0, 300))
    field = st.sampled_from([0, 1, 255, 256, 65535, 65536, 2**20])
    ids = draw(
        st.lists(
            st.tuples(field, st.integers(0, 5) | field, st.integers(0, 2) | field), min_size=n, max_size=n, unique=True
        )
    )
    base = draw(st.integers(0, 2**31))
    scalar = st.floats(-1e5, 1e5, allow_nan=False, width=32)
    return [Message.make(o, base + s, seed_of(o, base + s, k), draw(scalar), k) for o, s, k in ids]


@given(wide_msgs())
@settings(max_examples=60, deadline=None)
def test_encode_writes_the_bytes_of_the_reference_encoder(msgs):
    """The fast encoder (one struct call per frame) and the field-by-field definition agree."""
    assert message.encode(msgs) == encode_reference(msgs)


@given(
    wide_msgs(),
    st.integers(0, 70000),
    st.integers(0, 2**31),
    st.integers(0, 2**20),
    st.sampled_from([1e6, 1e-3, math.inf]),
)
@settings(max_examples=100, deadline=None)
def test_fast_decode_agrees_with_the_checked_decoder(msgs, n_origins, window, max_k, max_scalar):
    """On any frame and limits the fast path either gives up (None) or returns exactly what the
    checked decoder returns; whenever the checked decoder rejects, the fast path gives up."""
    frame = message.encode(msgs)
    base = min((m.step for m in msgs), default=0)
    for limits in (
        None,
        Limits(n_origins, base, base + window, max_k, max_scalar, seed_of),
        Limits(n_origins, max_k=max_k),
    ):
        fast = message._decode_v2_fast(frame, limits, seed_of)
        try:
            want = message._decode_v2(frame, limits, seed_of)
        except FrameError:
            assert fast is None
            continue
        assert fast is None or fast == want
    if msgs:  # a valid frame under generous limits takes the fast path
        assert message._decode_v2_fast(frame, Limits(2**21, max_k=2**21, seed_of=seed_of), seed_of) == msgs


def test_scalar_is_rounded_to_float32_at_origin():
    m = Message.make(0, 0, seed_of(0, 0, 0), 0.1)
    assert m.scalar == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert message.decode(message.encode([m]), seed_of=seed_of)[0].scalar == m.scalar
    assert message.decode(message.encode([m], version=1))[0].scalar == m.scalar


def test_empty_frame_is_zero_bytes_in_v2_and_header_only_in_v1():
    assert message.encode([]) == b""
    assert message.decode(b"") == [] and message.decode(b"", Limits(n_origins=4)) == []
    assert message.decode(message.encode([], version=1)) == []
    assert len(message.encode([], version=1)) == 16


def test_v2_sizes_on_16_clients():
    """16 origins, K = 1: 5 bytes a message for one step, 6 when the frame spans steps."""
    one_step = [Message.make(o, 700, seed_of(o, 700, 0), 1.0) for o in range(16)]
    assert len(message.encode(one_step)) == 13 + 16 * 5
    spread = [Message.make(o, 700 + o % 8, seed_of(o, 700 + o % 8, 0), 1.0) for o in range(16)]
    assert len(message.encode(spread)) == 13 + 16 * 6
    assert len(message.encode(one_step[:1])) == 13 + 4  # origin 0, offset 0, k 0: widths 0
    # 300 messages: a 2-byte count and a 2-byte origin.
    many = [Message.make(o, 3, seed_of(o, 3, 1), 1.0, k=1) for o in range(300)]
    assert len(message.encode(many)) == 4 + 2 + 8 + 300 * (0 + 2 + 1 + 4)


def test_v2_seeds_come_from_seed_of_and_never_travel():
    ms = [Message.make(o, 9, seed_of(o, 9, k), 0.5, k) for o in range(3) for k in range(2)]
    frame = message.encode(ms)
    for m in ms:  # no seed's bytes appear in the frame
        assert m.seed.to_bytes(8, "little") not in frame
    other = message.decode(frame, seed_of=lambda o, s, k: rng.derive(1, o, s, k))
    assert [m.seed for m in other] == [rng.derive(1, m.origin, 9, m.k) for m in ms]
    assert [(m.id, m.scalar) for m in other] == [(m.id, m.scalar) for m in ms]
    # Limits.seed_of still checks the seeds an explicit, different seed_of made.
    with pytest.raises(FrameError, match="does not match its derivation"):
        message.decode(frame, Limits(n_origins=3, max_k=2, seed_of=seed_of), seed_of=lambda o, s, k: 0)
    assert message.decode(frame, Limits(n_origins=3, max_k=2, seed_of=seed_of), seed_of=seed_of) == ms


def test_decoding_v2_without_seed_of_is_a_clear_error():
    frame = message.encode([Message.make(0, 1, seed_of(0, 1, 0), 0.5)])
    with pytest.raises(ValueError, match="v2 frame carries no seeds; pass seed_of") as e:
        message.decode(frame, Limits(n_origins=4))
    assert not isinstance(e.value, FrameError)
    with pytest.raises(ValueError, match="carries no seeds"):
        message.decode(frame)


def _frame(n=3, version=message.VERSION):
    return message.encode([Message.make(i, 5, seed_of(i, 5, 0), 0.5 * i) for i in range(n)], version=version)


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
def test_corrupt_v1_frames_are_rejected(mutate, words):
    with pytest.raises(FrameError, match=words):
        message.decode(mutate(_frame(version=1)))


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda f: f[:-1], "does not match"),
        (lambda f: f[:10], "shorter"),
        (lambda f: f[:3], "shorter"),
        (lambda f: b"XX" + f[2:], "magic"),
        (lambda f: f[:2] + b"\x03" + f[3:], "version"),
        (lambda f: f[:3] + bytes([f[3] & 0x3F]) + f[4:], "count width 0 is reserved"),
        (lambda f: f[:5] + bytes([f[5] ^ 1]) + f[6:], "checksum"),  # the base step is covered
        (lambda f: f[:3] + bytes([f[3] ^ 0x10]) + f[4:], "does not match|checksum"),  # k width
        (lambda f: f[:20] + bytes([f[20] ^ 1]) + f[21:], "checksum"),
        (lambda f: f + b"\x00" * 6, "does not match"),
    ],
)
def test_corrupt_v2_frames_are_rejected(mutate, words):
    frame = _frame()
    assert message.decode(frame, seed_of=seed_of)
    with pytest.raises(FrameError, match=words):
        message.decode(mutate(frame), seed_of=seed_of)


def _reframe(records):
    """Build a v1 frame with a valid checksum around arbitrary records (to test field validation)."""
    body = b"".join(message.RECORD.pack(*r) for r in records)
    return message.HEADER.pack(b"SFLD", 1, 24, len(records), zlib.crc32(body)) + body


def _reframe_v2(records, base, layout=None, count=None):
    """A v2 frame with a valid checksum around (offset, origin, k, scalar) records, any layout."""
    lay = layout or Layout(4, 4, 4, 4)
    n = len(records) if count is None else count
    rec = message._record_struct(lay.offset, lay.origin, lay.k)
    body = b"".join(rec.pack(*[v for v, w in zip(r[:3], lay.fields) if w], r[3]) for r in records)
    head = b"SF" + bytes((2, lay.byte)) + n.to_bytes(lay.count, "little") + base.to_bytes(4, "little")
    return head + zlib.crc32(body, zlib.crc32(head[2:])).to_bytes(4, "little") + body


LIMITS = Limits(n_origins=4, min_step=0, max_step=100, max_k=1, max_scalar=1e6, seed_of=seed_of)


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
    assert len(message.decode(_reframe([good]), LIMITS)) == 1
    with pytest.raises(FrameError, match=words):
        message.decode(_reframe([good, record]), LIMITS)


@pytest.mark.parametrize(
    "record, words",
    [
        ((0, 9, 0, 0.5), "origin 9 out of range"),
        ((495, 1, 0, 0.5), "outside window"),
        ((0, 1, 0, math.nan), "not finite"),
        ((0, 1, 0, math.inf), "not finite"),
        ((0, 1, 0, 3e7), "exceeds"),
        ((0, 1, 2, 0.5), "k=2 out of range"),
    ],
)
def test_invalid_v2_records_reject_the_whole_frame(record, words):
    good = (0, 0, 0, 0.25)
    lay = Layout(2, 1, 1, 1)  # wide enough for every record above
    assert len(message.decode(_reframe_v2([good], 5, Layout(0, 0, 0, 1)), LIMITS)) == 1
    with pytest.raises(FrameError, match=words):
        message.decode(_reframe_v2([good, record], 5, lay), LIMITS)


@pytest.mark.parametrize(
    "records, base, layout, count, words",
    [
        ([(0, 1, 0, 0.5)], 5, Layout(0, 2, 0, 1), None, "not the narrowest"),  # origin 1 in 2 bytes
        ([(0, 1, 0, 0.5)], 5, Layout(0, 1, 0, 2), None, "not the narrowest"),  # count 1 in 2 bytes
        ([(0, 1, 0, 0.5)], 5, Layout(1, 1, 0, 1), None, "not the narrowest"),  # offsets all 0
        ([(1, 1, 0, 0.5), (2, 2, 0, 0.5)], 5, Layout(1, 1, 0, 1), None, "base step 5 is not"),
        ([], 5, Layout(0, 0, 0, 1), 0, "at least one message"),
        ([(0, 1, 0, 0.5)], 2**32 - 1, Layout(1, 1, 0, 1), None, None),  # the reference: valid
        ([(0, 1, 0, 0.5), (1, 2, 0, 0.5)], 2**32 - 1, Layout(1, 1, 0, 1), None, "32 bits"),
    ],
)
def test_v2_frames_have_exactly_one_encoding(records, base, layout, count, words):
    frame = _reframe_v2(records, base, layout, count)
    if words is None:
        frame = _reframe_v2(records, base, Layout(0, 1, 0, 1))
        assert message.encode(message.decode(frame, seed_of=seed_of)) == frame
        return
    with pytest.raises(FrameError, match=words):
        message.decode(frame, seed_of=seed_of)


@pytest.mark.parametrize("version", [1, 2])
def test_duplicate_ids_in_one_frame_are_rejected(version):
    m = Message.make(1, 2, seed_of(1, 2, 0), 0.5)
    with pytest.raises(FrameError, match="repeats"):
        message.decode(message.encode([m, m], version=version), seed_of=seed_of)


def test_random_bytes_never_decode_to_messages():
    """Any non-empty blob is rejected (b"" is the empty v2 frame, tested above)."""
    r = random.Random(0)
    for _ in range(2000):
        blob = bytes(r.getrandbits(8) for _ in range(r.randrange(1, 100)))
        for head in (b"", b"SF\x02", b"SFLD\x01\x00\x18\x00"):  # also past each magic
            with pytest.raises(FrameError):
                message.decode(head + blob, Limits(n_origins=4, seed_of=seed_of))


@pytest.mark.parametrize("version", [1, 2])
def test_mutated_frames_are_rejected_or_unchanged(version):
    """Flipping any bit of a valid frame is caught (header checks or the CRC)."""
    frame = _frame(4, version=version)
    for i in range(len(frame)):
        for bit in range(8):
            bad = bytearray(frame)
            bad[i] ^= 1 << bit
            with pytest.raises(FrameError):
                message.decode(bytes(bad), Limits(n_origins=4, seed_of=seed_of))


def test_canonical_order_is_step_origin_k():
    ms = [
        Message.make(2, 1, 0, 0.0),
        Message.make(0, 2, 0, 0.0),
        Message.make(1, 1, 0, 0.0, k=1),
        Message.make(1, 1, 0, 0.0, k=0),
    ]
    assert [m.id for m in sorted(ms)] == [(1, 1, 0), (1, 1, 1), (2, 1, 0), (0, 2, 0)]
