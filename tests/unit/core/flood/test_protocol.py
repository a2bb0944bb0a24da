"""The protocol value: derived limits, step validation, lr schedule, delay, trajectory fingerprint."""

from __future__ import annotations

import math
import random
import struct

import pytest

from seedflood.core.config import runconfig as config
from seedflood.core.config.configerror import ConfigError
from seedflood.core.flood.protocol import Protocol, digest, node_of, rank_of, trajectory
from seedflood.core.wire.message import FrameError, Message


def proto(*overrides: str, diameter: int = 2) -> Protocol:
    return Protocol.of(config.load(None, ["topology.nodes=3", *overrides]), diameter)


def step_messages(p: Protocol, step: int, scalar: float = 0.5) -> list[Message]:
    return [
        Message.make(o, step, p.seed(o, step, k), scalar, k) for o in range(p.n_origins) for k in range(p.perturbations)
    ]


def test_rank_map_round_trips():
    assert rank_of(0) == 1 and node_of(1) == 0
    assert all(node_of(rank_of(n)) == n for n in range(100))


@pytest.mark.parametrize(
    ("diameter", "hops", "delay"), [(4, 0, 0), (4, 4, 0), (4, 2, 1), (4, 3, 1), (4, 1, 3), (0, 0, 0)]
)
def test_hops_and_delay(diameter, hops, delay):
    p = proto(f"flood.hops_per_step={hops}", diameter=diameter)
    assert p.hops == (hops or max(1, diameter))
    assert p.delay == delay == max(0, math.ceil(diameter / p.hops) - 1)


def test_step_window_must_exceed_delay():
    with pytest.raises(ConfigError, match="flood.step_window"):
        proto("flood.hops_per_step=1", "flood.step_window=3", diameter=4)


def test_a_newcomer_is_owed_the_steps_since_its_catch_up_that_its_wire_window_takes():
    p = proto("flood.hops_per_step=1", diameter=4)  # delay 3: catch-up before step 20 - 3 - 1 = 16
    assert p.owed_from(20) == 16 - p.delay == 13
    narrow = proto("flood.hops_per_step=1", "flood.step_window=5", diameter=4)
    assert narrow.owed_from(20) == 17  # at local step 21 it takes steps from 16 on; one more kept clear
    assert narrow.limits(21 - 5, 21 + 5).min_step <= narrow.owed_from(20)


@pytest.mark.parametrize(("diameter", "hops"), [(4, 0), (4, 1), (4, 2), (0, 0)])
def test_overlap_adds_exactly_one_step_of_delay(diameter, hops):
    plain = proto(f"flood.hops_per_step={hops}", diameter=diameter)
    over = proto(f"flood.hops_per_step={hops}", "flood.overlap=true", diameter=diameter)
    assert over.overlap and not plain.overlap
    assert over.delay == plain.delay + 1 and over.hops == plain.hops
    with pytest.raises(ConfigError, match=f"flooding delay {over.delay} .*overlap"):
        proto(f"flood.hops_per_step={hops}", "flood.overlap=true", f"flood.step_window={over.delay}", diameter=diameter)


def test_check_step_accepts_exactly_a_complete_valid_step():
    p = proto("zo.perturbations=2")
    good = step_messages(p, 5)
    p.check_step(5, good)
    with pytest.raises(FrameError, match="complete step has 6"):
        p.check_step(5, good[:-1])
    with pytest.raises(FrameError, match="complete step has 6"):
        p.check_step(5, good + good[:1])
    with pytest.raises(FrameError, match="outside window"):
        p.check_step(6, good)
    nan = [Message.make(m.origin, m.step, m.seed, float("nan"), m.k) if m.origin == 1 else m for m in good]
    with pytest.raises(FrameError, match="not finite"):
        p.check_step(5, nan)
    forged = [Message(m.step, m.origin, m.k, m.seed ^ 1, m.scalar) if m.origin == 0 else m for m in good]
    with pytest.raises(FrameError, match="derivation"):
        p.check_step(5, forged)


def test_lr_schedule_values():
    p = proto("zo.lr=2.0", "zo.schedule=linear", "zo.warmup_steps=10", "run.steps=110")
    assert [p.lr_at(s) for s in (0, 9, 60, 110)] == pytest.approx([0.2, 2.0, 1.0, 0.0])
    c = proto("zo.lr=1.0", "zo.schedule=cosine", "run.steps=100")
    assert [c.lr_at(s) for s in (0, 50, 100)] == pytest.approx([1.0, 0.5, 0.0])
    assert proto("zo.lr=3.0").lr_at(77) == 3.0


def test_coefficient_uses_weight_and_lr():
    m = Message.make(0, 0, 1, 0.25)
    assert proto("zo.lr=4", "zo.aggregate=sum").coefficient(m) == pytest.approx(-1.0)
    assert proto("zo.lr=4", "zo.aggregate=mean").coefficient(m) == pytest.approx(-1.0 / 3)


def test_trajectory_names_what_changes_the_bits_and_ignores_the_rest():
    def traj(*o: str, diameter: int = 2) -> dict:
        cfg = config.load(None, ["topology.nodes=3", *o])
        return trajectory(cfg, Protocol.of(cfg, diameter), "d")

    base = traj()
    for free in (
        "run.out_dir=elsewhere",
        "run.threads=2",
        "eval.every=3",
        "checkpoint.every=7",
        "transport.timeout_s=5",
        "model.device=cpu",
        "flood.step_window=9",
        "topology.kind=complete",
    ):
        assert traj(free) == base, free
    for key, value in (
        ("zo.lr", "5.0"),
        ("zo.eps", "0.05"),
        ("run.seed", "3"),
        ("subspace.rank", "8"),
        ("task.batch_size", "4"),
        ("zo.aggregate", "mean"),
        ("model.dtype", "bfloat16"),
    ):
        changed = traj(f"{key}={value}")
        assert [k for k in base if base[k] != changed[k]] == [key], key
    assert traj("flood.hops_per_step=1", diameter=2)["flood.delay"] == 1 != base["flood.delay"]
    # run.steps matters only to a decaying schedule
    assert traj("run.steps=500") == base
    assert traj("zo.schedule=cosine", "run.steps=500") != traj("zo.schedule=cosine")


def test_digest_is_order_and_content_sensitive():
    a = digest([({"s": "x"}, 0), ({"s": "y"}, 1)])
    assert a == digest([({"s": "x"}, 0), ({"s": "y"}, 1)])
    assert a != digest([({"s": "y"}, 1), ({"s": "x"}, 0)])
    assert a != digest([({"s": "x"}, 0), ({"s": "y"}, 0)])


# -- zo.clip: a step's scalars clamped to ±clip × their median magnitude -------------------------
def clip_step(p: Protocol, scalars: list[float], step: int = 4) -> list[Message]:
    """One step of p with one message per origin (K = 1) carrying these scalars, canonical order."""
    return [Message.make(o, step, p.seed(o, step, 0), x) for o, x in enumerate(scalars)]


HONEST = [1.0, -2.0, 3.0, 0.5, -1.5]  # |median| 1.5


def test_clip_off_gives_exactly_the_coefficients_of_each_message():
    p = proto("topology.nodes=5", "zo.lr=0.3", "zo.aggregate=mean", "zo.schedule=cosine", "run.steps=9")
    assert p.clip == 0.0
    msgs = clip_step(p, [1.0, -2.0, 3.0, 0.5, 4000.0])  # an outlier is applied as it came
    assert p.clip_bound(msgs) == math.inf
    got = p.coefficients(msgs)
    assert [struct.pack("<d", c) for c in got] == [struct.pack("<d", p.coefficient(m)) for m in msgs]


@pytest.mark.parametrize("factor", [10.0, -10.0, 1000.0, -1000.0])
def test_clip_clamps_an_outlier_to_clip_times_median_and_leaves_the_others_alone(factor):
    """Origin 4 scales its honest scalar by `factor`: its |scalar| goes over the bound and is
    clamped to ±5 × median (sign kept); the four honest coefficients keep their exact bits."""
    p = proto("topology.nodes=5", "zo.clip=5", "zo.lr=0.3", "zo.aggregate=mean")
    plain = proto("topology.nodes=5", "zo.lr=0.3", "zo.aggregate=mean")
    msgs = clip_step(p, [*HONEST[:4], HONEST[4] * factor])
    median = sorted(abs(m.scalar) for m in msgs)[2]
    assert p.clip_bound(msgs) == 5 * median
    got = p.coefficients(msgs)
    assert got[:4] == [plain.coefficient(m) for m in msgs[:4]]  # the same floats, bit for bit
    bound = 5 * median
    assert abs(msgs[4].scalar) > bound
    assert got[4] == plain.coefficient(Message.make(4, 4, 0, math.copysign(bound, msgs[4].scalar)))
    # the whole honest step is under the bound: the clip changes nothing there
    honest = clip_step(p, HONEST)
    assert p.coefficients(honest) == plain.coefficients(honest) == [plain.coefficient(m) for m in honest]


def test_clip_bound_is_the_median_of_the_set_whatever_the_order():
    """Six messages (the median is the mean of the two middle magnitudes): every order of the same
    messages gives the same bound, and each message the same coefficient, to the bit."""
    p = proto("topology.nodes=6", "zo.clip=2", "zo.lr=0.7")
    msgs = clip_step(p, [0.1, -7.3, 2.2, 1e-3, -3.9, 250.0])
    a, b = sorted(abs(m.scalar) for m in msgs)[2:4]  # the f32 values of 2.2 and 3.9
    assert p.clip_bound(msgs) == 2 * ((a + b) / 2)
    want = dict(zip(msgs, p.coefficients(msgs)))
    assert want[msgs[5]] == -0.7 * p.clip_bound(msgs)  # 250 clamped
    for seed in range(5):
        shuffled = list(msgs)
        random.Random(seed).shuffle(shuffled)
        assert struct.pack("<d", p.clip_bound(shuffled)) == struct.pack("<d", p.clip_bound(msgs))
        assert dict(zip(shuffled, p.coefficients(shuffled))) == want


def test_clip_must_be_off_or_at_least_one():
    with pytest.raises(ConfigError, match=r"zo.clip: must be 0 \(off\) or a finite number >= 1 \(below 1"):
        proto("zo.clip=0.9")
    assert proto("zo.clip=1").clip == 1.0


def test_clip_enters_the_trajectory_only_when_set():
    def traj(*o: str) -> dict:
        cfg = config.load(None, ["topology.nodes=3", *o])
        return trajectory(cfg, Protocol.of(cfg, 2), "d")

    base = traj()
    assert "zo.clip" not in base and traj("zo.clip=0") == base  # older run directories still resume
    clipped = traj("zo.clip=5")
    assert clipped == {**base, "zo.clip": 5.0}
    assert traj("zo.clip=10")["zo.clip"] == 10.0
