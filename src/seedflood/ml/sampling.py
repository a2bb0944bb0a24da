"""Sampling: train/dev/test splits, the preflight, client shards and each step's batch.

Owns:
- `load_splits(cfg, run_seed)`: MeZO's recipe — train and dev (disjoint) sampled from the train
  pool, test from the validation/test pool; one-file tasks (rt) carve all three disjointly;
- `check(cfg, run_seed, n_clients)`: the preflight — the same load, plus the sizes a run needs
  (a non-empty shard per client, a non-empty test split, dev when asked for); returns the splits;
- `train_digest(splits)`: the digest of the train split that the run's trajectory records;
- client shards: `shard` (iid: every N-th example), `dirichlet_shards` (label skew, every client
  non-empty), `client_shards` (the configured one), `label_table` (the start-up log of label
  counts per client); `batch_examples` (a pure function of (run seed, client, step): a
  restarted client draws the same batch).

Assumes: pools come from the task's loader (tasks.get); every random choice comes from
`rng.generator` with explicit keys, so every process computes the same splits and batches.
Bad input raises `TaskError` with one line naming the task.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from seedflood.core.config import rng
from seedflood.core.config.trainsections import TaskConfig
from seedflood.core.flood import protocol
from seedflood.ml import prompts
from seedflood.ml.datafiles import Example, TaskError
from seedflood.ml.tasks import get

log = logging.getLogger(__name__)

_TAG_SPLIT = 0x5B117  # domain tag of split sampling (distinct from rng's tags)
_TAG_DIRICHLET = 0xD1C1E7  # domain tag of the Dirichlet client split


@dataclass(frozen=True)
class Splits:
    train: list[Example]
    dev: list[Example]
    test: list[Example]


def train_digest(splits: Splits) -> str:
    """Digest of a train split: its examples' fields and labels, in order."""
    return protocol.digest((e.fields, e.label) for e in splits.train)


def _task_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def _take(pool: list[Example], n: int, what: str, task: str) -> int:
    if n > len(pool):
        log.warning("task %s: %s asks for %d examples, only %d available; using all", task, what, n, len(pool))
    return min(n, len(pool))


def load_splits(cfg: TaskConfig, run_seed: int) -> Splits:
    """Train/dev/test for `cfg.name`, identical in every process for the same (run_seed, task)."""
    spec = get(cfg)
    train_pool, test_pool = spec.loader(cfg)
    key = _task_key(spec.name)
    order = rng.generator(_TAG_SPLIT, run_seed, key, 0).permutation(len(train_pool))
    if test_pool is None:  # one pool: test first, train and dev from the rest
        n_test = _take(train_pool, cfg.test_examples, "test", spec.name)
        test = [train_pool[i] for i in order[:n_test]]
        rest = [train_pool[i] for i in order[n_test:]]
    else:
        n_test = _take(test_pool, cfg.test_examples, "test", spec.name)
        pick = rng.generator(_TAG_SPLIT, run_seed, key, 1).permutation(len(test_pool))[:n_test]
        test = [test_pool[i] for i in pick]
        rest = [train_pool[i] for i in order]
    n_train = _take(rest, cfg.train_examples, "train", spec.name)
    n_dev = _take(rest[n_train:], cfg.dev_examples, "dev", spec.name)
    splits = Splits(rest[:n_train], rest[n_train : n_train + n_dev], test)
    for name in ("train", "dev", "test"):
        part = getattr(splits, name)
        counts = np.bincount([e.label for e in part], minlength=spec.n_labels)
        log.info("task %s %s: %d examples, labels %s", spec.name, name, len(part), counts.tolist())
    return splits


def check(cfg: TaskConfig, run_seed: int, n_clients: int) -> Splits:
    """Preflight: load the splits exactly as a run does (`load_splits`) and raise TaskError when a
    run would fail after launch — an unreadable data file (raised by the loaders), a train split
    too small for every one of `n_clients` clients to get a non-empty shard, an empty test split,
    or task.dev_examples > 0 with nothing left for dev. Returns the splits (equal to every
    process's load_splits). Costs one data load (rt: ~0.8 s)."""
    splits = load_splits(cfg, run_seed)
    name = cfg.name
    if len(splits.train) < max(n_clients, 1):
        if cfg.train_examples < n_clients:
            raise TaskError(
                f"task {name}: task.train_examples={cfg.train_examples} is fewer than the {n_clients} clients "
                "(every client needs a non-empty shard)"
            )
        raise TaskError(
            f"task {name}: only {len(splits.train)} training examples are available for {n_clients} clients "
            "(every client needs a non-empty shard)"
        )
    if not splits.test:
        if cfg.test_examples == 0:
            raise TaskError(f"task {name}: task.test_examples is 0 but the evaluator needs a non-empty test split")
        raise TaskError(f"task {name}: the test split is empty (its data holds no examples)")
    if cfg.dev_examples > 0 and not splits.dev:
        raise TaskError(
            f"task {name}: task.dev_examples={cfg.dev_examples} but no examples are left for dev after "
            f"{len(splits.train)} train examples (lower task.train_examples or set task.dev_examples: 0)"
        )
    spec = get(cfg)
    try:  # a template override naming a field this task lacks fails here, not mid-run
        spec.template(splits.train[0].fields)
    except prompts.PromptError as e:
        raise TaskError(f"task {name}: task.template: {e}") from None
    if n_clients >= 1 and any(not s for s in client_shards(cfg, splits.train, run_seed, n_clients)):
        raise TaskError(f"task {name}: a client got an empty shard")  # guarded by construction; cheap to check
    return splits


def shard(train: Sequence[Example], client: int, n_clients: int) -> list[Example]:
    """Client `client`'s share (0-based node index): every `n_clients`-th example, sizes differ by ≤ 1.

    The train split is already a random sample, so a strided split is iid.
    """
    if not 0 <= client < n_clients:
        raise TaskError(f"client {client} is not in 0..{n_clients - 1}")
    if len(train) < n_clients:
        raise TaskError(f"{len(train)} training examples cannot be shared by {n_clients} clients")
    return list(train[client::n_clients])


def dirichlet_indices(labels: Sequence[int], n_clients: int, alpha: float, run_seed: int) -> list[list[int]]:
    """Label-skewed client shards as sorted indices into `labels` (the train split's labels).

    For each label k (0, 1, ..., max label, in order), client shares p ~ Dirichlet(alpha·1_N) are
    drawn and label k's examples, in a seeded random order, are cut into N consecutive blocks of
    sizes ⌊P_c·n_k⌋ − ⌊P_{c−1}·n_k⌋ (P = cumulative shares): α → ∞ gives every client n_k/N ± 1 of
    each label. A pure function of (labels, N, α, run seed): every process computes the same
    shards. Non-empty by repair: while a client is empty, it takes the last example of the
    largest shard (lowest index on ties); since len(labels) >= N, a shard of >= 2 exists whenever
    one is empty, so every client ends with >= 1 example and at most N − 1 examples move.
    """
    if not 1 <= n_clients <= len(labels):
        raise TaskError(f"{len(labels)} training examples cannot be shared by {n_clients} clients")
    if not alpha > 0:
        raise TaskError(f"task.alpha must be > 0, got {alpha}")
    g = rng.generator(_TAG_DIRICHLET, run_seed, n_clients)
    y = np.asarray(labels, dtype=np.int64)
    owner = np.full(len(y), -1, dtype=np.int64)
    for k in range(int(y.max()) + 1):  # absent labels still draw: the stream does not depend on which occur
        members = g.permutation(np.flatnonzero(y == k))
        share = g.dirichlet(np.full(n_clients, float(alpha)))
        cuts = np.floor(np.cumsum(share[:-1]) * len(members)).astype(np.int64).clip(0, len(members))
        bounds = [0, *cuts.tolist(), len(members)]  # the last client takes the rounding remainder
        for c in range(n_clients):
            owner[members[bounds[c] : bounds[c + 1]]] = c
    shards = [np.flatnonzero(owner == c).tolist() for c in range(n_clients)]
    for c in range(n_clients):
        if not shards[c]:
            donor = max(range(n_clients), key=lambda j: (len(shards[j]), -j))
            shards[c].append(shards[donor].pop())
    return shards


def dirichlet_shards(train: Sequence[Example], n_clients: int, alpha: float, run_seed: int) -> list[list[Example]]:
    """`dirichlet_indices` over the train split's labels, as examples (train order kept)."""
    idx = dirichlet_indices([e.label for e in train], n_clients, alpha, run_seed)
    return [[train[i] for i in shard] for shard in idx]


def client_shards(cfg: TaskConfig, train: Sequence[Example], run_seed: int, n_clients: int) -> list[list[Example]]:
    """Every client's shard under task.split: iid = `shard` (every N-th example, unchanged, so
    existing runs keep their bits), dirichlet = `dirichlet_shards` with task.alpha."""
    if cfg.split == "dirichlet":
        return dirichlet_shards(train, n_clients, cfg.alpha, run_seed)
    return [shard(train, c, n_clients) for c in range(n_clients)]


def label_table(shards: Sequence[Sequence[Example]], n_labels: int) -> str:
    """Label counts per client, one row each plus a total row (what a run logs at start-up):

    client  examples  label 0  label 1
         0        63       31       32
       all       125       62       63
    """
    counts = np.zeros((len(shards), max(n_labels, 1)), dtype=np.int64)
    for c, part in enumerate(shards):
        for e in part:
            counts[c, e.label] += 1
    head = ["client", "examples", *(f"label {k}" for k in range(counts.shape[1]))]
    rows = [[str(c), str(int(r.sum())), *map(str, r.tolist())] for c, r in enumerate(counts)]
    rows.append(["all", str(int(counts.sum())), *map(str, counts.sum(0).tolist())])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in [head, *rows])


def batch_examples(shard: Sequence[Example], run_seed: int, client: int, step: int, batch_size: int) -> list[Example]:
    """The batch of `client` at `step`: min(batch_size, len(shard)) distinct examples.

    A pure function of its arguments (each step draws independently), so a restarted client
    draws exactly the same batches.
    """
    return [shard[i] for i in batch_indices(len(shard), run_seed, client, step, batch_size)]


def batch_indices(shard_size: int, run_seed: int, client: int, step: int, batch_size: int) -> list[int]:
    """Positions in the shard of `batch_examples`' examples, in batch order."""
    g = rng.generator(rng.TAG_BATCH, run_seed, client, step)
    return [int(i) for i in g.choice(shard_size, size=min(batch_size, shard_size), replace=False)]
