"""batched.py (`sim.batched`): every client's perturbed forwards in one forward, against the
sequential shared-model path, which stays the exact reference.

Tolerances (CPU, fp32, one thread), and why:
- a grouped loss equals the loss of its batch alone to rtol LOSS_RTOL = 2e-6 (about 16 fp32
  ulps): the stacked forward runs other GEMM/attention shapes, so only the reduction order differs;
- so a scalar (L+ − L−)/2ε differs by at most 2·LOSS_RTOL·L_max/2ε = LOSS_RTOL·L_max/ε
  (`scalar_tol`; 1.4e-3 at L ≈ 0.7, ε = 1e-3; measured: 2.4e-4);
- seeds, batches, message ids, frames and byte counts are equal exactly;
- a short run (tiny model, synthetic task, 8 clients, 12 steps) ends with test loss within 1e-3
  and accuracy within 1/64 (one test example) of the sequential run, with per-step scalars
  correlated above 0.999; its log replays to its own hash bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pytest
import torch

from seedflood.core.config import runconfig as config
from seedflood.core.config.systemsections import SimConfig
from seedflood.core.config.trainsections import ModelConfig, TaskConfig
from seedflood.core.flood.protocol import Protocol
from seedflood.core.topology import resolve as topology
from seedflood.core.zo.replay import Applier, state_hash
from seedflood.ml import batched, encoding, grouped, objective, sampling, tasks
from seedflood.ml import model as M
from seedflood.ml.workload import Workload
from seedflood.roles import sharedmodel

torch.set_num_threads(1)

LOSS_RTOL = 2e-6
DEBUG = "launch/configs/debug.yaml"


def scalar_tol(l_max: float, eps: float) -> float:
    return LOSS_RTOL * max(l_max, 1.0) / eps


def cfg_for(*overrides: str) -> config.Config:
    return config.load(DEBUG, ["task.test_examples=64", *overrides])


# -- the grouped forward ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny() -> M.Loaded:
    return M.load(ModelConfig(name="tiny"))


SINGLE = tasks.get("synthetic")
MULTI = dataclasses.replace(SINGLE, candidates=(" no", " yes!", "?"))  # 3, 5 and 1 tokens


@pytest.mark.parametrize("spec", [SINGLE, MULTI], ids=["single-token", "multi-token"])
@pytest.mark.parametrize("pack", [512, 40], ids=["one-row", "rows-differ"])
def test_grouped_losses_equal_each_batch_alone(tiny, spec, pack, monkeypatch):
    """Groups of different sizes (3..8 examples, so different row counts when rows are short)
    give each batch's own loss; the layout passed to the context is the decoder's input."""
    monkeypatch.setattr(objective, "_PACK_TOKENS", pack)
    ex = sampling.load_splits(TaskConfig(name="synthetic", train_examples=40, dev_examples=0, test_examples=0), 0).train
    batches = [encoding.encode(ex[i : i + n], spec, tiny.tokenizer, 64) for i, n in [(0, 8), (8, 3), (11, 5), (16, 8)]]
    seen = []

    def context(layout):
        seen.append(layout)
        return torch.no_grad()

    got = grouped.grouped_losses(tiny.model, batches, context)
    want = [float(objective.loss(tiny.model, b)) for b in batches]
    np.testing.assert_allclose(got, want, rtol=LOSS_RTOL, atol=0)
    (layout,) = seen
    assert layout.groups == 4 and len(layout.row_group()) == sum(layout.rows)
    if pack == 40:
        assert max(layout.rows) > 1 and len(set(layout.rows)) > 1  # groups of different row counts


# -- per-client scalars --------------------------------------------------------------------------


def pair(*overrides: str, nodes: int = 8) -> tuple[sharedmodel.SharedModel, sharedmodel.SharedModel, Workload]:
    """A sequential and a batched SharedModel on ONE workload (so they estimate on the same bits)."""
    cfg = cfg_for(f"topology.nodes={nodes}", *overrides)
    top = topology.build(cfg.topology)
    p = Protocol.of(cfg, top.diameter)
    w = Workload.build(cfg)
    seq = sharedmodel.SharedModel(cfg, top, p, w)
    bat = sharedmodel.SharedModel(dataclasses.replace(cfg, sim=SimConfig(batched=True)), top, p, w)
    if "sim.clients_per_forward=3" in overrides:
        bat.batched.per_forward = 3
    assert seq.batched is None and bat.batched is not None
    return seq, bat, w


def l_max(w: Workload, nodes: int, t: int) -> float:
    with w.direction.current():
        return max(w.loss(n, t) for n in range(nodes))


CASES = {
    "subcge": (),
    "subcge-lowrank-k2": ("subspace.forward=lowrank", "zo.perturbations=2"),
    "subcge-chunks-of-3": ("sim.clients_per_forward=3",),
    "gaussian-k2": ("zo.direction=gaussian", "zo.lr=1e-3", "zo.perturbations=2"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_per_client_scalars_equal_the_sequential_ones(case):
    """Steps 0..2 on the same shared state (applied between steps: a pending SubCGE core from
    step 1 on, so W_eff / the low-rank term is exercised): same seeds and ids, scalars within
    scalar_tol."""
    seq, bat, w = pair(*CASES[case])
    p = seq.protocol
    for t in range(3):
        a, b = seq.estimate(t), bat.estimate(t)
        assert [m.id for n in a for m in a[n]] == [m.id for n in b for m in b[n]]
        assert [m.seed for n in a for m in a[n]] == [m.seed for n in b for m in b[n]]
        x = np.array([m.scalar for n in a for m in a[n]])
        y = np.array([m.scalar for n in b for m in b[n]])
        tol = scalar_tol(l_max(w, 8, t), p.eps)
        assert np.abs(x - y).max() <= tol, (t, np.abs(x - y).max(), tol)
        assert np.abs(x).max() > 10 * tol  # the comparison is not trivially small
        seq.applier.apply(t, [m for n in sorted(a) for m in a[n]])  # advance the shared state


def test_the_estimate_never_writes_the_weights():
    seq, bat, w = pair()
    before = state_hash(w.model, w.direction)
    bat.estimate(0)
    assert state_hash(w.model, w.direction) == before
    assert all("forward" not in vars(m) for m in w.model.modules())  # nothing left patched
    assert all(not m._forward_hooks for m in w.model.modules())


def test_what_cannot_be_batched_runs_sequentially(caplog):
    """Gaussian over a non-Linear matrix (the embedding) cannot be batched: the simulation says
    so once and estimates sequentially, with the sequential path's exact scalars."""
    over = ("zo.direction=gaussian", "zo.lr=1e-3", "zo.trainable=['*layers.*.weight', '*embed_tokens*']")
    cfg = cfg_for(*over, "sim.batched=true")
    top = topology.build(cfg.topology)
    with caplog.at_level(logging.WARNING, logger="seedflood.ml.batched"):
        sim = sharedmodel.SharedModel(cfg, top, Protocol.of(cfg, top.diameter), Workload.build(cfg))
    assert sim.batched is None
    assert "running sequentially" in caplog.text and "embed_tokens" in caplog.text
    ref = sharedmodel.simulate(cfg_for(*over, "run.steps=2"), hash_every_step=False)
    assert sharedmodel.simulate(cfg_for(*over, "run.steps=2", "sim.batched=true")).hash == ref.hash


def test_chunks_follow_the_config():
    cfg = cfg_for("sim.batched=true", "sim.clients_per_forward=3", "topology.nodes=8")
    top = topology.build(cfg.topology)
    sim = sharedmodel.SharedModel(cfg, top, Protocol.of(cfg, top.diameter), Workload.build(cfg))
    assert [list(c) for c in sim.batched.chunks(list(range(8)))] == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_what_cannot_be_batched_is_named():
    """A trainable matrix outside the decoder (the output head: its rows are not grouped) or an
    unknown direction family falls back to the sequential path, with the reason."""
    w = Workload.build(cfg_for())
    d = w.direction
    assert batched._fallback_reason(w.model, d) is None
    names = d.names
    try:
        d.names = [*names, "lm_head.weight"]
        assert "outside the decoder" in batched._fallback_reason(w.model, d)
    finally:
        d.names = names
    assert "no batched form" in batched._fallback_reason(w.model, object())


# -- a short run ---------------------------------------------------------------------------------


def test_a_short_run_is_statistically_the_sequential_run():
    """12 steps, 8 clients: final test loss within 1e-3, accuracy within one example of 64,
    scalars correlated > 0.999; same message ids and byte counts; the batched run's records
    replay to its hash exactly."""
    base = ("topology.nodes=8", "run.steps=12", "zo.aggregate=mean", "zo.lr=2.0")
    seq = sharedmodel.simulate(cfg_for(*base), hash_every_step=False)
    bcfg = cfg_for(*base, "sim.batched=true")
    bat = sharedmodel.simulate(bcfg, hash_every_step=False)
    assert bat.sim.batched is not None
    ids = [[m.id for m in ms] for _, ms in seq.records]
    assert ids == [[m.id for m in ms] for _, ms in bat.records]
    assert seq.counter.rows() == bat.counter.rows()
    x = np.array([m.scalar for _, ms in seq.records for m in ms])
    y = np.array([m.scalar for _, ms in bat.records for m in ms])
    assert np.corrcoef(x, y)[0, 1] > 0.999
    s, b = seq.sim.w.scores(), bat.sim.w.scores()
    assert abs(s["loss"] - b["loss"]) <= 1e-3, (s["loss"], b["loss"])
    assert abs(s["accuracy"] - b["accuracy"]) <= 1 / 64 + 1e-12
    # training moved the model (else the comparison says nothing)
    fresh = Workload.build(bcfg)
    assert fresh.scores()["loss"] != b["loss"]
    # exact replay of the batched run's own log
    Applier(fresh.direction, bat.sim.protocol).apply_all(bat.records)
    assert state_hash(fresh.model, fresh.direction) == bat.hash


def test_a_batched_run_stops_and_resumes_exactly():
    """Batched scalars are a pure function of (state, step, config): a batched run stopped after 3
    steps and resumed from its records equals the uninterrupted batched run bit for bit."""
    cfg = cfg_for("topology.nodes=5", "flood.hops_per_step=1", "run.steps=6", "sim.batched=true")
    whole = sharedmodel.simulate(cfg, hash_every_step=False)
    first = sharedmodel.simulate(cfg, hash_every_step=False, stop=3)
    second = sharedmodel.simulate(cfg, hash_every_step=False, resume=first.records)
    assert second.hash == whole.hash and second.records == whole.records


def test_seedflood_simulate_batched_writes_a_run_that_replays_to_its_hash(tmp_path, capsys):
    """`seedflood simulate --set sim.batched=true`: the run directory's log rebuilds (`seedflood
    replay`) the summary's hash exactly, and the config it records says batched."""
    from seedflood import cli

    out = tmp_path / "run"
    rc = cli.main(["simulate", "--config", DEBUG, "--set", f"run.out_dir={out}", "--set", "sim.batched=true"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    capsys.readouterr()
    assert cli.main(["replay", str(out), "--json"]) == 0
    replayed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert replayed["param_hash"] == summary["param_hash"] and replayed["steps"] == 6
    assert config.load(out / "config.yaml").sim.batched is True


# -- CUDA ----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("direction", ["subcge", "gaussian"])
def test_per_client_scalars_on_cuda(direction):
    """The same comparison on the GPU, 16 clients. fp32 products (torch's default): cuBLAS and
    SDPA reduce in other orders, so the tolerance is 10× the CPU one. Under cuBLAS's TF32
    override (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, as docs/results.md's GPU runs) a product keeps
    10 mantissa bits, so losses agree to ~1e-3 relative and the tolerance is 500× the CPU one."""
    from seedflood.bench.sim import tf32

    extra = ("zo.direction=gaussian", "zo.lr=1e-3") if direction == "gaussian" else ()
    seq, bat, w = pair("model.device=cuda", *extra, nodes=16)
    p = seq.protocol
    factor = 500 if tf32() else 10
    for t in range(2):
        a, b = seq.estimate(t), bat.estimate(t)
        x = np.array([m.scalar for n in a for m in a[n]])
        y = np.array([m.scalar for n in b for m in b[n]])
        assert np.abs(x - y).max() <= factor * scalar_tol(l_max(w, 16, t), p.eps)
        if not tf32():
            assert np.corrcoef(x, y)[0, 1] > 0.999
        seq.applier.apply(t, [m for n in sorted(a) for m in a[n]])


def test_a_batched_run_records_it_in_its_trajectory_so_a_resume_cannot_switch_silently():
    from pathlib import Path

    from seedflood.core.flood.protocol import trajectory

    debug = Path(__file__).resolve().parents[3] / "launch" / "configs" / "debug.yaml"
    plain, fast = config.load(debug, []), config.load(debug, ["sim.batched=true", "sim.clients_per_forward=2"])
    p = Protocol.of(plain, topology.build(plain.topology).diameter)
    assert "sim.batched" not in trajectory(plain, p, "d")  # older logs resume as before
    t = trajectory(fast, p, "d")
    assert t["sim.batched"] is True and t["sim.clients_per_forward"] == 2
