"""tensorwire.py: dense, top-k and int8 tensor frames: exact sizes, round trips, corruption."""

import pytest
import torch

from seedflood.experiments import tensorwire as tw


def vec(n=1000, seed=0):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def test_dense_round_trip_is_exact_and_sized():
    x = vec()
    f = tw.encode_dense(x)
    assert len(f) == tw.size("dense", x.numel()) == 20 + 4 * 1000
    assert torch.equal(tw.decode(f), x)
    assert torch.equal(tw.dense_view(f), x)


def test_topk_keeps_the_largest_entries():
    x = vec()
    k = tw.topk_count(x.numel(), 0.05)
    assert k == 50
    idx, val = tw.topk_select(x, k)
    f = tw.encode_topk(x.numel(), idx, val)
    assert len(f) == tw.size("topk", x.numel(), k) == 20 + 8 * 50
    out = tw.decode(f)
    kept = out != 0
    assert int(kept.sum()) == k
    assert torch.equal(out[kept], x[kept])
    assert x[~kept].abs().max() <= x[kept].abs().min()
    n, i2, v2 = tw.decode_topk(f)
    assert n == 1000 and torch.equal(i2, idx) and torch.equal(v2, val)
    assert tw.topk_count(10, 1e-9) == 1 and tw.topk_count(10, 1.0) == 10


def test_int8_error_within_half_a_step_per_segment():
    x = torch.cat([vec(300, 1) * 0.01, vec(700, 2) * 5.0, torch.zeros(5)])
    sizes = [300, 700, 5]
    f = tw.encode_int8(x, sizes)
    assert len(f) == tw.size("int8", x.numel(), len(sizes)) == 20 + 8 * 3 + 1005
    out = tw.decode(f)
    off = 0
    for n in sizes:
        seg, got = x[off : off + n], out[off : off + n]
        step = float(seg.abs().max()) / 127
        assert float((seg - got).abs().max()) <= step / 2 + 1e-7  # per-tensor scale: the small one stays fine
        off += n
    assert torch.equal(out[-5:], torch.zeros(5))


@pytest.mark.parametrize("kind", ["dense", "topk", "int8"])
def test_any_flipped_byte_or_truncation_is_refused(kind):
    x = vec(64)
    if kind == "dense":
        f = tw.encode_dense(x)
    elif kind == "topk":
        f = tw.encode_topk(64, *tw.topk_select(x, 8))
    else:
        f = tw.encode_int8(x, [32, 32])
    for pos in range(len(f)):
        bad = bytearray(f)
        bad[pos] ^= 0x10
        with pytest.raises(tw.WireError):
            tw.decode(bytes(bad))
    with pytest.raises(tw.WireError):
        tw.decode(f[:-1])
    with pytest.raises(tw.WireError):
        tw.decode(f + b"\0")


def test_wrong_inputs_are_caller_errors():
    with pytest.raises(ValueError):
        tw.encode_dense(torch.zeros(2, 2))
    with pytest.raises(ValueError):
        tw.encode_int8(torch.zeros(4), [3])
    with pytest.raises(tw.WireError, match="expected a topk frame"):
        tw.decode_topk(tw.encode_dense(torch.zeros(3)))
