"""gossip.py: Metropolis–Hastings weights, mixing and the consensus distance."""

import numpy as np
import pytest
import torch

from seedflood.core.config.systemsections import TopologyConfig
from seedflood.core.topology import resolve as topo
from seedflood.experiments import gossip

GRAPHS = [
    TopologyConfig(kind="ring", nodes=8),
    TopologyConfig(kind="grid", nodes=12),
    TopologyConfig(kind="star", nodes=6),
    TopologyConfig(kind="erdos_renyi", nodes=10, p=0.3, seed=2),
    TopologyConfig(kind="complete", nodes=5),
]


@pytest.mark.parametrize("tc", GRAPHS, ids=lambda tc: tc.kind)
def test_mh_weights_symmetric_doubly_stochastic_and_sparse(tc):
    top = topo.build(tc)
    w = gossip.mh_weights(top)
    assert np.array_equal(w, w.T)
    np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-12)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    assert (w >= 0).all() and (np.diag(w) > 0).all()
    for i in top.nodes:
        row = gossip.mh_row(top, i)
        assert set(row) == {i, *top.neighbors(i)}
        assert np.count_nonzero(w[i]) == len(row)
        for j, v in row.items():
            assert v == pytest.approx(w[i, j], abs=1e-15)


def test_mh_weights_values_on_a_star():
    # centre 0 has degree 5, leaves degree 1: W_0j = 1/(1+5); leaves keep 5/6, the centre 1/6.
    top = topo.build(TopologyConfig(kind="star", nodes=6))
    w = gossip.mh_weights(top)
    assert w[0, 1] == pytest.approx(1 / 6)
    assert w[1, 1] == pytest.approx(5 / 6)
    assert w[0, 0] == pytest.approx(1 / 6)
    assert w[1, 2] == 0.0


@pytest.mark.parametrize("tc", GRAPHS, ids=lambda tc: tc.kind)
def test_mixing_preserves_the_mean_and_contracts(tc):
    top = topo.build(tc)
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(50, generator=g, dtype=torch.float64) for _ in top.nodes]
    before = gossip.mean(xs)
    mixed = [gossip.mix(xs[i], {j: xs[j] for j in top.neighbors(i)}, gossip.mh_row(top, i), i) for i in top.nodes]
    torch.testing.assert_close(gossip.mean(mixed), before, rtol=0, atol=1e-12)
    assert gossip.consensus_distance(mixed)[0] < gossip.consensus_distance(xs)[0]
    w = torch.from_numpy(gossip.mh_weights(top))
    torch.testing.assert_close(torch.stack(mixed), w @ torch.stack(xs), rtol=0, atol=1e-12)


def test_mix_needs_every_neighbour():
    top = topo.build(TopologyConfig(kind="ring", nodes=4))
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="neighbours \\[3\\]"):
        gossip.mix(x, {1: x}, gossip.mh_row(top, 0), 0)


def test_consensus_distance_values():
    a, b = torch.tensor([3.0, 0.0]), torch.tensor([-3.0, 8.0])
    dist, rel = gossip.consensus_distance([a, b])  # x̄ = (0, 4); ‖a − x̄‖ = ‖b − x̄‖ = 5
    assert dist == pytest.approx(5.0)
    assert rel == pytest.approx(5.0 / 4.0)
    assert gossip.consensus_distance([a, a.clone()]) == (0.0, 0.0)


@pytest.mark.parametrize("tc", GRAPHS, ids=lambda tc: tc.kind)
def test_mixing_identical_vectors_is_an_exact_no_op(tc):
    """x_i + Σ W_ij (x_j − x_i): identical clients keep their bits (W_ii·x + Σ W_ij·x rounds)."""
    top = topo.build(tc)
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1))
    for i in top.nodes:
        row = gossip.mh_row(top, i)
        assert torch.equal(gossip.mix(x, {j: x for j in top.neighbors(i)}, row, i), x)
        assert torch.equal(gossip.pull(x, {j: x for j in top.neighbors(i)}, row, i), torch.zeros_like(x))
