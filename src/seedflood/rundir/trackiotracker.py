"""The Trackio tracker (eval.trackers: trackio), through trackio's own API (`pip install 'seedflood[trackio]'`).

Owns `TrackioRun` and `open_run`: one Trackio run per run directory, in the project "seedflood",
named after the run directory; the run's settings as its config, each metrics record's scalars
logged at their step, the final state hash logged as `param_hash` at the final step (Trackio
has no run summary).

Where: Trackio's local SQLite store in TRACKIO_DIR when set, else `<run dir>/trackers/trackio`
(`TRACKIO_DIR=<that folder> trackio show --project seedflood`). Trackio reads TRACKIO_DIR once,
when it is first imported: a process that imported it before keeps the folder it read then.
Nothing is sent anywhere (no space, no server); its CPU and GPU sampling is off.

Assumes: trackio >= 0.40; imported only here, when a run opens. Trackio prints its banner on
stdout: it is sent to the log (stderr), as everything a role says.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from seedflood.rundir.trackers import STORE

log = logging.getLogger(__name__)

NAME = "trackio"
PROJECT = "seedflood"


def store_dir(root: Path) -> Path:
    """The folder Trackio keeps its store in for a run in `root` (TRACKIO_DIR wins)."""
    return Path(os.environ.get("TRACKIO_DIR") or (root / STORE / "trackio").resolve())


@contextlib.contextmanager
def _quiet() -> Any:
    """Trackio's banner lines go to the log instead of stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        yield
    for line in out.getvalue().splitlines():
        if line.strip():
            log.info("trackio: %s", line.strip())


class TrackioRun:
    name = NAME

    def __init__(self, run: Any) -> None:
        self._run = run
        self._step = 0

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self._step = max(self._step, step)
        self._run.log(dict(scalars), step=step)

    def summary(self, values: Mapping[str, str]) -> None:
        self._run.log(dict(values), step=self._step)

    def close(self) -> None:
        import trackio

        with _quiet():
            if trackio.context_vars.current_run.get() is self._run:
                trackio.finish()  # also forgets it: trackio's exit handler would finish it again, on stdout
            else:
                self._run.finish()


def open_run(root: Path, settings: Mapping[str, str], resume: bool) -> TrackioRun:
    os.environ.setdefault("TRACKIO_DIR", str(store_dir(root)))
    with _quiet():
        import trackio

        run = trackio.init(
            project=PROJECT,
            name=root.resolve().name,
            config=dict(settings),  # again on a resume: Trackio replaces a resumed run's config
            resume="allow" if resume else "never",
            embed=False,
            auto_log_cpu=False,
            auto_log_gpu=False,
        )
    return TrackioRun(run)
