"""Run directories: their layout, and the one error every reader of one raises.

The layout of a run directory:
  config.yaml                       the run's config (written once, atomically)
  log.bin                           append-only message log, one record per complete step
                                    (logheader.py, logrecords.py, logfile.py)
  metrics.jsonl                     evaluator metrics (see metrics.py)
  checkpoints/step_000050/          state.pt (trainable tensors + direction state), meta.json
                                    (step, hashes, "state_sha256" of state.pt), log.bin (the log
                                    prefix), hf/ (save_pretrained model + tokenizer); checkpoints.py
  checkpoints/LATEST                name of the newest complete checkpoint (atomic pointer)
  summary.json                      final figures and hashes

The log is the source of truth: a run is a pure function of base weights + settings + log.

Assumes: one writer per run directory (the evaluator); readers may run at any time. Every file
or directory readers may see is written by atomic.py (temp-then-rename, fsynced).
"""

from __future__ import annotations

from pathlib import Path


class CheckpointError(ValueError):
    """A run directory, log or checkpoint is missing or malformed (one line, names the file)."""


def find_run_dir(path: str | Path) -> Path:
    p = Path(path)
    if not (p / "log.bin").is_file():
        raise CheckpointError(f"{p} is not a run directory (no log.bin)")
    return p
