"""Canonical-order application (any arrival order of the same messages gives the same bits) and
the lr schedule as a pure function of (step, config, total steps)."""

import math
import random

import pytest
import torch
from torch import nn

from seedflood.core.config import rng
from seedflood.core.config.runconfig import Config
from seedflood.core.config.systemsections import TopologyConfig
from seedflood.core.config.trainsections import RunConfig, SubspaceConfig, ZOConfig
from seedflood.core.flood.protocol import Protocol
from seedflood.core.wire.message import Message
from seedflood.core.zo.family import build
from seedflood.core.zo.replay import Applier, ReplayError, state_hash

torch.set_num_threads(1)


def protocol(zo: ZOConfig, steps: int = 6, n_origins: int = 5) -> Protocol:
    """The run protocol of a config with these zo settings, `steps` steps and N clients."""
    cfg = Config(zo=zo, run=RunConfig(steps=steps), topology=TopologyConfig(nodes=n_origins))
    return Protocol.of(cfg, diameter=1)


def lr_at(step: int, zo: ZOConfig, total_steps: int) -> float:
    """lr(step) of a fresh protocol built from (zo, total_steps): the schedule under test."""
    return protocol(zo, steps=total_steps).lr_at(step)


def model():
    g = torch.Generator().manual_seed(3)
    m = nn.Sequential(nn.Linear(12, 10, bias=False), nn.Linear(10, 8, bias=False))
    for p in m.parameters():
        p.data = torch.randn(p.shape, generator=g)
    return m


def messages(steps=6, origins=5):
    r = random.Random(1)
    return {
        s: [Message.make(o, s, rng.derive(9, o, s), r.uniform(-50, 50)) for o in range(origins)] for s in range(steps)
    }


# Arrival-order cases: (family, subspace rank, origins per step). With SubCGE a message adds one
# fp32 value per matrix into the r×r core at a coordinate drawn from r² cells, so rank 1 puts every
# message of a step into the same cell and rank 2 puts ~n/4 into each: fp32 addition is not
# associative, so only the canonical sort makes those sums agree. Gaussian adds coef·z to every entry.
ORDER_CASES = [("gaussian", 4, 12), ("subcge", 1, 40), ("subcge", 2, 40)]


def _fp32_sums_depend_on_order(values: list[float], orders: list[list[int]]) -> bool:
    """Whether summing `values` in float32 in the given orders gives more than one result: the
    precondition that makes an arrival-order test able to see a missing sort."""
    results = set()
    for order in orders:
        acc = torch.zeros((), dtype=torch.float32)
        for i in order:
            acc += torch.tensor(values[i], dtype=torch.float32)
        results.add(float(acc))
    return len(results) > 1


@pytest.mark.parametrize("family, rank, origins", ORDER_CASES)
@pytest.mark.parametrize("merge_every", [1, 3])
def test_any_arrival_order_gives_identical_bits(family, rank, origins, merge_every):
    """Applier.apply sorts each step canonically: shuffled arrivals end in one hash. Guards the
    `sorted(messages)` in Applier.apply (removing it makes these hashes differ)."""
    zo = ZOConfig(direction=family, trainable=["*"], lr=1e-3)
    sub = SubspaceConfig(rank=rank, refresh=3, merge_every=merge_every)
    steps = messages(origins=origins)
    orders = []
    for trial in range(6):
        order = list(range(origins))
        random.Random(trial).shuffle(order)
        orders.append(order)
    assert len({tuple(o) for o in orders}) == len(orders)
    # The test must be able to fail: step 0's coefficients summed in fp32 in these orders disagree.
    coefs = [-1e-3 * m.scalar for m in steps[0]]
    assert _fp32_sums_depend_on_order(coefs, orders)
    hashes = set()
    for order in orders:
        m = model()
        d = build(m, zo, sub, run_seed=9)
        a = Applier(d, protocol(zo, steps=6, n_origins=origins))
        for s, msgs in steps.items():
            a.apply(s, [msgs[i] for i in order])
        hashes.add(state_hash(m, d))
    assert len(hashes) == 1


@pytest.mark.parametrize("family", ["gaussian", "subcge"])
def test_updates_change_the_model_and_order_of_steps_is_enforced(family):
    zo = ZOConfig(direction=family, trainable=["*"], lr=1e-2)
    m = model()
    d = build(m, zo, SubspaceConfig(rank=4), run_seed=9)
    h0 = state_hash(m, d)
    a = Applier(d, protocol(zo))
    msgs = messages()
    a.apply(0, msgs[0])
    assert state_hash(m, d) != h0
    with pytest.raises(ReplayError, match="out of order"):
        a.apply(2, msgs[2])
    with pytest.raises(ReplayError, match="handed in"):
        a.apply(1, msgs[3])


def test_mean_aggregate_is_sum_over_n():
    """w = 1/N: applying with 'mean' equals applying 'sum' at lr/N (to float rounding)."""
    msgs = messages(steps=1)[0]
    out = []
    for agg, lr in (("sum", 0.01 / 5), ("mean", 0.01)):
        zo = ZOConfig(direction="subcge", trainable=["*"], lr=lr, aggregate=agg)
        m = model()
        Applier(build(m, zo, SubspaceConfig(rank=4), 9), protocol(zo, steps=1)).apply(0, msgs)
        out.append([p.detach().clone() for p in m.parameters()])
    for x, y in zip(*out):
        assert torch.allclose(x, y, atol=1e-7)


def test_lr_schedule_reproduces_hand_computed_values():
    """Warmup (step+1)/warmup, then constant / linear / cosine over total − warmup steps."""
    zo = ZOConfig(lr=2.0, schedule="linear", warmup_steps=10)
    assert lr_at(0, zo, 110) == pytest.approx(0.2)
    assert lr_at(4, zo, 110) == pytest.approx(1.0)
    assert lr_at(9, zo, 110) == pytest.approx(2.0)
    assert lr_at(10, zo, 110) == pytest.approx(2.0)  # decay starts after warmup: frac = 0
    assert lr_at(35, zo, 110) == pytest.approx(1.5)  # frac = 25/100
    assert lr_at(60, zo, 110) == pytest.approx(1.0)
    assert lr_at(110, zo, 110) == pytest.approx(0.0)
    assert lr_at(500, zo, 110) == pytest.approx(0.0)  # clamped past the end, never negative
    cos = ZOConfig(lr=1.0, schedule="cosine")
    assert lr_at(0, cos, 100) == pytest.approx(1.0)
    assert lr_at(25, cos, 100) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))  # 0.853553
    assert lr_at(50, cos, 100) == pytest.approx(0.5)
    assert lr_at(75, cos, 100) == pytest.approx(0.5 * (1 + math.cos(3 * math.pi / 4)))  # 0.146447
    assert lr_at(100, cos, 100) == pytest.approx(0.0, abs=1e-12)
    cos_w = ZOConfig(lr=4.0, schedule="cosine", warmup_steps=4)
    assert [lr_at(s, cos_w, 104) for s in range(4)] == pytest.approx([1.0, 2.0, 3.0, 4.0])
    assert lr_at(54, cos_w, 104) == pytest.approx(2.0)  # half way through the 100 decay steps
    assert lr_at(7, ZOConfig(lr=3.0), 100) == 3.0
    const_w = ZOConfig(lr=3.0, warmup_steps=3)
    assert [lr_at(s, const_w, 100) for s in (0, 1, 2, 3, 99)] == pytest.approx([1.0, 2.0, 3.0, 3.0, 3.0])


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_lr_schedule_is_a_pure_function_of_step_and_config(schedule):
    """lr(step) depends on (step, lr, schedule, warmup, total steps) only: one protocol object
    asked in any order, a separate protocol built from an equal config, and protocols differing
    only in fields outside the schedule all give the same values; the schedule's inputs do matter."""
    total = 50
    zo = ZOConfig(lr=2.0, schedule=schedule, warmup_steps=5)
    p = protocol(zo, steps=total)
    forward = [p.lr_at(s) for s in range(total)]
    # The same object again, backwards and in a shuffled order: no state carried between calls.
    assert [p.lr_at(s) for s in reversed(range(total))][::-1] == forward
    order = list(range(total))
    random.Random(0).shuffle(order)
    shuffled = {s: p.lr_at(s) for s in order}
    assert [shuffled[s] for s in range(total)] == forward
    # Another protocol (another schedule and horizon) queried in between leaks nothing into p.
    noise = protocol(ZOConfig(lr=9.0, schedule="linear", warmup_steps=2), steps=7)
    interleaved = []
    for s in range(total):
        noise.lr_at(total - 1 - s)
        interleaved.append(p.lr_at(s))
    assert interleaved == forward
    # A separate object from an equal config, and one whose other settings all differ.
    assert [
        protocol(ZOConfig(lr=2.0, schedule=schedule, warmup_steps=5), steps=total).lr_at(s) for s in range(total)
    ] == forward
    unrelated = ZOConfig(
        lr=2.0, schedule=schedule, warmup_steps=5, eps=0.5, aggregate="mean", direction="gaussian", perturbations=3
    )
    q = protocol(unrelated, steps=total, n_origins=9)
    assert [q.lr_at(s) for s in range(total)] == forward
    # ...while the schedule's own inputs do change it: lr, warmup and (when decaying) the horizon.
    assert lr_at(7, ZOConfig(lr=4.0, schedule=schedule, warmup_steps=5), total) == 2 * forward[7]
    assert lr_at(2, ZOConfig(lr=2.0, schedule=schedule, warmup_steps=8), total) != forward[2]
    if schedule != "constant":
        assert lr_at(20, zo, 2 * total) != forward[20]
        assert len(set(forward[5:])) == total - 5, "a decaying schedule changes every step"
    else:
        assert set(forward[5:]) == {2.0}


def test_state_hash_sees_every_bit_and_pending_core():
    m = model()
    d = build(m, ZOConfig(direction="subcge", trainable=["*"]), SubspaceConfig(rank=4, merge_every=2), 0)
    h0 = state_hash(m, d)
    w = m[0].weight.data
    w.view(-1).view(torch.int32)[5] ^= 1  # flip one mantissa bit
    assert state_hash(m, d) != h0
    w.view(-1).view(torch.int32)[5] ^= 1
    assert state_hash(m, d) == h0
    d.accumulate(0, 1, 1e-3)
    assert state_hash(m, d) != h0


# -- the batched path ------------------------------------------------------------------------------
def reference_apply(applier: Applier, steps) -> None:
    """The per-message path the batched Applier must reproduce bit for bit: one `accumulate` per
    message in canonical order, one `commit` per step (what Applier.apply did before batching)."""
    d, p = applier.direction, applier.protocol
    for step, msgs in steps:
        for m in sorted(msgs):
            d.accumulate(step, m.seed, p.coefficient(m))
        d.commit(step)
        applier.last_step = step


def colliding_steps(n_steps: int, origins: int, start: int = 0):
    """Steps whose scalars span signs and 8 orders of magnitude, so fp32 cell sums depend on order."""
    r = random.Random(start)
    return [
        (
            s,
            [
                Message.make(o, s, rng.derive(9, o, s), r.choice([-1, 1]) * 10 ** r.uniform(-4, 4))
                for o in range(origins)
            ],
        )
        for s in range(start, start + n_steps)
    ]


# (rank, refresh, merge_every): rank 1-2 put many messages into one core cell; refresh 4 crosses
# epoch boundaries (basis redrawn, forced merges) inside one batch.
BATCH_CASES = [(1, 4, 1), (2, 4, 2), (2, 4, 4), (2, 12, 3), (3, 6, 6)]


@pytest.mark.parametrize("rank, refresh, merge_every", BATCH_CASES)
def test_batched_apply_all_equals_per_message_path(rank, refresh, merge_every, monkeypatch):
    """apply_all (vectorised accumulation between merges) gives the bits of the per-message path
    after every prefix, including pending cores and merges at the configured steps; a small batch
    size makes apply_all flush mid-epoch and mid-merge-interval too."""
    zo = ZOConfig(direction="subcge", trainable=["*"], lr=1e-3)
    sub = SubspaceConfig(rank=rank, refresh=refresh, merge_every=merge_every)
    steps = colliding_steps(13, 40)
    # Precondition: the test can see a reordering (fp32 sums of step 0 depend on order).
    coefs = [-1e-3 * m.scalar for m in steps[0][1]]
    assert _fp32_sums_depend_on_order(coefs, [list(range(40)), list(range(39, -1, -1))])
    for batch in (1 << 15, 50):  # one flush for everything / a flush inside merge intervals
        monkeypatch.setattr(Applier, "BATCH_MESSAGES", batch)
        ref_m, got_m = model(), model()
        ref = Applier(build(ref_m, zo, sub, 9), protocol(zo, steps=13, n_origins=40))
        got = Applier(build(got_m, zo, sub, 9), protocol(zo, steps=13, n_origins=40))
        for cut in (1, 5, 13):  # resume-like: apply_all of consecutive chunks
            lo = ref.last_step + 1
            reference_apply(ref, steps[lo:cut])
            assert got.apply_all(steps[lo:cut]) == cut - lo
            assert got.last_step == ref.last_step == cut - 1
            assert state_hash(got_m, got.direction) == state_hash(ref_m, ref.direction), (batch, cut)
            assert got.direction.S_epoch == ref.direction.S_epoch


def test_batched_apply_is_a_no_op_for_the_bits_of_live_single_steps():
    """Applier.apply (one step) and apply_all (all steps at once) end in the same hash."""
    zo = ZOConfig(direction="subcge", trainable=["*"], lr=1e-3)
    sub = SubspaceConfig(rank=2, refresh=6, merge_every=3)
    steps = colliding_steps(8, 30)
    hashes = []
    for one_by_one in (True, False):
        m = model()
        a = Applier(build(m, zo, sub, 9), protocol(zo, steps=8, n_origins=30))
        if one_by_one:
            for s, msgs in steps:
                a.apply(s, msgs)
        else:
            a.apply_all(steps)
        hashes.append(state_hash(m, a.direction))
    assert hashes[0] == hashes[1]


def test_bad_step_in_a_batch_applies_the_steps_before_it():
    """A step out of order inside apply_all raises after the earlier steps were applied, exactly
    as applying them one by one would leave the state."""
    zo = ZOConfig(direction="subcge", trainable=["*"], lr=1e-3)
    sub = SubspaceConfig(rank=2, refresh=6, merge_every=3)
    steps = colliding_steps(4, 10)
    m, ref_m = model(), model()
    a = Applier(build(m, zo, sub, 9), protocol(zo, steps=8, n_origins=10))
    ref = Applier(build(ref_m, zo, sub, 9), protocol(zo, steps=8, n_origins=10))
    with pytest.raises(ReplayError, match="out of order"):
        a.apply_all(steps[:2] + steps[3:])
    reference_apply(ref, steps[:2])
    assert a.last_step == 1
    assert state_hash(m, a.direction) == state_hash(ref_m, ref.direction)


# -- zo.clip through the Applier ---------------------------------------------------------------
def outlier_steps(factor: float, steps: int = 4, origins: int = 5):
    """Honest dyadic scalars (so ±2 × median is exact in f32), rotated per step, and origin 2
    lying by `factor`. Honest steps have |median| 1.5 and max 3: exactly on the bound at clip 2."""
    honest = [1.0, -2.0, 0.5, 3.0, -1.5]
    out = []
    for s in range(steps):
        xs = [honest[(o + s) % 5] for o in range(origins)]
        xs[2] *= factor
        out.append((s, [Message.make(o, s, rng.derive(9, o, s), x) for o, x in enumerate(xs)]))
    return out


def applied(zo: ZOConfig, steps, origins: int = 5, order=None) -> str:
    m = model()
    a = Applier(build(m, zo, SubspaceConfig(rank=2, refresh=3), 9), protocol(zo, steps=len(steps), n_origins=origins))
    for s, msgs in steps:
        a.apply(s, [msgs[i] for i in order] if order else msgs)
    return state_hash(m, a.direction)


@pytest.mark.parametrize("family", ["gaussian", "subcge"])
def test_clip_off_applies_every_scalar_as_it_came(family):
    """zo.clip = 0: the liar's scalar goes in whole; the bits are those of the per-message path
    with protocol.coefficient (the update rule before the clip existed)."""
    zo = ZOConfig(direction=family, trainable=["*"], lr=1e-3)
    steps = outlier_steps(1000.0)
    m = model()
    ref = Applier(build(m, zo, SubspaceConfig(rank=2, refresh=3), 9), protocol(zo, steps=4))
    reference_apply(ref, steps)
    assert applied(zo, steps) == state_hash(m, ref.direction)


@pytest.mark.parametrize("family", ["gaussian", "subcge"])
@pytest.mark.parametrize("factor", [10.0, -1000.0])
def test_clip_applies_an_outlier_as_if_it_had_sent_the_bound(family, factor):
    """With zo.clip = 2 a step whose origin 2 sent ×10 or ×−1000 its honest scalar ends on the bits
    of an unclipped run in which origin 2 sent ±2 × the step's median magnitude; clipping steps
    without an outlier (their largest scalar on the bound) changes nothing; any arrival order
    gives the same bits."""
    plain = ZOConfig(direction=family, trainable=["*"], lr=1e-3)
    clipped = ZOConfig(direction=family, trainable=["*"], lr=1e-3, clip=2.0)
    lying = outlier_steps(factor)
    bounded = []
    for s, msgs in lying:
        median = sorted(abs(m.scalar) for m in msgs)[2]
        assert abs(msgs[2].scalar) > 2 * median
        liar = msgs[2]
        sent = Message.make(liar.origin, s, liar.seed, math.copysign(2 * median, liar.scalar))
        assert sent.scalar == math.copysign(2 * median, liar.scalar)  # exact in f32
        bounded.append((s, [*msgs[:2], sent, *msgs[3:]]))
    want = applied(plain, bounded)
    assert applied(clipped, lying) == want != applied(plain, lying)
    assert {applied(clipped, lying, order=o) for o in ([4, 3, 2, 1, 0], [2, 0, 4, 1, 3])} == {want}
    honest = outlier_steps(1.0)
    assert applied(clipped, honest) == applied(plain, honest)
