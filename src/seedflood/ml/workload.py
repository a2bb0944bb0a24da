"""What one process trains or scores: a config turned into model, direction, data and loss.

Owns: composing the adapters (model.py, tasks.py) with the core (directions.py) for a role:
a client's loss on its batch of a step, and the evaluator's scoring of the consensus model.
Roles receive a Workload; tests can build one around any model and loss.

Assumes: every process of a run builds its Workload from the same config, so base weights,
splits, shards and batches agree everywhere.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any

from seedflood.core import directions, protocol
from seedflood.core.config import Config
from seedflood.core.directions import Direction
from seedflood.ml import host, model, tasks

log = logging.getLogger(__name__)


def train_digest(splits: tasks.Splits) -> str:
    """Digest of a train split: its examples' fields and labels, in order."""
    return protocol.digest((e.fields, e.label) for e in splits.train)


@dataclass
class Workload:
    cfg: Config
    loaded: model.Loaded
    spec: tasks.TaskSpec
    splits: tasks.Splits
    direction: Direction
    _batch_cache: dict[tuple[int, int], Any] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, cfg: Config, local_rank: int = 0, local_processes: int = 1) -> Workload:
        """Everything one process needs; `local_rank` picks this process's GPU for model.device=cuda,
        `local_processes` (how many the launcher started on this machine) sizes run.threads = 0."""
        host.set_threads(cfg.run.threads, local_processes)
        spec = tasks.get(cfg.task)  # the config's template/verbalizer overrides; table is built from it
        splits = tasks.load_splits(cfg.task, cfg.run.seed)
        loaded = model.load(cfg.model, local_rank=local_rank)
        direction = directions.build(loaded.model, cfg.zo, cfg.subspace, cfg.run.seed)
        return cls(cfg, loaded, spec, splits, direction)

    @property
    def model(self) -> Any:
        return self.loaded.model

    def train_digest(self) -> str:
        """Digest of the train split (the data every client's batches come from)."""
        return train_digest(self.splits)

    @functools.cached_property
    def shards(self) -> list[list[tasks.Example]]:
        """Every client's shard under task.split (iid or dirichlet), computed once per process."""
        return tasks.client_shards(self.cfg.task, self.splits.train, self.cfg.run.seed, self.cfg.topology.nodes)

    def shard(self, client: int) -> list[tasks.Example]:
        n = self.cfg.topology.nodes
        if not 0 <= client < n:
            raise tasks.TaskError(f"client {client} is not in 0..{n - 1}")
        return self.shards[client]

    def label_table(self) -> str:
        """Label counts per client (tasks.label_table), for the start-up log."""
        return tasks.label_table(self.shards, self.spec.n_labels)

    def batch(self, client: int, step: int) -> tasks.Batch:
        """Client `client`'s encoded batch of `step` (cached: the ± forwards share it)."""
        key = (client, step)
        if key not in self._batch_cache:
            self._batch_cache.clear()
            examples = tasks.batch_examples(
                self.shard(client), self.cfg.run.seed, client, step, self.cfg.task.batch_size
            )
            self._batch_cache[key] = tasks.encode(examples, self.spec, self.loaded.tokenizer, self.cfg.task.max_tokens)
        return self._batch_cache[key]

    def loss(self, client: int, step: int) -> float:
        """L(θ) on the client's batch of `step`, under whatever perturbation context is active."""
        return float(model.loss(self.model, self.batch(client, step)))

    def scores(self) -> dict[str, Any]:
        """The current model's dev and test scores as the fields of a metrics line (the evaluator's
        and the baselines'): test accuracy, loss, AUC, dev-threshold accuracy, prediction shares,
        and dev accuracy (None without a dev split)."""
        dev = self.evaluate("dev") if self.splits.dev else None
        m = self.evaluate("test", dev=dev)["metrics"]
        fields = {
            "accuracy": m["accuracy"],
            "loss": m["loss"],
            "auc": m["auc"],
            "threshold_accuracy": m["threshold_accuracy"],
            "pred_frac": m["pred_frac"],
            "dev_accuracy": dev["metrics"]["accuracy"] if dev else None,
        }
        return fields

    def evaluate(self, split: str, dev: dict[str, Any] | None = None, limit: int = 0) -> dict[str, Any]:
        """Score the canonical model (pending updates included) on a split."""
        examples = getattr(self.splits, split)
        if limit:
            examples = examples[:limit]
        with self.direction.current():
            return model.evaluate(
                self.model,
                examples,
                self.spec,
                self.loaded.tokenizer,
                self.cfg.task.max_tokens,
                self.cfg.eval.batch_size,
                dev=dev,
            )
