"""What a run reports: logging with the rank in every line, metrics as JSON lines, progress.

Owns: the per-process logging setup, the `metrics.jsonl` writer (one flushed JSON object per
line, so a crash loses at most the line being written), `truncate_metrics` (cut the file back to
one history when a run resumes from an earlier step), and the evaluator's progress bar.

Assumes: library code logs through `logging.getLogger(__name__)`; only the CLI prints.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

from seedflood.checkpoint import atomic_write_text  # stdlib-only at import time (no torch)


def setup_logging(level: str = "info", role: str = "") -> None:
    """Root logger to stderr; every line carries the role (e.g. 'eval' or 'client 3')."""
    prefix = f"[{role}] " if role else ""
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format=f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
        force=True,
    )
    for noisy in ("transformers", "datasets", "urllib3", "filelock", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null rather than invalid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class MetricsWriter:
    """Appends one JSON object per line to `path`, flushed after each line."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f: TextIO = open(path, "a")

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(_clean(record), sort_keys=True) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every whole line of a metrics file (a torn last line is skipped)."""
    out = []
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def truncate_metrics(path: Path, upto_step: int) -> None:
    """Atomically rewrite `path` keeping only whole lines whose "step" is <= `upto_step`.

    A whole line ends in a newline and parses to a JSON object with an integer "step"; anything
    else (a torn last line, a line without a step) is dropped. Kept lines are copied byte for
    byte. No-op when the file does not exist. Call it before a MetricsWriter opens the file: the
    rename replaces the file, and a writer already holding the old one would write into it.
    """
    if not path.is_file():
        return
    kept: list[str] = []
    for line in path.read_text().splitlines(keepends=True):
        if not line.endswith("\n"):
            continue  # torn by a crash mid-write
        try:
            record = json.loads(line)
        except ValueError:
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and step <= upto_step:
            kept.append(line)
    atomic_write_text(path, "".join(kept))


class Progress:
    """A tqdm bar over the clients' steps on stderr, with the evaluator's latest figures beside it.

    The count follows the clients (`advance_to`, called from the evaluator's receiver thread as
    complete steps arrive), not the evaluator's scoring, so rate and ETA describe training even
    while the evaluator lags behind. `show` sets the fields beside the bar (evaluated step,
    accuracy, loss, log size). Both may be called from different threads.
    """

    def __init__(self, total: int, initial: int = 0, enabled: bool = True) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=total,
            initial=initial,
            unit="step",
            dynamic_ncols=True,
            disable=not enabled,
            file=sys.stderr,
            desc="seedflood",
        )
        self.fields: dict[str, str] = {}
        self._lock = threading.Lock()

    def advance_to(self, n: int) -> None:
        """The clients have completed `n` steps (never moves backwards)."""
        with self._lock:
            if n > self.bar.n:
                self.bar.update(min(n, self.bar.total or n) - self.bar.n)

    def show(self, **fields: Any) -> None:
        with self._lock:
            for k, v in fields.items():
                self.fields[k] = f"{v:.4g}" if isinstance(v, float) else str(v)
            self.bar.set_postfix(self.fields, refresh=True)

    def write(self, text: str) -> None:
        with self._lock:
            self.bar.write(text, file=sys.stderr)

    def close(self) -> None:
        with self._lock:
            self.bar.close()


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
