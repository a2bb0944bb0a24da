"""The evaluator role (rank 0): follows the flood, logs it, scores and checkpoints the consensus.

Owns: the run directory while a run is live. For each complete step pushed by its attach client
it validates the step (every origin, every k, the next step in order), applies it to its own copy
of the canonical state, appends it to the message log (flushed per step), and every `eval.every`
steps scores the model on the dev and test splits; every `checkpoint.every` steps it writes a
checkpoint. It trains nothing and never takes part in a hop, so it cannot slow the clients down:
frames wait in its inbox while it scores.

Assumes: frames arrive in step order from one attach client (the transport keeps order).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from seedflood import checkpoint as ckpt
from seedflood import config as config_mod
from seedflood import message, model, rng
from seedflood.config import Config
from seedflood.message import Limits, Message
from seedflood.metrics import MetricsWriter, Progress, human_bytes
from seedflood.replay import Applier, state_hash
from seedflood.workload import Workload

log = logging.getLogger(__name__)


class EvaluatorError(RuntimeError):
    """The stream from the attach client broke the protocol (gap, incomplete step)."""


def log_header(cfg: Config, w: Workload) -> dict[str, Any]:
    return {
        "run_seed": cfg.run.seed,
        "n_clients": cfg.topology.nodes,
        "base_identity": w.loaded.identity,
        "base_hash": w.loaded.base_hash,
        "config": cfg.to_dict(),
    }


def restore(w: Workload, run_dir: Path, records: list[tuple[int, list[Message]]]) -> int:
    """Bring `w` to the state after `records` (checkpoint + tail replay when one exists)."""
    cfg = w.cfg
    applier = Applier(w.direction, cfg.zo, cfg.run.steps, cfg.topology.nodes)
    start = 0
    latest = ckpt.latest(run_dir) if run_dir.exists() else None
    if latest is not None:
        meta = ckpt.read_meta(latest)
        if meta.get("base_hash") != w.loaded.base_hash:
            raise ckpt.CheckpointError(f"{latest}: base model hash differs from this run's model")
        if meta["step"] <= len(records):
            state = ckpt.load_state(latest / "state.pt")
            params = dict(w.model.named_parameters())
            for name in w.direction.names:
                params[name].data.copy_(state[name])
            extra = set(w.direction.extra_state())
            w.direction.load_extra_state({k: v for k, v in state.items() if k in extra})
            start = meta["step"]
    applier.last_step = start - 1
    applier.apply_all(records[start:])
    return len(records)


class Evaluator:
    def __init__(self, cfg: Config, workload: Workload, inbox, start_step: int = 0,
                 progress: bool = True) -> None:
        self.cfg = cfg
        self.w = workload
        self.inbox = inbox
        self.run_dir = Path(cfg.run.out_dir)
        self.applier = Applier(workload.direction, cfg.zo, cfg.run.steps, cfg.topology.nodes)
        self.applier.last_step = start_step - 1
        self.next_step = start_step
        self.metrics = MetricsWriter(self.run_dir / "metrics.jsonl")
        self.log = ckpt.LogWriter(self.run_dir / "log.bin", log_header(cfg, workload))
        self.log.truncate_to(start_step)
        self.log_bytes = (self.run_dir / "log.bin").stat().st_size
        self.progress = Progress(cfg.run.steps, initial=start_step, enabled=progress)
        self.last: dict[str, Any] = {}
        self.zero_shot: dict[str, Any] = {}
        self.t0 = time.monotonic()

    # -- scoring --------------------------------------------------------------------------------
    def score(self, step: int, **extra: Any) -> dict[str, Any]:
        """Evaluate the canonical model after `step` steps; writes one metrics line."""
        t = time.monotonic()
        dev = self.w.evaluate("dev") if self.w.splits.dev else None
        test = self.w.evaluate("test", dev=dev)
        m = test["metrics"]
        record = {
            "step": step,
            "accuracy": m["accuracy"],
            "loss": m["loss"],
            "auc": m["auc"],
            "threshold_accuracy": m["threshold_accuracy"],
            "pred_frac": m["pred_frac"],
            "dev_accuracy": dev["metrics"]["accuracy"] if dev else None,
            "log_bytes": self.log_bytes,
            "eval_seconds": round(time.monotonic() - t, 2),
            "elapsed_seconds": round(time.monotonic() - self.t0, 2),
            **extra,
        }
        self.metrics.write(record)
        self.last = record
        auc = "n/a" if m["auc"] is None else f"{m['auc']:.3f}"
        thr = "" if m["threshold_accuracy"] is None else f", dev-threshold acc {m['threshold_accuracy']:.3f}"
        self.progress.write(f"step {step:5d}: test acc {m['accuracy']:.3f}, loss {m['loss']:.4f}, AUC {auc}{thr}")
        return record

    # -- the stream -----------------------------------------------------------------------------
    def limits(self) -> Limits:
        run_seed = self.cfg.run.seed
        return Limits(
            n_origins=self.cfg.topology.nodes, min_step=self.next_step, max_step=self.next_step,
            max_k=self.cfg.zo.perturbations, max_scalar=self.cfg.flood.max_scalar,
            seed_of=lambda o, s, k: rng.derive(run_seed, o, s, k),
        )

    def take(self, frame: bytes) -> None:
        """One complete step from the attach client: validate, apply, log, maybe score/save."""
        step = self.next_step
        try:
            msgs = message.decode(frame, self.limits())
        except message.FrameError as e:
            raise EvaluatorError(f"evaluator: bad frame for step {step}: {e}") from None
        want = self.cfg.topology.nodes * self.cfg.zo.perturbations
        if len(msgs) != want:
            raise EvaluatorError(f"evaluator: step {step} carries {len(msgs)} messages, expected {want}")
        self.applier.apply(step, msgs)
        self.log_bytes += self.log.append(step, msgs)
        self.next_step += 1
        done = self.next_step
        shown = {"loss": self.last["loss"], "acc": self.last["accuracy"]} if self.last else {}
        self.progress.update(1, scalar=msgs[0].scalar, log=human_bytes(self.log_bytes), **shown)
        if self.cfg.eval.every and done % self.cfg.eval.every == 0 and done < self.cfg.run.steps:
            self.score(done)
        if self.cfg.checkpoint.every and done % self.cfg.checkpoint.every == 0 and done < self.cfg.run.steps:
            self.save(done)

    def run(self) -> dict[str, Any]:
        """Follow the stream to its end; returns the final metrics record."""
        config_path = self.run_dir / "config.yaml"
        ckpt.atomic_write_text(config_path, config_mod.dump(self.cfg))
        if self.next_step == 0:
            self.zero_shot = self.score(0, zero_shot=True)
        timeout = self.cfg.transport.timeout_s
        while self.next_step < self.cfg.run.steps:
            frame = self.inbox.get(timeout=timeout)
            if frame is None:
                raise EvaluatorError(
                    f"evaluator: the stream ended after step {self.next_step - 1} of {self.cfg.run.steps}"
                )
            self.take(frame)
        self.progress.close()
        final = self.score(self.next_step, final=True, param_hash=state_hash(self.w.model, self.w.direction))
        self.save(self.next_step)
        return final

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self, step: int) -> Path:
        """Checkpoint after `step` steps: state, meta, log prefix and (optionally) an HF model dir."""
        w = self.w
        target = ckpt.checkpoint_dir(self.run_dir, step)
        with ckpt.atomic_dir(target) as tmp:
            state = {n: p.detach().cpu() for n, p in zip(w.direction.names, w.direction.params)}
            state.update(w.direction.extra_state())
            ckpt.save_state(tmp / "state.pt", state)
            shutil.copyfile(self.run_dir / "log.bin", tmp / "log.bin")
            if self.cfg.checkpoint.hf_model:
                model.save(w.loaded, tmp / "hf", w.direction.effective_tensors())
            meta = {
                "step": step,
                "base_identity": w.loaded.identity,
                "base_hash": w.loaded.base_hash,
                "param_hash": state_hash(w.model, w.direction),
                "config": self.cfg.to_dict(),
            }
            ckpt.atomic_write_text(tmp / "meta.json", json.dumps(meta, indent=1, sort_keys=True))
        ckpt.mark_latest(self.run_dir, target)
        for old in (self.run_dir / "checkpoints").glob("step_*"):
            if old != target:
                shutil.rmtree(old, ignore_errors=True)
        log.info("checkpoint after step %d at %s", step, target)
        return target

    def close(self) -> None:
        self.metrics.close()
        self.log.close()
        self.progress.close()
