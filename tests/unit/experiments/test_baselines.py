"""baselines.py on a tiny random model: bytes equal the analytic frame sizes, every algorithm
lowers the training loss, gossip clients disagree, mezo is SeedFlood's one-client Gaussian run,
and the run directory follows the contract `seedflood compare` reads."""

import json

import pytest
import torch

from seedflood.core.config import runconfig as config
from seedflood.core.config.configerror import ConfigError
from seedflood.core.flood.transport import HEADER
from seedflood.core.topology import resolve as topo
from seedflood.experiments import baselines, tensorwire
from seedflood.roles.inprocess import simulate

torch.set_num_threads(1)

STEPS = 12
BASE = [
    "model.name=tiny",
    "task.name=synthetic",
    "run.threads=1",
    "task.batch_size=8",
    "task.train_examples=128",
    "task.dev_examples=16",
    "task.test_examples=32",
    "eval.every=5",
    "topology.nodes=4",
    f"run.steps={STEPS}",
]
SETTINGS = {  # lr per algorithm for the tiny model (the defaults are for SmolLM2)
    "dzsgd": ["algorithm.lr=0.3"],
    "dsgd": ["algorithm.lr=0.3"],
    "choco": ["algorithm.lr=0.3", "algorithm.topk=0.1"],
    "diloco": ["algorithm.lr=3e-3", "algorithm.inner_steps=4"],
    "mezo": ["algorithm.lr=0.3"],
}


def cfg_for(tmp, name, *overrides):
    return config.load(
        None, BASE + SETTINGS[name] + [f"algorithm.name={name}", f"run.out_dir={tmp / name}", *overrides]
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("baselines")
    return {name: baselines.train(cfg_for(tmp, name), progress=False) for name in SETTINGS}


def mean_train_loss(r, xs):
    """Mean loss of client i's vector on client i's batches of steps 0..STEPS-1."""
    w, flat = r.ctx.w, r.ctx.flat
    vals = []
    for i, x in enumerate(xs):
        flat.bind(x)
        vals += [w.loss(i, s) for s in range(STEPS)]
    return sum(vals) / len(vals)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_training_loss_goes_down(runs, name):
    r = runs[name]
    xs = r.algorithm.clients() if name != "diloco" else r.algorithm.clients() * r.ctx.n  # one global θ
    before = mean_train_loss(r, [r.x0] * len(xs))
    after = mean_train_loss(r, xs)
    assert after < 0.85 * before, (before, after)


def per_edge_step(r):
    """{(step, src, dst): bytes} of a run's transport."""
    return {(s, a, b): n for s, a, b, n in r.ctx.counter().rows()}


@pytest.mark.parametrize("name", ["dzsgd", "dsgd"])
def test_gossip_bytes_are_the_dense_vector_per_directed_edge_per_step(runs, name):
    r = runs[name]
    d = r.ctx.flat.numel
    assert d == 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128)  # the tiny model's 2 layers of matrices
    top = r.ctx.top
    want = {(s, i, p): HEADER + 20 + 4 * d for s in range(STEPS) for i in top.nodes for p in top.neighbors(i)}
    assert per_edge_step(r) == want
    assert r.summary.bytes_per_edge_run == STEPS * (HEADER + 20 + 4 * d)


def test_gossip_every_spaces_the_exchanges(tmp_path):
    r = baselines.train(cfg_for(tmp_path, "dsgd", "algorithm.gossip_every=3", "eval.every=0"), progress=False)
    steps = {s for s, *_ in per_edge_step(r)}
    assert steps == {2, 5, 8, 11}
    cum = r.summary.bytes_per_edge_cumulative
    assert cum[0] == cum[1] == 0 and cum[2] == cum[4] > 0 and cum[-1] == 4 * cum[2]


def test_choco_bytes_are_the_topk_frame(runs):
    r = runs["choco"]
    d = r.ctx.flat.numel
    k = -(-d // 10)  # ⌈0.1·d⌉
    top = r.ctx.top
    want = {(s, i, p): HEADER + 20 + 8 * k for s in range(STEPS) for i in top.nodes for p in top.neighbors(i)}
    assert per_edge_step(r) == want


def diloco_round_bytes(top, frame):
    """Flooding every origin's frame along shortest-path routes: eccentricity(o) exchanges each,
    every directed edge carries HEADER per exchange, plus the frame where a route continues."""
    dist = top.distances
    total = 0
    for o in top.nodes:
        total += top.eccentricity(o) * 2 * len(top.edges) * HEADER
        total += frame * sum(1 for i in top.nodes for p in top.neighbors(i) if dist[o][p] == dist[o][i] + 1)
    return total


@pytest.mark.parametrize("compress", ["none", "int8"])
@pytest.mark.parametrize("kind", ["ring", "star"])
def test_diloco_bytes_are_the_flooded_pseudo_gradients(tmp_path, kind, compress):
    r = baselines.train(
        cfg_for(tmp_path, "diloco", f"topology.kind={kind}", f"algorithm.compress={compress}", "eval.every=0"),
        progress=False,
    )
    d, top = r.ctx.flat.numel, r.ctx.top
    frame = 20 + 4 * d if compress == "none" else 20 + 8 * len(r.ctx.flat.sizes) + d
    per_step = r.ctx.counter().per_step_total(include_evaluator=False)
    assert per_step == {s: diloco_round_bytes(top, frame) for s in (3, 7, 11)}  # H = 4: rounds end at 3, 7, 11


def test_mezo_sends_nothing_and_equals_seedflood_with_one_gaussian_client(runs):
    r = runs["mezo"]
    assert r.ctx.endpoints == [] and r.summary.bytes_per_edge_run == 0.0
    assert r.summary.bytes_per_edge_cumulative == [0.0] * STEPS
    cfg = config.load(None, BASE + ["zo.direction=gaussian", "zo.lr=0.3", "topology.kind=complete", "topology.nodes=1"])
    ref = simulate(cfg, hash_every_step=False).workloads[0]
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in ref.direction.params]), r.algorithm.x)


@pytest.mark.parametrize("name", ["dzsgd", "dsgd", "choco"])
def test_gossip_clients_disagree_and_the_worst_is_reported(runs, name):
    s = runs[name].summary.to_dict()
    assert s["consensus_distance"] > 0 and s["final"]["consensus_distance"] > 0
    assert 0 < s["consensus_distance_rel"] < 1
    assert s["bit_identical"] is False
    accs = s["client_accuracies"]
    assert len(accs) == 4 and s["worst_accuracy"] == min(accs) and accs[s["worst_node"]] == min(accs)


def test_run_directory_contract(runs):
    for name, r in runs.items():
        out = r.ctx.cfg.run.out_dir
        summary = json.loads(open(f"{out}/summary.json").read())
        assert summary == json.loads(json.dumps(r.summary.to_dict()))
        for key in ("algorithm", "steps", "clients", "topology", "final", "bytes_per_edge_run", "wall_seconds"):
            assert key in summary
        assert summary["algorithm"] == name
        assert len(summary["bytes_per_edge_cumulative"]) == STEPS
        assert summary["bytes_per_edge_cumulative"][-1] == summary["bytes_per_edge_run"]
        cum = summary["bytes_per_edge_cumulative"]
        assert all(a <= b for a, b in zip(cum, cum[1:]))
        lines = [json.loads(x) for x in open(f"{out}/metrics.jsonl")]
        assert [x["step"] for x in lines] == ([0, 8, 12] if name == "diloco" else [0, 5, 10, 12])
        for x in lines:
            for key in ("accuracy", "loss", "auc", "threshold_accuracy", "elapsed_seconds", "consensus_distance"):
                assert key in x
        assert lines[-1]["final"] and lines[-1] == summary["final"]
        assert config.load(f"{out}/config.yaml").algorithm.name == name


def test_diloco_overlap_applies_each_average_one_round_late(tmp_path):
    plain = baselines.train(cfg_for(tmp_path, "diloco", "eval.every=0", "run.steps=4"), progress=False)
    late = baselines.train(
        cfg_for(tmp_path, "diloco", "eval.every=0", "run.steps=4", "algorithm.overlap=true"), progress=False
    )
    # One round: the delayed average is applied by the drain, so both end at the same θ ...
    assert torch.equal(plain.algorithm.theta, late.algorithm.theta)
    two = baselines.train(cfg_for(tmp_path, "diloco", "eval.every=0", "run.steps=8"), progress=False)
    two_late = baselines.train(
        cfg_for(tmp_path, "diloco", "eval.every=0", "run.steps=8", "algorithm.overlap=true"), progress=False
    )
    # ... with two, round 2 starts from θ0 instead of θ1: a different trajectory, same bytes.
    assert not torch.equal(two.algorithm.theta, two_late.algorithm.theta)
    assert two.ctx.counter().rows() == two_late.ctx.counter().rows()


def test_refusals(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.name"):
        baselines.run(config.load(None, BASE + ["algorithm.name=seedflood"]), progress=False)
    with pytest.raises(ConfigError, match="model.dtype"):
        baselines.train(cfg_for(tmp_path, "dsgd", "model.dtype=bfloat16"), progress=False)


def test_analytic_frame_sizes_match_tensorwire():
    cfg = config.load(None, BASE + ["algorithm.name=choco", "algorithm.topk=0.01"])
    assert baselines.frame_bytes(cfg, 1000, 3) == tensorwire.size("topk", 1000, 10)
    cfg = config.load(None, BASE + ["algorithm.name=diloco", "algorithm.compress=int8"])
    assert baselines.frame_bytes(cfg, 1000, 3) == 20 + 24 + 1000
    assert topo.build(config.load(None, BASE).topology).n == 4


@pytest.mark.parametrize("name", ["mezo", "dzsgd"])
def test_one_zo_step_descends_on_its_own_batch(tmp_path, name):
    """At first order a MeZO step changes L by −lr·g² (g ≈ z·∇L): it must lower every client's
    loss on the batch it was estimated on (the tiny model's long-run loss falls under ascent too)."""
    r = baselines.train(
        cfg_for(tmp_path, name, "run.steps=1", "algorithm.lr=1e-4", "algorithm.gossip_every=2", "eval.every=0"),
        progress=False,
    )
    w, flat = r.ctx.w, r.ctx.flat
    for i, x in enumerate(r.algorithm.clients()):
        flat.bind(r.x0)
        before = w.loss(i, 0)
        flat.bind(x)
        assert w.loss(i, 0) < before - 1e-6, i


def test_choco_with_exact_compression_and_full_step_is_dsgd(tmp_path):
    """top-k of every entry (q = x − x̂, so x̂ = x) and γ = 1 turn CHOCO's update into DSGD's mixing."""
    choco = baselines.train(
        cfg_for(tmp_path, "choco", "algorithm.topk=1.0", "algorithm.gamma=1.0", "eval.every=0", "run.steps=4"),
        progress=False,
    )
    dsgd = baselines.train(cfg_for(tmp_path, "dsgd", "eval.every=0", "run.steps=4"), progress=False)
    for a, b in zip(choco.algorithm.clients(), dsgd.algorithm.clients()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert choco.summary.consensus_distance == pytest.approx(dsgd.summary.consensus_distance, rel=1e-3)


def test_diloco_one_client_is_torch_adamw_then_nesterov(tmp_path):
    """Two rounds of one client against torch.optim.AdamW (inner) and the Nesterov formula (outer)."""
    H, lr, olr, mu = 3, 3e-3, 0.7, 0.9
    cfg = cfg_for(
        tmp_path,
        "diloco",
        "topology.kind=complete",
        "topology.nodes=1",
        f"algorithm.inner_steps={H}",
        f"algorithm.lr={lr}",
        f"algorithm.outer_lr={olr}",
        f"algorithm.outer_momentum={mu}",
        "eval.every=0",
        f"run.steps={2 * H}",
    )
    r = baselines.train(cfg, progress=False)
    flat = r.ctx.flat
    theta = r.x0.clone()
    x = r.x0.clone()
    flat.bind(x)
    opt = torch.optim.AdamW(flat.params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    buf = torch.zeros_like(theta)
    for rnd in range(2):
        x.copy_(theta)
        for s in range(rnd * H, (rnd + 1) * H):
            flat.zero_grad()
            with torch.enable_grad():
                r.ctx.backward(0, s, x)
            opt.step()
        delta = theta - x
        buf = mu * buf + delta
        theta = theta - olr * (delta + mu * buf)
    flat.zero_grad()
    torch.testing.assert_close(r.algorithm.theta, theta, rtol=0, atol=1e-5)
    assert not torch.equal(theta, r.x0)


@pytest.mark.parametrize("name", ["dzsgd", "dsgd"])
def test_counted_wire_gives_the_frames_bits_and_bytes(tmp_path, name):
    """`algorithm.wire: counted` (the neighbours' vectors read in place, each edge's frame
    counted) against the frames through the transport, side by side: every client's vector
    equal to the bit and the counter's table equal row for row, over gossip every step and every
    third (the steps without a round count nothing)."""
    for every in (1, 3):
        sets = ("eval.every=0", "run.steps=4", f"algorithm.gossip_every={every}")
        framed = baselines.train(cfg_for(tmp_path / f"f{every}", name, *sets), progress=False)
        counted = baselines.train(
            cfg_for(tmp_path / f"c{every}", name, *sets, "algorithm.wire=counted"), progress=False
        )
        for a, b in zip(framed.algorithm.clients(), counted.algorithm.clients(), strict=True):
            assert torch.equal(a, b)
        assert per_edge_step(counted) == per_edge_step(framed) != {}
        assert counted.summary.bytes_per_edge_cumulative == framed.summary.bytes_per_edge_cumulative


def test_counted_wire_is_refused_where_it_does_not_apply(tmp_path):
    for name in ("choco", "diloco", "mezo"):
        with pytest.raises(ConfigError, match="algorithm.wire: counted is for dzsgd and dsgd"):
            baselines.train(cfg_for(tmp_path, name, "algorithm.wire=counted"), progress=False)
