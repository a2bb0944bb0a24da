"""Canonical-order application: any arrival order of the same messages gives the same bits."""

import random

import pytest
import torch
from torch import nn

from seedflood import rng
from seedflood.config import SubspaceConfig, ZOConfig
from seedflood.directions import build
from seedflood.message import Message
from seedflood.replay import Applier, ReplayError, lr_at, state_hash

torch.set_num_threads(1)


def model():
    g = torch.Generator().manual_seed(3)
    m = nn.Sequential(nn.Linear(12, 10, bias=False), nn.Linear(10, 8, bias=False))
    for p in m.parameters():
        p.data = torch.randn(p.shape, generator=g)
    return m


def messages(steps=6, origins=5):
    r = random.Random(1)
    return {
        s: [Message.make(o, s, rng.derive(9, o, s), r.uniform(-50, 50)) for o in range(origins)]
        for s in range(steps)
    }


@pytest.mark.parametrize("family", ["gaussian", "subcge"])
@pytest.mark.parametrize("merge_every", [1, 3])
def test_any_arrival_order_gives_identical_bits(family, merge_every):
    zo = ZOConfig(direction=family, trainable=["*"], lr=1e-3)
    sub = SubspaceConfig(rank=4, refresh=3, merge_every=merge_every)
    hashes = set()
    for trial in range(4):
        m = model()
        d = build(m, zo, sub, run_seed=9)
        a = Applier(d, zo, total_steps=6, n_origins=5)
        for s, msgs in messages().items():
            shuffled = list(msgs)
            random.Random(trial).shuffle(shuffled)
            a.apply(s, shuffled)
        hashes.add(state_hash(m, d))
    assert len(hashes) == 1


@pytest.mark.parametrize("family", ["gaussian", "subcge"])
def test_updates_change_the_model_and_order_of_steps_is_enforced(family):
    zo = ZOConfig(direction=family, trainable=["*"], lr=1e-2)
    m = model()
    d = build(m, zo, SubspaceConfig(rank=4), run_seed=9)
    h0 = state_hash(m, d)
    a = Applier(d, zo, total_steps=6, n_origins=5)
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
        Applier(build(m, zo, SubspaceConfig(rank=4), 9), zo, 1, 5).apply(0, msgs)
        out.append([p.detach().clone() for p in m.parameters()])
    for x, y in zip(*out):
        assert torch.allclose(x, y, atol=1e-7)


def test_lr_schedule_is_a_pure_function_of_step():
    zo = ZOConfig(lr=2.0, schedule="linear", warmup_steps=10)
    assert lr_at(0, zo, 110) == pytest.approx(0.2)
    assert lr_at(9, zo, 110) == pytest.approx(2.0)
    assert lr_at(60, zo, 110) == pytest.approx(1.0)
    assert lr_at(110, zo, 110) == pytest.approx(0.0)
    cos = ZOConfig(lr=1.0, schedule="cosine")
    assert lr_at(0, cos, 100) == pytest.approx(1.0)
    assert lr_at(50, cos, 100) == pytest.approx(0.5)
    assert lr_at(7, ZOConfig(lr=3.0), 100) == 3.0
    assert [lr_at(s, zo, 110) for s in range(110)] == [lr_at(s, zo, 110) for s in range(110)]


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
