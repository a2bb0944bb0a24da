"""Directions and the two-point estimate on a quadratic whose gradient is known in closed form, and
the precision floor: in bfloat16/float16 SubCGE scalars track float32 only from a minimum ε."""

import numpy as np
import pytest
import torch
from torch import nn

from seedflood.core.config import rng
from seedflood.core.config.trainsections import SubspaceConfig, ZOConfig
from seedflood.core.zo import estimate as zo
from seedflood.core.zo.directions import Gaussian, select_trainable
from seedflood.core.zo.family import build
from seedflood.core.zo.precision import MIN_EPS, DirectionError, check_precision
from seedflood.core.zo.replay import state_hash
from seedflood.core.zo.subcge import SubCGE

torch.set_num_threads(1)


class Quadratic(nn.Module):
    """L(W) = Σ_j ½‖X_j W_jᵀ − Y_j‖² over two bias-free linear layers; ∇_{W_j} = (X_j W_jᵀ − Y_j)ᵀ X_j."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.layers = nn.ModuleList([nn.Linear(6, 5, bias=False), nn.Linear(4, 7, bias=False)])
        for lin in self.layers:
            lin.weight.data = torch.randn(lin.weight.shape, generator=g, dtype=torch.float64).float()
        self.X = [torch.randn(10, 6, generator=g), torch.randn(10, 4, generator=g)]
        self.Y = [torch.randn(10, 5, generator=g), torch.randn(10, 7, generator=g)]

    def loss(self) -> float:
        with torch.no_grad():
            return float(
                sum(0.5 * ((lin(x).double() - y.double()) ** 2).sum() for lin, x, y in zip(self.layers, self.X, self.Y))
            )

    def grads(self) -> list[torch.Tensor]:
        """The exact gradient at the current weights (call before updating them)."""
        with torch.no_grad():
            return [(lin(x) - y).T @ x for lin, x, y in zip(self.layers, self.X, self.Y)]


def mean_estimate(direction, model, n):
    """Δθ after accumulating mean_i g_i·z_i over n seeds (through the real accumulate/commit path)."""
    before = [p.detach().clone() for p in direction.params]
    seeds = [rng.derive(7, 0, i) for i in range(n)]
    # Estimate everything at θ first, then apply: the protocol never forwards mid-application.
    gs = [zo.two_point(model.loss, direction, seed, 0, 1e-3) for seed in seeds]
    for seed, g in zip(seeds, gs):
        direction.accumulate(0, seed, g / n)
    direction.commit(0)
    direction.merge_all()
    return [p.detach() - b for p, b in zip(direction.params, before)]


def rel_err(a, b):
    num = sum(((x - y) ** 2).sum() for x, y in zip(a, b)) ** 0.5
    return float(num / sum((y**2).sum() for y in b) ** 0.5)


def test_gaussian_mean_estimate_matches_gradient():
    """E[g z] = ∇L for z ~ N(0, I): relative error ≈ sqrt((d+1)/n) = 0.09 here; we allow 0.2."""
    model = Quadratic()
    d = Gaussian(model, select_trainable(model, ["*"]), run_seed=1)
    assert d.numel == 58
    grads = model.grads()
    est = mean_estimate(d, model, 6000)
    assert rel_err(est, grads) < 0.2


def test_subcge_mean_estimate_matches_projected_gradient():
    """E[g z] = P(∇L) / r² with P(G) = U Uᵀ G V Vᵀ per matrix (one coordinate of r² per message)."""
    model = Quadratic()
    r = 3
    d = SubCGE(model, select_trainable(model, ["*"]), 1, SubspaceConfig(rank=r, refresh=10, merge_every=1))
    basis = d.basis(0)
    projected = [u @ u.T @ g @ v @ v.T for u, v, g in zip(basis.u, basis.v, model.grads())]
    est = mean_estimate(d, model, 6000)
    assert rel_err([e * r * r for e in est], projected) < 0.15
    # ...and the update lies in the subspace: nothing outside span(U) ⊗ span(V).
    for e, u, v in zip(est, basis.u, basis.v):
        assert torch.allclose(u @ u.T @ e @ v @ v.T, e, atol=1e-6)


@pytest.mark.parametrize("family", ["gaussian", "subcge"])
def test_two_point_leaves_parameters_bit_identical(family):
    model = Quadratic()
    d = build(model, ZOConfig(direction=family, trainable=["*"]), SubspaceConfig(rank=3), run_seed=0)
    h0 = state_hash(model, d)
    for i in range(20):
        zo.two_point(model.loss, d, rng.derive(0, 0, i), 0, 1e-3)
    assert state_hash(model, d) == h0


@pytest.mark.parametrize("family", ["gaussian", "subcge"])
def test_perturbed_forward_sees_theta_plus_scale_z(family):
    """L(θ + s·z) computed at forward time equals the loss of explicitly perturbed weights."""
    model = Quadratic()
    d = build(model, ZOConfig(direction=family, trainable=["*"]), SubspaceConfig(rank=3), run_seed=0)
    seed, s = rng.derive(0, 1, 2), 0.05
    with d.perturbed(seed, 0, s):
        got = model.loss()
    # Explicit: accumulate s·z and merge into the weights, then evaluate plainly.
    d.accumulate(0, seed, s)
    d.commit(0)
    d.merge_all()
    assert got == pytest.approx(model.loss(), rel=1e-5)


def test_subcge_messages_touch_only_the_core_until_merge():
    model = Quadratic()
    cfg = SubspaceConfig(rank=3, refresh=8, merge_every=4)
    d = SubCGE(model, select_trainable(model, ["*"]), 5, cfg)
    w0 = [p.detach().clone() for p in d.params]
    coefs = [(rng.derive(5, o, 0), 0.1 * (o + 1)) for o in range(50)]
    for seed, c in coefs:
        d.accumulate(0, seed, c)
    d.commit(0)  # merge_every = 4: step 0 does not merge
    assert all(torch.equal(p, w) for p, w in zip(d.params, w0)), "weights changed before the merge"
    # The core holds exactly Σ c·σ at each chosen coordinate.
    S = torch.zeros_like(d.S)
    for seed, c in coefs:
        a, b, sign = d.coordinates(seed)
        for j in range(len(d.params)):
            S[j, a[j], b[j]] += torch.tensor(c, dtype=torch.float32) * float(sign[j])
    assert torch.equal(S, d.S)
    # Forwards already see W + U S Vᵀ while S is pending.
    basis = d.basis(0)
    expect = [w + basis.u[j] @ d.S[j, :3, :3] @ basis.v[j].T for j, w in enumerate(w0)]
    with d.current():
        pending_loss = model.loss()
    d.merge_all()
    for p, e in zip(d.params, expect):
        assert torch.allclose(p, e, atol=1e-6)
    assert float(d.S.abs().sum()) == 0.0
    assert pending_loss == pytest.approx(model.loss(), rel=1e-5)


def test_subcge_merges_at_epoch_end_and_refreshes_basis():
    model = Quadratic()
    d = SubCGE(model, select_trainable(model, ["*"]), 5, SubspaceConfig(rank=3, refresh=2, merge_every=2))
    d.accumulate(0, 11, 0.5)
    d.commit(0)
    assert d.S_epoch == 0
    d.accumulate(1, 12, 0.5)
    d.commit(1)  # last step of epoch 0
    assert d.S_epoch is None
    assert not torch.equal(d.basis(0).u[0], d.basis(1).u[0])


def test_subcge_coordinates_are_deterministic_and_spread():
    model = Quadratic()
    d = SubCGE(model, select_trainable(model, ["*"]), 0, SubspaceConfig(rank=3))
    a1, b1, s1 = d.coordinates(123)
    a2, b2, s2 = d.coordinates(123)
    assert (a1 == a2).all() and (b1 == b2).all() and (s1 == s2).all()
    seen = {tuple(d.coordinates(s)[0]) for s in range(200)}
    assert len(seen) == 9  # every (a_0, a_1) pair of a 3×3 grid shows up


def test_subcge_rejects_non_linear_weights():
    class Emb(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)

    m = Emb()
    with pytest.raises(DirectionError, match="nn.Linear"):
        SubCGE(m, ["emb.weight"], 0, SubspaceConfig(rank=2))


def test_no_trainable_match_is_a_clear_error():
    with pytest.raises(DirectionError, match="no 2-D parameter"):
        select_trainable(Quadratic(), ["nothing.*"])


# -- precision -------------------------------------------------------------------------------------
# Two-point scalars on the tiny model's batch, same seeds, float32 vs a reduced-precision copy.
# Measured (16 seeds, relative error ‖s_dtype − s_fp32‖ / ‖s_fp32‖ at the same ε): bfloat16 6.6 at
# ε=1e-3, 0.13 at 0.1, 0.016 at 1; float16 1.1 at 1e-3, 0.012 at 0.1, 0.006 at 0.3.
PRECISION_SEEDS = 16


@pytest.fixture(scope="module")
def tiny_workloads():
    from seedflood.core.config import runconfig as config
    from seedflood.ml.workload import Workload

    def build_for(dtype: str):
        # zo.eps is the largest threshold so every dtype builds; each test passes its own ε.
        cfg = config.load(
            None,
            [
                "model.name=tiny",
                f"model.dtype={dtype}",
                "task.name=synthetic",
                "task.batch_size=8",
                "task.dev_examples=0",
                "task.test_examples=0",
                "run.threads=1",
                f"zo.eps={max(MIN_EPS.values())}",
            ],
        )
        return Workload.build(cfg)

    return {dtype: build_for(dtype) for dtype in ("float32", "bfloat16", "float16")}


def tiny_scalars(w, eps: float) -> np.ndarray:
    seeds = [rng.derive(0, 0, i) for i in range(PRECISION_SEEDS)]
    return np.array([zo.two_point(lambda: w.loss(0, 0), w.direction, s, 0, eps) for s in seeds])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_precision_scalars_track_float32_at_the_supported_eps(tiny_workloads, dtype):
    """At the smallest accepted ε the reduced-precision scalars agree with float32 ones: relative
    error below 0.1, and every scalar larger than 10% of the largest has the same sign and is
    within 25% of the float32 value."""
    eps = MIN_EPS[("subcge", dtype)]
    ref = tiny_scalars(tiny_workloads["float32"], eps)
    got = tiny_scalars(tiny_workloads[dtype], eps)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 0.1
    big = np.abs(ref) > 0.1 * np.abs(ref).max()
    assert big.sum() >= PRECISION_SEEDS // 2
    assert (np.sign(got[big]) == np.sign(ref[big])).all()
    assert (np.abs(got[big] - ref[big]) <= 0.25 * np.abs(ref[big])).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_precision_below_the_supported_eps_is_noise_and_refused(tiny_workloads, dtype):
    """At the default ε=1e-3 the same seeds give scalars unrelated to float32 ones (relative error
    above 0.5): build refuses that setting in one line naming a working ε."""
    ref = tiny_scalars(tiny_workloads["float32"], 1e-3)
    got = tiny_scalars(tiny_workloads[dtype], 1e-3)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) > 0.5
    need = MIN_EPS[("subcge", dtype)]
    model = tiny_workloads[dtype].model
    with pytest.raises(DirectionError) as e:
        build(model, ZOConfig(direction="subcge", eps=1e-3), SubspaceConfig(rank=4), 0)
    assert "\n" not in str(e.value)
    assert f"zo.eps=0.001 is too small for zo.direction=subcge in model.dtype={dtype}" in str(e.value)
    assert f"use zo.eps >= {need:g} or model.dtype=float32" in str(e.value)


def test_check_precision_accepts_float32_gaussian_and_eps_at_the_threshold():
    for dtype in ("float32", "torch.float32"):
        check_precision(ZOConfig(direction="subcge", eps=1e-6), dtype)
    for (direction, dtype), need in MIN_EPS.items():
        check_precision(ZOConfig(direction=direction, eps=need), dtype)
        check_precision(ZOConfig(direction=direction, eps=need), f"torch.{dtype}")
        with pytest.raises(DirectionError, match=rf"use zo.eps >= {need:g} "):
            check_precision(ZOConfig(direction=direction, eps=need * 0.99), dtype)
    assert {d for d, _ in MIN_EPS} == {"subcge"}  # Gaussian perturbs the weights: no floor
    check_precision(ZOConfig(direction="gaussian", eps=1e-3), "bfloat16")
    # build checks the trainable matrices' dtype: a bfloat16 quadratic at ε=1e-3 is refused.
    model = Quadratic().to(torch.bfloat16)
    with pytest.raises(DirectionError, match="model.dtype=bfloat16"):
        build(model, ZOConfig(direction="subcge", trainable=["*"]), SubspaceConfig(rank=3), 0)
    assert isinstance(
        build(model, ZOConfig(direction="subcge", trainable=["*"], eps=1.0), SubspaceConfig(rank=3), 0), SubCGE
    )


# -- vectorised coordinates and the forward modes --------------------------------------------------
def test_coordinates_many_equals_per_seed_coordinates():
    """The vectorised hash is rng.hash_u64 for every key (including keys ≥ 2**63 and 0)."""
    model = Quadratic()
    d = SubCGE(model, select_trainable(model, ["*"]), 0, SubspaceConfig(rank=3))
    seeds = [0, 1, 2**63, 2**64 - 1] + [rng.derive(4, o, s) for o in range(5) for s in range(20)]
    h = rng.hash_u64_many(np.array(seeds, dtype=np.uint64), d._counters)
    for i, s in enumerate(seeds):
        assert (h[i] == rng.hash_u64(s, d._counters)).all()
    a, b, sign = d.coordinates_many(np.array(seeds, dtype=np.uint64))
    assert sign.dtype == np.float32
    for i, s in enumerate(seeds):
        a1, b1, s1 = d.coordinates(s)
        assert (a[i] == a1).all() and (b[i] == b1).all() and (sign[i] == s1).all()


def test_torch_hash_and_derive_many_have_the_bits_of_the_scalar_ones():
    """hash_u64_many_torch is hash_u64_many bit for bit (int64 holding the uint64), derive_many is
    derive, over keys that exercise the top bit."""
    keys = np.array([0, 1, 2**63, 2**64 - 1] + [rng.derive(9, o, s) for o in range(9) for s in range(30)], np.uint64)
    counters = np.arange(3 * 11, dtype=np.uint64).reshape(-1, 3)
    want = rng.hash_u64_many(keys, counters).reshape(len(keys), -1)
    assert (rng.hash_u64_many_torch(keys, counters).numpy().view(np.uint64) == want).all()
    o, s, k = np.meshgrid(np.arange(0, 300, 37), np.array([0, 5, 2**32 - 1]), np.arange(3), indexing="ij")
    got = rng.derive_many(77, o.ravel(), s.ravel(), k.ravel())
    assert [int(x) for x in got] == [rng.derive(77, *map(int, t)) for t in zip(o.ravel(), s.ravel(), k.ravel())]


@pytest.mark.parametrize("rank", [4, 3])  # power of two (masked) and not (unsigned remainder)
def test_apply_steps_equals_one_accumulate_per_message(rank):
    """The vectorised accumulate leaves S and W with the bits of the per-message loop."""
    cfg = SubspaceConfig(rank=rank, refresh=6, merge_every=3)
    one, many = Quadratic(), Quadratic()
    d1 = SubCGE(one, select_trainable(one, ["*"]), 3, cfg)
    d2 = SubCGE(many, select_trainable(many, ["*"]), 3, cfg)
    steps = []
    for step in range(8):
        seeds = np.array([rng.derive(3, o, step) for o in range(40)], np.uint64)
        coefs = np.linspace(-1e-2, 1e-2, 40) * (step + 1)
        steps.append((step, seeds, coefs))
        for sd, c in zip(seeds, coefs):
            d1.accumulate(step, int(sd), float(c))
        d1.commit(step)
    d2.apply_steps(steps)
    assert torch.equal(d1.S, d2.S) and d1.S.any()
    assert all(torch.equal(p, q) for p, q in zip(one.parameters(), many.parameters()))


def pending_direction(mode: str, merge_every: int = 4) -> tuple[Quadratic, SubCGE]:
    model = Quadratic()
    d = SubCGE(model, select_trainable(model, ["*"]), 5, SubspaceConfig(rank=3, refresh=8, merge_every=merge_every))
    d.forward = mode
    for o in range(7):
        d.accumulate(0, rng.derive(5, o, 0), 0.05 * (o - 3))
    d.commit(0)  # pending: merge_every = 4
    return model, d


@pytest.mark.parametrize("mode", SubCGE.FORWARD_MODES)
def test_every_forward_mode_computes_with_w_plus_pending_core(mode):
    """current() and perturbed() see W + U·S·Vᵀ (+ s·z) in every mode, W is never written, and the
    perturbation of another epoch's basis (delayed application across a refresh) is seen too."""
    model, d = pending_direction(mode)
    h0 = state_hash(model, d)
    with d.current():
        pending = model.loss()
    seed = rng.derive(5, 9, 1)
    with d.perturbed(seed, 1, 0.05):
        plus = model.loss()
    with d.perturbed(seed, 8, 0.05):  # epoch 1: its own basis, S still of epoch 0
        other_epoch = model.loss()
    assert state_hash(model, d) == h0
    d.merge_all()
    assert pending == pytest.approx(model.loss(), rel=1e-5)
    d.accumulate(1, seed, 0.05)
    d.commit(1)
    d.merge_all()
    assert plus == pytest.approx(model.loss(), rel=1e-5)
    model2, d2 = pending_direction(mode)
    d2.merge_all()
    d2.accumulate(8, seed, 0.05)
    d2.commit(8)
    d2.merge_all()
    assert other_epoch == pytest.approx(model2.loss(), rel=1e-5)


@pytest.mark.parametrize("mode", SubCGE.FORWARD_MODES)
def test_forwards_are_a_pure_function_of_the_state_not_its_history(mode):
    """A client that ran forwards while the state evolved (caches built and dropped) and a fresh one
    restored from the saved state compute bit-identical losses: no stale W_eff / factors."""
    model, d = pending_direction(mode)
    seed = rng.derive(5, 9, 1)
    with d.perturbed(seed, 0, 0.05):  # builds the cache of the state after step 0
        model.loss()
    for o in range(5):
        d.accumulate(1, rng.derive(5, o, 1), 0.01 * (o + 1))
    d.commit(1)
    with d.perturbed(seed, 2, 0.05):
        live = model.loss()
    with d.current():
        live_plain = model.loss()
    saved = {n: p.detach().clone() for n, p in zip(d.names, d.params)}, d.extra_state()
    fresh = Quadratic()
    f = SubCGE(fresh, select_trainable(fresh, ["*"]), 5, d.cfg)
    f.forward = mode
    with torch.no_grad():
        for p, n in zip(f.params, f.names):
            p.copy_(saved[0][n])
    f.load_extra_state(saved[1])
    with f.perturbed(seed, 2, 0.05):
        assert fresh.loss() == live
    with f.current():
        assert fresh.loss() == live_plain
