"""What a run reports: logging with the rank in every line, metrics as JSON lines, progress.

Owns: the per-process logging setup, the `metrics.jsonl` writer (one flushed JSON object per
line, so a crash loses at most the line being written), and the evaluator's progress bar.

Assumes: library code logs through `logging.getLogger(__name__)`; only the CLI prints.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path
from typing import Any, TextIO


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


class Progress:
    """A tqdm bar over steps on stderr, showing the latest loss, accuracy and bytes."""

    def __init__(self, total: int, initial: int = 0, enabled: bool = True) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                        disable=not enabled, file=sys.stderr, desc="seedflood")
        self.fields: dict[str, str] = {}

    def update(self, steps: int = 1, **fields: Any) -> None:
        for k, v in fields.items():
            self.fields[k] = f"{v:.4g}" if isinstance(v, float) else str(v)
        self.bar.set_postfix(self.fields, refresh=False)
        self.bar.update(steps)

    def write(self, text: str) -> None:
        self.bar.write(text, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
