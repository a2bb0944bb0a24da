"""N clients of a tiny random causal LM in one process, through the real flooding and replay.

These pin the central invariant (docs/design.md, Processes and the step loop): with full flooding every client holds the same
bits after every step, on any topology, and training makes progress.
"""

import pytest
import torch

from seedflood.core.config import runconfig as config
from seedflood.core.wire import message
from seedflood.ml import encoding, objective
from seedflood.ml.workload import Workload
from seedflood.roles.inprocess import simulate

torch.set_num_threads(1)

BASE = [
    "model.name=tiny",
    "task.name=synthetic",
    "run.threads=1",
    "zo.lr=1.0",
    "task.batch_size=8",
    "task.train_examples=256",
    "task.dev_examples=64",
    "task.test_examples=64",
]


def cfg_for(*overrides):
    return config.load(None, BASE + list(overrides))


def train_loss(w: Workload) -> float:
    with w.direction.current():
        return float(objective.loss(w.model, encoding.encode(w.splits.train, w.spec, w.loaded.tokenizer, 64)))


@pytest.fixture(scope="module")
def runs():
    out = {}
    for kind in ("ring", "complete"):
        out[kind] = simulate(cfg_for("topology.nodes=8", f"topology.kind={kind}", "run.steps=20"))
    return out


def ring8_cfg(hops: int):
    """8 clients on a ring (diameter 4), 6 steps: 0 hops per step = full flooding (delay 0), 2 hops
    -> delay 1, 1 hop -> delay 3."""
    return cfg_for("topology.nodes=8", "topology.kind=ring", "run.steps=6", f"flood.hops_per_step={hops}")


@pytest.fixture(scope="module")
def ring8():
    """hops -> the uninterrupted run of `ring8_cfg(hops)`, simulated once for the tests that check
    different properties of it (delayed flooding's consensus, each resume); per-step hashes where
    a test reads them (2 hops)."""
    done = {}

    def get(hops: int):
        if hops not in done:
            done[hops] = simulate(ring8_cfg(hops), hash_every_step=hops == 2)
        return done[hops]

    return get


def test_every_client_identical_after_every_step(runs):
    for kind, r in runs.items():
        assert len(r.hashes) == 8
        per_step = list(zip(*r.step_hashes.values()))
        assert len(per_step) == 20
        for s, hs in enumerate(per_step):
            assert len(set(hs)) == 1, f"{kind}: clients differ after step {s}"
        assert len(set(per_step)) == 20, "the model must change every step"


def test_topology_invariance(runs):
    assert set(runs["ring"].hashes.values()) == set(runs["complete"].hashes.values())
    assert runs["ring"].step_hashes[0] == runs["complete"].step_hashes[3]


def test_training_loss_goes_down(runs):
    cfg = cfg_for("topology.nodes=8", "run.steps=20")
    before = train_loss(Workload.build(cfg))
    after = train_loss(runs["ring"].workloads[0])
    assert after < 0.8 * before, (before, after)


def test_bytes_per_edge_do_not_depend_on_model_width():
    """Messages carry (origin, step, seed, scalar): doubling the width changes no byte."""
    counts = []
    for width in (32, 64):
        r = simulate(
            cfg_for(
                "topology.nodes=4",
                "run.steps=3",
                f"model.tiny={{hidden_size: {width}, intermediate_size: {2 * width}}}",
            ),
            hash_every_step=False,
        )
        counts.append(r.counter.rows())
    assert counts[0] == counts[1]
    assert sum(n for *_, n in counts[0]) > 0


def test_delayed_flooding_keeps_clients_identical_and_is_topology_invariant(ring8):
    # ring of 8 (diameter 4) and a 2×4 grid (diameter 4) with 2 hops per step: delay 1 step on both.
    ring = ring8(2)
    grid = simulate(
        cfg_for("topology.nodes=8", "topology.kind=grid", "topology.rows=2", "run.steps=6", "flood.hops_per_step=2")
    )
    for r in (ring, grid):
        assert len(set(r.hashes.values())) == 1
        assert all(len(set(hs)) == 1 for hs in zip(*r.step_hashes.values()))
    assert ring.hashes == grid.hashes
    full = ring8(0)
    assert set(full.hashes.values()) != set(ring.hashes.values()), "staleness must change the trajectory"


def test_gaussian_direction_consensus():
    a = simulate(
        cfg_for("topology.nodes=4", "topology.kind=ring", "run.steps=3", "zo.direction=gaussian", "zo.lr=1e-3")
    )
    b = simulate(
        cfg_for("topology.nodes=4", "topology.kind=star", "run.steps=3", "zo.direction=gaussian", "zo.lr=1e-3")
    )
    assert len(set(a.hashes.values())) == 1 and a.hashes == b.hashes


def test_several_perturbations_per_step():
    r = simulate(cfg_for("topology.nodes=3", "run.steps=3", "zo.perturbations=2"))
    assert len(set(r.hashes.values())) == 1


def test_a_corrupted_frame_fails_the_run_and_is_never_applied():
    def flip(src, dst, hop, frame):
        if hop == 2 and src == 1 and frame:  # any non-empty frame (v2: an empty one is b"")
            frame = frame[:-1] + bytes([frame[-1] ^ 0xFF])
        return frame

    with pytest.raises(message.FrameError, match="bad frame from node 1"):
        simulate(cfg_for("topology.nodes=4", "run.steps=4"), mutate=flip)


@pytest.mark.parametrize("hops", [0, 1, 2])
def test_resume_equals_the_uninterrupted_run_for_every_hops_per_step(ring8, hops):
    """A run stopped after 3 steps and resumed from the steps it logged ends on the uninterrupted
    run's bits, with full flooding (delay 0) and with delayed flooding (ring of 8, diameter 4:
    2 hops -> delay 1, 1 hop -> delay 3). Also from a log that lags behind (fewer steps)."""
    cfg = ring8_cfg(hops)
    straight = ring8(hops)
    assert [s for s, _ in straight.records] == list(range(6))
    stopped = simulate(cfg, hash_every_step=False, stop=3)
    logged = stopped.records
    delay = {0: 0, 1: 3, 2: 1}[hops]
    assert len(logged) == 3 - delay
    # 1 hop logs no step before the stop: the lagging log is that same empty log, resumed once.
    for records in [logged] + ([logged[:1]] if logged[:1] != logged else []):
        resumed = simulate(cfg, hash_every_step=False, resume=records)
        assert set(resumed.hashes.values()) == set(straight.hashes.values()), (hops, len(records))
        assert resumed.records == straight.records


def test_resume_from_every_prefix_of_the_log_with_delay():
    """Every prefix L of the log (including all of it) resumes to the same bits."""
    cfg = cfg_for("topology.nodes=4", "topology.kind=ring", "run.steps=5", "flood.hops_per_step=1")  # delay 1
    straight = simulate(cfg, hash_every_step=False)
    for n in range(len(straight.records) + 1):
        resumed = simulate(cfg, hash_every_step=False, resume=straight.records[:n])
        assert set(resumed.hashes.values()) == set(straight.hashes.values()), n
