"""The Weights & Biases tracker (eval.trackers: wandb), offline, through wandb's own SDK (`pip install 'seedflood[wandb]'`).

Owns `WandbRun` and `open_run`: one W&B run per run directory, in the project "seedflood",
named after the run directory, in offline mode (no account, no network: `wandb sync <its
folder>` uploads it later); the run's settings as its config, each metrics record's scalars as
history at their step, the final state hash in its summary (`param_hash`).

Where: WANDB_DIR when set, else `<run dir>/trackers` (W&B writes `wandb/offline-run-*/`
there; `wandb leet inspect` reads one). WANDB_MODE, when set, chooses the mode instead.

Assumes: wandb >= 0.19 (its wandb-core service ships in the wheel); imported only here, when a run
opens. Console capture, system stats and metadata collection are off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from seedflood.rundir.trackers import STORE, read_run_id, write_run_id

NAME = "wandb"
PROJECT = "seedflood"


def store_dir(root: Path) -> Path:
    """The folder W&B writes `wandb/` into for a run in `root` (WANDB_DIR wins)."""
    return Path(os.environ.get("WANDB_DIR") or (root / STORE).resolve())


class WandbRun:
    name = NAME

    def __init__(self, run: Any) -> None:
        self._run = run

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def summary(self, values: Mapping[str, str]) -> None:
        for k, v in values.items():
            self._run.summary[k] = v

    def close(self) -> None:
        self._run.finish()


def open_run(root: Path, settings: Mapping[str, str], resume: bool) -> WandbRun:
    import wandb

    where = store_dir(root)
    where.mkdir(parents=True, exist_ok=True)
    run_id = read_run_id(root, NAME) if resume else None
    run = wandb.init(
        mode=os.environ.get("WANDB_MODE") or "offline",
        dir=str(where),
        project=PROJECT,
        name=root.resolve().name,
        id=run_id,
        resume="allow" if run_id else None,
        config=dict(settings),
        settings=wandb.Settings(console="off", x_disable_stats=True, x_disable_meta=True, silent=True),
    )
    write_run_id(root, NAME, run.id)
    return WandbRun(run)
