"""Golden vectors pin every random stream (a change here silently breaks replay of old logs), and\ndifferent keys give different, independent streams: distinct seeds, mixed bits, uncorrelated draws."""

import random

import numpy as np
import pytest
import torch

from seedflood.core.config import rng


def test_derive_golden():
    assert rng.derive(0, 0, 0, 0) == 941587915991483940
    assert [rng.derive(42, o, s, k) for o, s, k in [(1, 0, 0), (0, 1, 0), (0, 0, 1), (3, 1000, 2)]] == [
        GOLD_DERIVE[0],
        GOLD_DERIVE[1],
        GOLD_DERIVE[2],
        GOLD_DERIVE[3],
    ]


def test_hash_golden_and_vectorised():
    h = rng.hash_u64(1, np.arange(3))
    assert h.tolist() == [8841707400507832957, 13830413928045401970, 6869446166584666695]
    big = rng.hash_u64(2**64 - 1, np.array([0, 2**63, 2**64 - 1], dtype=np.uint64))
    assert big.tolist() == GOLD_HASH_BIG
    # Element i of a vector equals the same counter hashed alone.
    cs = np.arange(100, dtype=np.uint64)
    assert all(rng.hash_u64(9, cs)[i] == rng.hash_u64(9, cs[i : i + 1])[0] for i in range(100))


def test_basis_golden_and_orthonormal():
    b = rng.orthonormal_basis(0, 0, 0, 8, 3)
    assert b.dtype == torch.float32 and b.shape == (8, 3)
    assert b[0].tolist() == [0.2767747938632965, -0.03767390921711922, 0.2394627034664154]
    assert torch.equal(b, rng.orthonormal_basis(0, 0, 0, 8, 3))
    assert not torch.equal(b, rng.orthonormal_basis(0, 1, 0, 8, 3))
    big = rng.orthonormal_basis(5, 2, 7, 576, 32)
    assert torch.allclose(big.T @ big, torch.eye(32), atol=1e-5)
    assert float(big.double().sum()) == pytest.approx(GOLD_BASIS_SUM, abs=1e-4)
    with pytest.raises(ValueError, match="exceeds"):
        rng.orthonormal_basis(0, 0, 0, 4, 8)


def test_combine_is_deterministic_order_sensitive_and_rejects_negative_keys():
    assert rng.derive(0, 1, 2) != rng.derive(0, 2, 1)
    assert rng.combine(1, 2) != rng.combine(2, 1)
    assert rng.combine(1, 2) == rng.combine(1, 2)
    assert rng.generator(1, 2).integers(0, 2**31) == rng.generator(1, 2).integers(0, 2**31)
    # Prefix-free: appending a key (even 0) or dropping one changes the value.
    assert len({rng.combine(), rng.combine(0), rng.combine(0, 0), rng.combine(0, 0, 0)}) == 4
    with pytest.raises(ValueError):
        rng.combine(-1)


def _bit_balance(values: np.ndarray) -> np.ndarray:
    """Fraction of ones in each of the 64 bit positions of a uint64 array."""
    bits = (values[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    return bits.mean(axis=0)


def test_derive_gives_distinct_well_mixed_seeds_over_many_keys():
    """Every (run, origin, step, k) of a sizeable grid gets its own seed: a seed that ignored a key
    (or mixed two keys symmetrically) would collide here. 2**14 random 64-bit values collide with
    probability ~1e-11, so any collision is a bug."""
    keys = [(r, o, s, k) for r in range(2) for o in range(32) for s in range(128) for k in range(2)]
    seeds = np.array([rng.derive(*key) for key in keys], dtype=np.uint64)
    assert len(set(seeds.tolist())) == len(keys)
    # Each bit is set in about half of the seeds: n = 16384, sd of a fraction 0.004; allow 6 sd.
    assert np.abs(_bit_balance(seeds) - 0.5).max() < 0.025
    # Neighbouring keys differ in about half of their bits (avalanche), on average over the grid.
    grid = seeds.reshape(2, 32, 128, 2)
    for axis in range(4):
        a = np.take(grid, range(grid.shape[axis] - 1), axis=axis).ravel()
        b = np.take(grid, range(1, grid.shape[axis]), axis=axis).ravel()
        flipped = np.unpackbits((a ^ b).view(np.uint8)).mean()
        assert abs(flipped - 0.5) < 0.02, (axis, flipped)


def test_domain_tags_separate_the_streams():
    """The same trailing keys under different tags (message, basis, batch, gaussian) never coincide,
    and the message seed is exactly the TAG_MESSAGE-keyed combine."""
    tags = [rng.TAG_MESSAGE, rng.TAG_BASIS, rng.TAG_BATCH, rng.TAG_GAUSSIAN]
    assert len(set(tags)) == 4
    tails = [(r, o, s) for r in range(3) for o in range(16) for s in range(64)]
    per_tag = [{rng.combine(t, *tail) for tail in tails} for t in tags]
    assert all(len(vals) == len(tails) for vals in per_tag)
    for i in range(4):
        for j in range(i + 1, 4):
            assert not per_tag[i] & per_tag[j], (hex(tags[i]), hex(tags[j]))
    assert rng.derive(3, 4, 5, 0) == rng.combine(rng.TAG_MESSAGE, 3, 4, 5, 0)
    # Draws under different tags with equal trailing keys are not the same stream either.
    x = rng.generator(rng.TAG_BATCH, 0, 1, 2).standard_normal(4096)
    y = rng.generator(rng.TAG_GAUSSIAN, 0, 1, 2).standard_normal(4096)
    assert abs(np.corrcoef(x, y)[0, 1]) < 0.08


def test_hash_u64_streams_of_neighbouring_keys_are_independent():
    """hash_u64(key, counters) for keys key and key + 1: no shared outputs, ~half the bits differ
    position by position, and the uniform variates they give are uncorrelated."""
    counters = np.arange(8192, dtype=np.uint64)
    streams = [rng.hash_u64(key, counters) for key in (0, 1, 2, 2**63, 2**63 + 1)]
    for i in range(len(streams)):
        assert len(np.unique(streams[i])) == len(counters)  # a bijection of the counter
        for j in range(i + 1, len(streams)):
            a, b = streams[i], streams[j]
            assert not np.intersect1d(a, b).size
            assert abs(np.unpackbits((a ^ b).view(np.uint8)).mean() - 0.5) < 0.01
            # uniforms in [0, 1) from the top 53 bits; n = 8192: sd of r ≈ 0.011, allow 5 sd.
            ua, ub = (a >> np.uint64(11)) / 2.0**53, (b >> np.uint64(11)) / 2.0**53
            assert abs(np.corrcoef(ua, ub)[0, 1]) < 0.055
    # Counter i and key k must not simply shift into each other (hash(k, i+1) == hash(k+1, i)).
    assert not np.intersect1d(streams[0][1:], streams[1][:-1]).size


@pytest.mark.parametrize("which", range(4))
def test_generators_of_neighbouring_keys_are_uncorrelated(which):
    """numpy and torch generators, the Gaussian direction's per-tensor stream, and the SubCGE
    basis: changing any one key by 1 gives an uncorrelated stream (|r| < 5 sd of r)."""
    n = 4096
    base = (rng.TAG_BATCH, 7, 3, 11)
    for pos in range(1, len(base)):
        keys = list(base)
        keys[pos] += 1
        if which == 0:
            a = rng.generator(*base).standard_normal(n)
            b = rng.generator(*keys).standard_normal(n)
        elif which == 1:
            a = rng.torch_generator(*base)
            b = rng.torch_generator(*keys)
            a = torch.randn(n, generator=a, dtype=torch.float64).numpy()
            b = torch.randn(n, generator=b, dtype=torch.float64).numpy()
        elif which == 2:  # Gaussian direction: seed of a message, tensor index
            seed = rng.derive(*base)
            ka = (rng.TAG_GAUSSIAN, seed, 0)
            kb = (rng.TAG_GAUSSIAN, seed, 1) if pos == 1 else (rng.TAG_GAUSSIAN, rng.derive(*keys), 0)
            a = torch.randn(n, generator=rng.torch_generator(*ka), dtype=torch.float64).numpy()
            b = torch.randn(n, generator=rng.torch_generator(*kb), dtype=torch.float64).numpy()
        else:  # SubCGE basis: neighbouring epoch / matrix / run seed
            args = [7, 3, 11]
            other = list(args)
            other[pos - 1] += 1
            a = rng.orthonormal_basis(*args, n, 1).double().numpy().ravel()
            b = rng.orthonormal_basis(*other, n, 1).double().numpy().ravel()
        assert not np.array_equal(a, b)
        assert abs(np.corrcoef(a, b)[0, 1]) < 5 / n**0.5, (which, pos)


GOLD_DERIVE = [12001020829282296307, 9346403609480263811, 3563677420456351431, 3686775031131422024]
GOLD_HASH_BIG = [5476333178966447588, 16947516999699840885, 4016027445752322388]
GOLD_BASIS_SUM = -8.25169463909424


def test_cached_derive_is_exactly_combine_over_the_message_keys():
    """derive continues from a cached run prefix with cached key hashes (the rejoin hot path):
    it must stay bit-for-bit the plain definition, keys of any size and the negative check too."""
    r = random.Random(5)
    for _ in range(2000):
        run, o, s, k = (r.randrange(2 ** r.choice([3, 16, 32, 63])) for _ in range(4))
        assert rng.derive(run, o, s, k) == rng.combine(rng.TAG_MESSAGE, run, o, s, k)
    with pytest.raises(ValueError):
        rng.derive(0, 0, -1, 0)
