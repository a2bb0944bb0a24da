"""Client splits: iid (unchanged strided shards), Dirichlet(α) over labels, the label table.

Tolerance of the α → ∞ test, derived for N = 8 clients and n = 1000 train examples, two labels
with counts n_k ≈ 500 (shards of m = 125):
- Dirichlet(α): each client's share of label k has std σ_p = sqrt((1/N)(1 − 1/N)/(Nα + 1));
  at α = 1e6 that is 1.2e-4, so n_k·4σ_p ≈ 0.23 examples, and the floor cuts add < 1: every
  client holds n_k/N ± 1.25 examples of label k (asserted: ± 1.5).
- iid (strided over the randomly ordered train split): a client's count of label k is
  hypergeometric, std ≤ sqrt(m·p(1 − p)) (the multinomial std), i.e. a fraction std ≤
  sqrt(p(1 − p)/m) = 0.045 at p = 0.5. The two splits' per-client label fractions must agree
  within 4 of those stds plus the Dirichlet rounding: 4·sqrt(p(1 − p)/m) + 1.5/m ≈ 0.19
  (measured: ≤ 0.08 over 5 seeds).
"""

from __future__ import annotations

import numpy as np
import pytest

from seedflood.core.config.runconfig import Config
from seedflood.core.config.trainsections import TaskConfig
from seedflood.ml import datafiles, sampling, tasks
from seedflood.ml.workload import Workload

N, SIZE = 8, 1000


def train_split(seed: int, n: int = SIZE, n_labels: int = 2) -> list[datafiles.Example]:
    labels = np.random.default_rng(100 + seed).integers(0, n_labels, n)
    return [datafiles.Example({"sentence": f"s{i}"}, int(y)) for i, y in enumerate(labels)]


def counts(shards, n_labels: int = 2) -> np.ndarray:
    return np.array([np.bincount([e.label for e in s], minlength=n_labels) for s in shards])


def assert_partition(shards, train) -> None:
    ids = sorted(e.fields["sentence"] for s in shards for e in s)
    assert ids == sorted(e.fields["sentence"] for e in train)
    for s in shards:  # train order is kept inside a shard
        assert [int(e.fields["sentence"][1:]) for e in s] == sorted(int(e.fields["sentence"][1:]) for e in s)


def test_iid_shards_are_the_strided_split_unchanged():
    train = train_split(0, 43)
    shards = sampling.client_shards(TaskConfig(split="iid", alpha=0.1), train, 5, 4)
    by_hand = [[train[i] for i in range(c, 43, 4)] for c in range(4)]  # every 4th example from c
    assert shards == by_hand == [sampling.shard(train, c, 4) for c in range(4)]


@pytest.mark.parametrize("seed", range(5))
def test_dirichlet_with_huge_alpha_matches_iid_proportions(seed):
    train = train_split(seed)
    n_k = counts([train])[0]
    dirichlet = counts(sampling.client_shards(TaskConfig(split="dirichlet", alpha=1e6), train, seed, N))
    iid = counts(sampling.client_shards(TaskConfig(split="iid"), train, seed, N))
    assert np.abs(dirichlet - n_k / N).max() <= 1.5  # each client: n_k/N ± 1.25 (module docstring)
    m, p = SIZE / N, n_k / SIZE
    tolerance = 4 * np.sqrt(p * (1 - p) / m) + 1.5 / m
    fractions = dirichlet / dirichlet.sum(1, keepdims=True), iid / iid.sum(1, keepdims=True)
    assert (np.abs(fractions[0] - fractions[1]) <= tolerance).all()


def skew(c: np.ndarray) -> float:
    """Mean over clients of the total-variation distance between its labels and the global ones."""
    global_p = c.sum(0) / c.sum()
    return float((np.abs(c / c.sum(1, keepdims=True) - global_p).sum(1) / 2).mean())


@pytest.mark.parametrize("seed", range(5))
def test_small_alpha_gives_skewed_shards(seed):
    train = train_split(seed, n_labels=3)
    small = counts(sampling.client_shards(TaskConfig(split="dirichlet", alpha=0.1), train, seed, N), 3)
    iid = counts(sampling.client_shards(TaskConfig(split="iid"), train, seed, N), 3)
    assert skew(iid) < 0.08 and skew(small) > 0.3  # measured: iid ≈ 0.03-0.05, α = 0.1 ≈ 0.4-0.6
    assert (small.max(1) / small.sum(1)).mean() > 0.6  # most clients are dominated by one label


@pytest.mark.parametrize(
    ("alpha", "n_clients", "size"), [(0.01, 16, 40), (0.05, 32, 32), (0.3, 128, 1000), (1e6, 7, 7)]
)
def test_every_client_gets_an_example_and_the_split_partitions(alpha, n_clients, size):
    train = train_split(1, size)
    for seed in range(3):
        shards = sampling.client_shards(TaskConfig(split="dirichlet", alpha=alpha), train, seed, n_clients)
        assert len(shards) == n_clients and min(map(len, shards)) >= 1
        assert_partition(shards, train)


def test_tiny_alpha_leaves_no_client_empty():
    labels = [0] * 30 + [1] * 10
    singletons = 0
    for seed in range(20):
        idx = sampling.dirichlet_indices(labels, 16, 0.01, seed)
        singletons = max(singletons, sum(len(s) == 1 for s in idx))
        assert min(map(len, idx)) == 1 and sorted(sum(idx, [])) == list(range(40))
    assert singletons >= 8  # α = 0.01 leaves many clients empty until the repair gives each one example


def test_dirichlet_is_a_pure_function_of_seed_clients_and_train():
    train = train_split(2, 200)
    cfg = TaskConfig(split="dirichlet", alpha=0.5)
    a = sampling.client_shards(cfg, train, 3, 8)
    assert a == sampling.client_shards(cfg, train, 3, 8)
    assert a != sampling.client_shards(cfg, train, 4, 8)  # run seed
    assert a[:4] != sampling.client_shards(cfg, train, 3, 4)[:4]  # client count
    assert a != sampling.client_shards(TaskConfig(split="dirichlet", alpha=5.0), train, 3, 8)  # α
    with pytest.raises(datafiles.TaskError, match="3 training examples cannot be shared by 4 clients"):
        sampling.client_shards(cfg, train[:3], 0, 4)


def test_label_table():
    ex = [datafiles.Example({"s": str(i)}, y) for i, y in enumerate([0, 1, 1, 2, 2, 2])]
    table = sampling.label_table([ex[:1], ex[1:3], ex[3:]], 3)
    assert table.splitlines() == [
        "client  examples  label 0  label 1  label 2",
        "     0         1        1        0        0",
        "     1         2        0        2        0",
        "     2         3        0        0        3",
        "   all         6        1        2        3",
    ]


def test_workload_uses_the_configured_split():
    splits = sampling.Splits(train_split(0, 200), [], [])
    cfg = Config(task=TaskConfig(split="dirichlet", alpha=0.1))
    cfg.topology.nodes = 8
    w = Workload(cfg.task, cfg.run.seed, 8, cfg.eval.batch_size, None, tasks.get("rt"), splits, None)  # type: ignore[arg-type]  # shards need no model
    want = sampling.dirichlet_shards(splits.train, 8, 0.1, cfg.run.seed)
    assert [w.shard(c) for c in range(8)] == want != [sampling.shard(splits.train, c, 8) for c in range(8)]
    assert w.label_table() == sampling.label_table(want, 2)
    with pytest.raises(datafiles.TaskError, match="client 8 is not in 0..7"):
        w.shard(8)
    assert sum(map(len, want)) == 200


def test_check_accepts_a_dirichlet_split_with_one_example_per_client():
    cfg = TaskConfig(name="synthetic", split="dirichlet", alpha=0.01, train_examples=8, dev_examples=0, test_examples=4)
    splits = sampling.check(cfg, 0, 8)
    assert [len(s) for s in sampling.client_shards(cfg, splits.train, 0, 8)] == [1] * 8
