"""Experiment trackers beside TensorBoard: which exist, the preflight, and opening them for a run.

Owns: `TRACKERS` (eval.trackers names -> the adapter module and the package it needs), the
`Tracker` interface every adapter implements (one module per outside system: mlflowtracker.py,
trackiotracker.py, wandbtracker.py), `missing` and `check_installed` (the preflight: a tracker
whose package is not installed is one line, `TrackerError`), `open_trackers` (one open tracker
per name, each given the run's settings) and `STORE` (where their local stores lie by default:
`<run dir>/trackers/`).

What a tracker receives, through `metrics.MetricsWriter`: the run's settings once (the config as
flat "section.key" pairs), each metrics record's scalars against its step (the TensorBoard
scalars, under the same tags), a churn run's health scalars (`health/...`, never in
metrics.jsonl), and the final state hash (`param_hash`) as a summary. metrics.jsonl stays the
record of the run: a tracker adds nothing to it.

A tracker that fails while the run goes on is one warning and is closed; training never stops for
it. A resumed evaluator continues the same tracker run (the id kept in `<run dir>/trackers/`);
the steps it takes again are logged again (the tracker keeps both points).

May import: rundir.layout; each adapter imports its package only when opened.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

STORE = "trackers"
"""The folder of a run directory that holds the trackers' local stores and run ids."""


class TrackerError(ValueError):
    """A tracker named in eval.trackers cannot be used here (unknown, or its package missing): one line."""


@dataclass(frozen=True)
class Kind:
    module: str  # the adapter, in seedflood.rundir
    package: str  # the import name it needs
    extra: str  # pip install "seedflood[EXTRA]"


TRACKERS: dict[str, Kind] = {
    "mlflow": Kind("seedflood.rundir.mlflowtracker", "mlflow", "mlflow"),
    "trackio": Kind("seedflood.rundir.trackiotracker", "trackio", "trackio"),
    "wandb": Kind("seedflood.rundir.wandbtracker", "wandb", "wandb"),
}
"""Every tracker eval.trackers may name (TensorBoard is always written: metrics.py)."""


class Tracker(Protocol):
    """One open run of one tracker."""

    name: str

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """Scalars at `step` (tags as TensorBoard's)."""

    def summary(self, values: Mapping[str, str]) -> None:
        """Values of the whole run (the final `param_hash`)."""

    def close(self) -> None:
        """Finish the tracker run and flush its store."""


def missing(names: Sequence[str]) -> list[str]:
    """One line per name that is not a tracker or whose package is not installed."""
    out = []
    for name in names:
        kind = TRACKERS.get(name)
        if kind is None:
            out.append(f"eval.trackers: unknown tracker {name!r} (known: {', '.join(TRACKERS)})")
        elif importlib.util.find_spec(kind.package) is None:
            out.append(f"eval.trackers: {name} needs the {kind.package} package: pip install 'seedflood[{kind.extra}]'")
    return out


def check_installed(names: Sequence[str]) -> None:
    """The preflight (`seedflood world-size`, train, simulate): TrackerError, one line, for the
    first tracker that cannot be used."""
    problems = missing(names)
    if problems:
        raise TrackerError(problems[0])


def settings_of(recorded: Mapping[str, Any]) -> dict[str, str]:
    """The config as flat "section.key" -> text (what every tracker takes as its parameters):
    a string as it is, anything else as JSON."""
    out: dict[str, str] = {}
    for section, values in recorded.items():
        items = values.items() if isinstance(values, Mapping) else [("", values)]
        for key, value in items:
            name = f"{section}.{key}" if key else str(section)
            out[name] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return out


def run_id_file(root: Path, name: str) -> Path:
    """Where tracker `name` keeps the id of this run directory's tracker run (for a resume)."""
    return root / STORE / f"{name}.id"


def read_run_id(root: Path, name: str) -> str | None:
    path = run_id_file(root, name)
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


def write_run_id(root: Path, name: str, run_id: str) -> None:
    path = run_id_file(root, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_id + "\n")


def open_trackers(names: Sequence[str], root: Path, recorded: Mapping[str, Any], resume: bool) -> list[Tracker]:
    """One open tracker per name, each given the run's settings; `resume`: continue the tracker
    run this run directory recorded (a new one when it recorded none). A tracker that cannot
    open is one warning and left out (metrics.jsonl and TensorBoard are written as always)."""
    out: list[Tracker] = []
    settings = settings_of(recorded)
    for name in names:
        kind = TRACKERS.get(name)
        if kind is None:
            log.warning("eval.trackers: unknown tracker %r: left out", name)
            continue
        try:
            module = importlib.import_module(kind.module)
            out.append(module.open_run(root, settings, resume))
        except Exception as e:  # noqa: BLE001 - any failure of an outside library: the run goes on without it
            log.warning("tracker %s left out: %s", name, (str(e).splitlines() or [type(e).__name__])[0])
    return out
