"""What one process trains or scores: a config turned into model, direction, data and loss.

Owns: composing the adapters (model.py, objective.py, tasks.py, sampling.py, encoding.py) with the
core (directions, family) for a role: a client's loss on its batch of a step, and the evaluator's
scoring of the consensus model.
Roles receive a Workload; tests can build one around any model and loss. It keeps only the
settings it reads after it is built (the task section, the run seed, the client count, the
scoring batch size), not the whole config.

Assumes: every process of a run builds its Workload from the same config, so base weights,
splits, shards and batches agree everywhere.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from seedflood.core.config.runconfig import Config, TaskConfig
from seedflood.core.zo import family
from seedflood.core.zo.directions import Direction
from seedflood.ml import encoding, machine, model, objective, sampling, tasks
from seedflood.ml.datafiles import Example, TaskError

log = logging.getLogger(__name__)

ExamplesScored = Callable[[int, int], None]
"""A scoring progress callback: (examples scored so far, examples to score)."""


@dataclass
class Workload:
    task: TaskConfig
    seed: int  # run.seed: shards and batches
    nodes: int  # topology.nodes: how many shards
    eval_batch_size: int  # eval.batch_size: scoring batches (examples)
    loaded: model.Loaded
    spec: tasks.TaskSpec
    splits: sampling.Splits
    direction: Direction
    max_nodes: int = 0  # churn.max_nodes: ids topology.nodes..max_nodes-1 may join (they share shards)
    _batch_cache: dict[tuple[int, int], Any] = field(default_factory=dict, repr=False)
    _tokens: dict[int, dict[int, encoding.Tokens]] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, cfg: Config, device: str | None = None, local_processes: int = 1) -> Workload:
        """Everything one process needs; `device`: where its model goes (a launched process's
        modelcheck.place; None: model.device as for local rank 0), `local_processes` (how many the
        launcher started on this machine) sizes run.threads = 0."""
        machine.set_threads(cfg.run.threads, local_processes)
        spec = tasks.get(cfg.task)  # the config's template/verbalizer overrides; table is built from it
        splits = sampling.load_splits(cfg.task, cfg.run.seed)
        loaded = model.load(cfg.model, device=device)
        direction = family.build(loaded.model, cfg.zo, cfg.subspace, cfg.run.seed)
        return cls(
            cfg.task,
            cfg.run.seed,
            cfg.topology.nodes,
            cfg.eval.batch_size,
            loaded,
            spec,
            splits,
            direction,
            cfg.churn.max_nodes,
        )

    @property
    def model(self) -> Any:
        return self.loaded.model

    def train_digest(self) -> str:
        """Digest of the train split (the data every client's batches come from)."""
        return sampling.train_digest(self.splits)

    @functools.cached_property
    def shards(self) -> list[list[Example]]:
        """Every client's shard under task.split (iid or dirichlet), computed once per process."""
        return sampling.client_shards(self.task, self.splits.train, self.seed, self.nodes)

    def shard(self, client: int) -> list[Example]:
        """Client `client`'s shard: one of the N founders' shards (topology.nodes); a brand-new id
        j >= N (open membership, churn.max_nodes) shares founder j mod N's shard, and draws its own
        batches from it (`batch`: keyed by its id), so no founder's data or bits change."""
        ids = max(self.nodes, self.max_nodes)
        if not 0 <= client < ids:
            raise TaskError(f"client {client} is not in 0..{ids - 1}")
        return self.shards[client % self.nodes]

    def label_table(self) -> str:
        """Label counts per client (sampling.label_table), for the start-up log."""
        return sampling.label_table(self.shards, self.spec.n_labels)

    def batch(self, client: int, step: int) -> encoding.Batch:
        """Client `client`'s encoded batch of `step` (sampling.batch_examples, encoded): cached for
        the step (the ± forwards share it), and each shard example is tokenized once per process
        (a small run draws every example many times; tokenizing was ~15 % of a tiny step)."""
        key = (client, step)
        if key not in self._batch_cache:
            self._batch_cache.clear()
            shard = self.shard(client)
            idx = sampling.batch_indices(len(shard), self.seed, client, step, self.task.batch_size)
            known = self._tokens.setdefault(client, {})  # shard position -> Tokens
            new = [i for i in idx if i not in known]  # a batch's positions are distinct
            if new:
                tokens = encoding.tokenize(
                    [shard[i] for i in new], self.spec, self.loaded.tokenizer, self.task.max_tokens
                )
                known.update(zip(new, tokens))
            self._batch_cache[key] = encoding.collate([known[i] for i in idx], self.spec, self.loaded.tokenizer)
        return self._batch_cache[key]

    def forget_batch(self) -> None:
        """Drop the cached batch of the last step (its tokens stay cached per example)."""
        self._batch_cache.clear()

    def loss(self, client: int, step: int) -> float:
        """L(θ) on the client's batch of `step`, under whatever perturbation context is active."""
        return float(objective.loss(self.model, self.batch(client, step)))

    def score_splits(self, on_examples: ExamplesScored | None = None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """`evaluate` on dev (None without a dev split), then on test with dev's threshold.
        `on_examples(done, total)` (a progress display) follows both as one count: it is called
        after each batch with the examples scored so far out of dev's and test's together."""
        n_dev = len(self.splits.dev) if self.splits.dev else 0
        total = n_dev + len(self.splits.test)

        def after(offset: int) -> Callable[[int], None] | None:
            return None if on_examples is None else (lambda done: on_examples(offset + done, total))

        dev = self.evaluate("dev", on_batch=after(0)) if n_dev else None
        return dev, self.evaluate("test", dev=dev, on_batch=after(n_dev))

    def scores(self, on_examples: ExamplesScored | None = None) -> dict[str, Any]:
        """The current model's dev and test scores as the fields of a metrics line (the evaluator's
        and the baselines'): test accuracy, loss, AUC, dev-threshold accuracy, prediction shares,
        and dev accuracy (None without a dev split). `on_examples`: as `score_splits`."""
        dev, test = self.score_splits(on_examples)
        m = test["metrics"]
        fields = {
            "accuracy": m["accuracy"],
            "loss": m["loss"],
            "auc": m["auc"],
            "threshold_accuracy": m["threshold_accuracy"],
            "pred_frac": m["pred_frac"],
            "dev_accuracy": dev["metrics"]["accuracy"] if dev else None,
        }
        return fields

    def evaluate(
        self,
        split: str,
        dev: dict[str, Any] | None = None,
        limit: int = 0,
        on_batch: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        """Score the canonical model (pending updates included) on a split; `on_batch` as
        `objective.evaluate`'s (examples of this split scored so far)."""
        examples = getattr(self.splits, split)
        if limit:
            examples = examples[:limit]
        with self.direction.current():
            return objective.evaluate(
                self.model,
                examples,
                self.spec,
                self.loaded.tokenizer,
                self.task.max_tokens,
                self.eval_batch_size,
                dev=dev,
                on_batch=on_batch,
            )
