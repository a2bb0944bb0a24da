"""Run directories: their layout, the one value that names their paths, and the one error every
reader of one raises.

The layout of a run directory:
  config.yaml                       the run's config (written once, atomically)
  log.bin                           append-only message log, one record per complete step
                                    (logheader.py, logrecords.py, logfile.py)
  metrics.jsonl                     evaluator metrics (see metrics.py)
  tb/                               the same metrics as TensorBoard event files (metrics.py)
  trackers/                         eval.trackers' local stores (mlruns/, trackio/, wandb/) and
                                    run ids (trackers.py)
  checkpoints/step_000050/          state.pt (trainable tensors + direction state), meta.json
                                    (step, hashes, "state_sha256" of state.pt), log.bin (the log
                                    prefix), hf/ (save_pretrained model + tokenizer); checkpoints.py
  checkpoints/LATEST                name of the newest complete checkpoint (atomic pointer)
  summary.json                      final figures and hashes (summary.py)
  build.json                        the build (versions, CPU capability, threads) that computes
                                    the run's scalars (build.py)
  clients/node-N/                   a churn client's own log (eval.client_logs; clientlog.py)
  status/node-N.json, evaluator.json   each process's live status record, rewritten about once a
                                    second while it runs, then its final state (status.py;
                                    read by `seedflood status`)

Owns `RunDir`: those paths as one frozen value, built once (`RunDir.of(cfg)` for a run,
`RunDir.at(path)` for a directory a command reads) and handed to whoever reads or writes there.
May import: seedflood.core (the config, for its type only). Nothing else of rundir.

Assumes: one writer per run directory (the evaluator; each process writes only its own status
record); readers may run at any time. Every file
or directory readers may see is written by atomic.py (temp-then-rename, fsynced). The log is the
source of truth: a run is a pure function of base weights + settings + log.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from seedflood.core.config.runconfig import Config

LOG = "log.bin"
CONFIG = "config.yaml"
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tb"  # `tensorboard --logdir <run dir or a parent>` finds the event files there
STATUS = "status"  # one live record per process (status.py)


class CheckpointError(ValueError):
    """A run directory, log or checkpoint is missing or malformed (one line, names the file)."""


def unwritable(path: Path) -> str | None:
    """Why this process could not create the directory `path` or write in it, in words; None
    when it can. Only the nearest part of `path` that exists is looked at: it must be a
    directory this process may write (a file there fails every mkdir below it)."""
    p = path.resolve()
    existing = next(a for a in (p, *p.parents) if a.exists())
    if not existing.is_dir():
        return f"{existing} is a file, not a directory" if existing.is_file() else f"{existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


@dataclass(frozen=True)
class RunDir:
    """Where one run's files lie. `clients`: where its clients keep their own logs
    (eval.client_logs, relative to `root` unless absolute); None: nowhere (off, or a directory
    only read back by replay, eval or check, which never look there)."""

    root: Path
    clients: Path | None = None

    @classmethod
    def of(cls, cfg: Config) -> RunDir:
        """The run directory `cfg` writes: run.out_dir, with its eval.client_logs."""
        root = Path(cfg.run.out_dir)
        if not cfg.eval.client_logs:
            return cls(root)
        clients = Path(cfg.eval.client_logs).expanduser()
        return cls(root, clients if clients.is_absolute() else root / clients)

    @classmethod
    def at(cls, path: str | Path) -> RunDir:
        """An existing run directory (replay, eval, check); CheckpointError when it has no log."""
        run = cls(Path(path))
        if not run.log.is_file():
            raise CheckpointError(f"{run.root} is not a run directory (no {LOG})")
        return run

    def check_writable(self) -> None:
        """CheckpointError (one line naming the key) unless the run directory, and its client
        logs' directory, can be created or written here: a run refuses it before it starts."""
        for key, path in (("run.out_dir", self.root), ("eval.client_logs", self.clients)):
            if path is not None and (why := unwritable(path)):
                raise CheckpointError(f"{key}: cannot write {path}: {why}")

    @classmethod
    def watched(cls, path: str | Path) -> RunDir:
        """A run directory `seedflood status` reads, live or done: one with status records, a log or
        a config (clients write their records before the evaluator's log exists); CheckpointError
        (one line) for anything else."""
        run = cls(Path(path))
        if not run.root.is_dir():
            raise CheckpointError(f"{run.root} is not a run directory (no such directory)")
        if not (run.status.is_dir() or run.log.is_file() or run.config.is_file()):
            raise CheckpointError(f"{run.root} is not a run directory (no {STATUS}/, {LOG} or {CONFIG})")
        return run

    @property
    def log(self) -> Path:
        return self.root / LOG

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD

    @property
    def status(self) -> Path:
        """Where each process keeps its live status record (status.py)."""
        return self.root / STATUS

    def client(self, node: int) -> Path | None:
        """Node `node`'s own log directory (None: client logs are off)."""
        return None if self.clients is None else self.clients / f"node-{node}"
