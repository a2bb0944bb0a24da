"""The LoRA baselines (dsgd-lora, choco-lora, dzsgd-lora) on the tiny random Llama: only the
adapters train and travel (bytes = the adapter vector's frame per directed edge, exactly), the
base weights stay frozen, gossip at consensus is a no-op, compare tabulates them, and bad
settings are refused in one line."""

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from seedflood.comm.memory import InMemoryNetwork
from seedflood.core.config import runconfig as config
from seedflood.core.config.configerror import ConfigError
from seedflood.core.flood.transport import HEADER
from seedflood.experiments import baselines, compare, compare_report
from seedflood.ml import lora, model, objective

torch.set_num_threads(1)

STEPS = 6
BASE = [
    "model.name=tiny",
    "task.name=synthetic",
    "run.threads=1",
    "task.batch_size=8",
    "task.train_examples=128",
    "task.dev_examples=16",
    "task.test_examples=32",
    "eval.every=3",
    "topology.nodes=4",
    f"run.steps={STEPS}",
]
SETTINGS = {  # lr per algorithm for the tiny model (the defaults are for SmolLM2)
    "dsgd-lora": ["algorithm.lr=0.3"],
    "choco-lora": ["algorithm.lr=1.0", "algorithm.topk=0.1"],
    "dzsgd-lora": ["algorithm.lr=0.01"],
}
# The tiny model: 2 layers, hidden 64, 4 heads, 2 key-value heads of 16: q_proj 64→64, v_proj 64→32.
LAYERS, HIDDEN, KV = 2, 64, 32
RANK = 8
D_LORA = LAYERS * RANK * ((HIDDEN + HIDDEN) + (HIDDEN + KV))  # Σ r·(in + out) over q_proj, v_proj = 3584


def cfg_for(tmp, name, *overrides):
    return config.load(
        None, BASE + SETTINGS[name] + [f"algorithm.name={name}", f"run.out_dir={tmp / name}", *overrides]
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    return {name: baselines.train(cfg_for(tmp, name), progress=False) for name in SETTINGS}


def fresh_tiny():
    return model.load(config.load(None, BASE).model).model


def mean_train_loss(r, xs):
    w, flat = r.ctx.w, r.ctx.flat
    vals = []
    for i, x in enumerate(xs):
        flat.bind(x)
        vals += [w.loss(i, s) for s in range(STEPS)]
    return sum(vals) / len(vals)


def per_edge_step(r):
    return {(s, a, b): n for s, a, b, n in r.ctx.counter().rows()}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_each_lora_algorithm_trains_its_adapters(runs, name):
    r = runs[name]
    assert r.ctx.flat.numel == D_LORA == lora.numel(fresh_tiny(), RANK, ["q_proj", "v_proj"])
    assert all(lora.is_adapter(n) for n in r.ctx.flat.names) and len(r.ctx.flat.names) == 4 * LAYERS
    xs = r.algorithm.clients()
    assert all(not torch.equal(x, r.x0) for x in xs)
    before, after = mean_train_loss(r, [r.x0] * len(xs)), mean_train_loss(r, xs)
    assert after < 0.85 * before, (before, after)
    s = r.summary.to_dict()
    assert s["algorithm"] == name and s["trainable_params"] == D_LORA
    assert s["lora"] == {"rank": RANK, "alpha": 16.0, "targets": ["q_proj", "v_proj"]}
    assert s["bit_identical"] is False and s["consensus_distance"] > 0


@pytest.mark.parametrize("name", ["dsgd-lora", "dzsgd-lora"])
def test_bytes_are_the_dense_adapter_vector_per_directed_edge_per_step(runs, name):
    r = runs[name]
    frame = HEADER + 20 + 4 * D_LORA
    top = r.ctx.top
    want = {(s, i, p): frame for s in range(STEPS) for i in top.nodes for p in top.neighbors(i)}
    assert per_edge_step(r) == want
    assert r.summary.bytes_per_edge_run == STEPS * frame
    assert r.summary.details["frame_bytes"] == baselines.frame_bytes(r.ctx.cfg, D_LORA, 4 * LAYERS) == 20 + 4 * D_LORA


def test_choco_lora_bytes_are_the_topk_frame_of_the_adapters(runs):
    r = runs["choco-lora"]
    k = -(-D_LORA // 10)  # ⌈0.1·d⌉ of the adapter vector
    top = r.ctx.top
    want = {(s, i, p): HEADER + 20 + 8 * k for s in range(STEPS) for i in top.nodes for p in top.neighbors(i)}
    assert per_edge_step(r) == want


def test_only_adapters_change_and_the_base_is_the_fresh_model(runs):
    base = {n: p for n, p in fresh_tiny().named_parameters()}
    for name, r in runs.items():
        for n, p in r.ctx.w.model.named_parameters():
            if lora.is_adapter(n):
                continue
            assert torch.equal(p, base[n.replace(".base_layer.", ".")]), (name, n)
            assert not p.requires_grad and p.grad is None
        assert sum(not lora.is_adapter(n) for n, _ in r.ctx.w.model.named_parameters()) == len(base)


def test_adapters_start_from_the_seed_with_b_zero_so_the_model_is_the_base_model(runs):
    a, b, c = fresh_tiny(), fresh_tiny(), fresh_tiny()
    names = lora.inject(a, RANK, 16.0, ["q_proj", "v_proj"], seed=3)
    assert names == lora.inject(b, RANK, 16.0, ["q_proj", "v_proj"], seed=3)
    lora.inject(c, RANK, 16.0, ["q_proj", "v_proj"], seed=4)
    pa, pb, pc = dict(a.named_parameters()), dict(b.named_parameters()), dict(c.named_parameters())
    for n in names:
        assert torch.equal(pa[n], pb[n])
        if ".lora_B." in n:
            assert not pa[n].any()
        else:
            bound = pa[n].shape[1] ** -0.5  # kaiming-uniform (a = √5): U(−1/√in, 1/√in)
            assert pa[n].abs().max() <= bound and pa[n].std() > 0.5 * bound
            assert not torch.equal(pa[n], pc[n])
    r = runs["dsgd-lora"]  # at x⁰ the adapted model computes what the base model does
    r.ctx.flat.bind(r.x0)
    batch = r.ctx.w.batch(0, 0)
    assert torch.equal(
        objective.candidate_scores(r.ctx.w.model, batch), objective.candidate_scores(fresh_tiny(), batch)
    )


@pytest.mark.parametrize("name", list(SETTINGS))
def test_a_gossip_step_with_identical_clients_is_a_no_op(runs, name):
    r = runs[name]
    top = r.ctx.top
    net = InMemoryNetwork({i: top.neighbors(i) for i in top.nodes})
    ctx = dataclasses.replace(r.ctx, endpoints=[net.endpoint(i) for i in top.nodes])  # the run's are closed
    with ThreadPoolExecutor(max_workers=top.n) as ctx.pool:
        algo = type(r.algorithm)(ctx, r.x0)  # choco: x̂_j = x⁰ everywhere
        v = torch.randn(D_LORA, generator=torch.Generator().manual_seed(0))
        algo.xs = [v.clone() for _ in range(ctx.n)]
        algo.mix(0)
    for x in algo.xs:
        assert torch.equal(x, v)
    assert ctx.counter().total() > 0  # the frames did travel


def test_compare_runs_and_tabulates_the_lora_baselines(tmp_path):
    cfg = config.load(None, BASE + ["algorithm.lr=0.3", "eval.every=0", "run.steps=2"])
    outcomes = compare.run(cfg, ["dsgd", "dsgd-lora"], tmp_path, echo=lambda _: None)
    assert [o["status"] for o in outcomes] == ["done", "done"]
    rows = {r["algorithm"]: r for r in compare_report.report(tmp_path)}
    assert set(rows) == {"dsgd", "dsgd-lora"}
    d_full = json.loads((tmp_path / "dsgd" / "summary.json").read_text())["trainable_params"]
    assert rows["dsgd-lora"]["bytes_per_edge"] == 2 * (HEADER + 20 + 4 * D_LORA)
    assert rows["dsgd"]["bytes_per_edge"] == 2 * (HEADER + 20 + 4 * d_full)
    text = (tmp_path / "results.md").read_text()
    assert "| dsgd-lora | " in text and "LoRA adapters" in text
    assert compare.parse_algorithms("dsgd-lora,choco-lora,dzsgd-lora") == ["dsgd-lora", "choco-lora", "dzsgd-lora"]


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["algorithm.lora_rank=0"], "algorithm.lora_rank: must be >= 1, got 0"),
        (["algorithm.lora_alpha=0"], "algorithm.lora_alpha: must be > 0"),
        (["algorithm.lora_targets=[]"], "algorithm.lora_targets: needs at least one"),
        (["algorithm.name=diloco-lora"], "algorithm.name: must be one of .*dsgd-lora"),
        (["algorithm.name=mezo-lora"], "algorithm.name: must be one of"),
    ],
)
def test_bad_settings_are_refused_in_one_line(overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        config.load(None, BASE + overrides)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["algorithm.lora_targets=[c_attn]"], "algorithm.lora_targets: no module of the model is named \\['c_attn'\\]"),
        (["algorithm.lora_targets=[mlp]"], "algorithm.lora_targets: model.layers.0.mlp is a LlamaMLP"),
        (["algorithm.lora_rank=40"], "algorithm.lora_rank: 40 exceeds the width of model.layers.0.self_attn.v_proj"),
    ],
)
def test_settings_the_model_cannot_take_are_refused_in_one_line(tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        baselines.train(cfg_for(tmp_path, "dsgd-lora", *overrides), progress=False)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text", ["diloco-lora", "mezo-lora", "seedflood-lora"])
def test_compare_refuses_a_lora_variant_that_does_not_exist(text):
    with pytest.raises(compare.CompareError, match="has no LoRA variant \\(those are: dzsgd-lora, dsgd-lora"):
        compare.parse_algorithms(f"dsgd,{text}")
