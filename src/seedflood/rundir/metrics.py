"""What a run reports: logging with the rank in every line, metrics as JSON lines, progress.

Owns: the per-process logging setup, the `metrics.jsonl` writer (one flushed JSON object per
line, so a crash loses at most the line being written: a score, or an event such as a committed
roster change, `MEMBERSHIP`), its optional TensorBoard sink (the same
records' scalars as event files in `<run dir>/tb`, written synchronously with tensorboardX), the
experiment trackers it hands the same scalars to (trackers.py: MLflow, Trackio, W&B offline),
a churn run's health scalars for those sinks only (`MetricsWriter.health`),
`truncate_metrics` (cut the file back to one history when a run resumes from an earlier step),
the evaluator's progress bar over steps, and `PhaseProgress` for a counted phase inside it
(scoring's examples).

metrics.jsonl is the record of a run and does not depend on the sink: with or without it, the
same records give the same bytes (the sinks add nothing to a line), so SeedFlood's metrics stay
byte-comparable between runs. The event files are a view for `tensorboard --logdir`; a churn
run's health (`HEALTH`: timing, so different in every run) goes to the sinks only.

Assumes: library code logs through `logging.getLogger(__name__)`; only the CLI prints.
tensorboardX is imported only when a sink is opened; without it the sink is skipped with one
warning and metrics.jsonl is written as always.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from seedflood.rundir.atomic import atomic_write_text  # stdlib-only at import time (no torch)
from seedflood.rundir.layout import TENSORBOARD
from seedflood.rundir.trackers import Tracker

log = logging.getLogger(__name__)

TENSORBOARD_DIR = TENSORBOARD
"""Event files go to <run dir>/tb (`tensorboard --logdir <run dir or a parent>`; RunDir.tensorboard)."""

TENSORBOARD_SCALARS = (
    "accuracy",
    "loss",
    "auc",
    "threshold_accuracy",
    "consensus_distance",
    "worst_accuracy",
    "bytes_per_edge",
    "members",
    "joins",
    "leaves",
)
"""Fields of a metrics record that become TensorBoard scalars, against its `step` (the tag is the
field's name, or its `TENSORBOARD_TAGS` entry)."""

TENSORBOARD_TAGS = {"members": "roster/members", "joins": "roster/joins", "leaves": "roster/leaves"}
"""The roster's fields under one TensorBoard section."""

MEMBERSHIP = "membership"
"""The `event` of a metrics line that records a committed roster change, not a score (the
evaluator's `membership_record`: step, members, joins, leaves, change); a line without `event`
is a score."""

HEALTH = "health/"
"""The tag prefix of a churn run's health scalars (rundir/health.py): TensorBoard and the trackers
only, never metrics.jsonl."""

_EVENTS_PREFIX = "events.out.tfevents."


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


def _scalar(value: Any) -> float | None:
    """A finite int/float as float; None for anything TensorBoard should not plot (bool, None, NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _step(record: dict[str, Any]) -> int | None:
    step = record.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None


class TensorBoardSink:
    """The `TENSORBOARD_SCALARS` of metrics records as TensorBoard event files in `log_dir`.

    One event per record (its scalars as one Summary, x = the record's `step`), written and
    flushed synchronously: tensorboardX's `EventsWriter` (no `SummaryWriter`, whose background
    thread and multiprocessing queue would leave the last records unwritten at a crash and add a
    thread to every evaluator). Each sink writes a new file; the files of one directory sort in
    the order they were written (timestamp, then a sequence number: two sinks opened in the same
    second would otherwise get the same name and the second would overwrite the first).

    `purge_step` (a resume): a SessionLog START at that step first, so TensorBoard hides the
    events of the earlier files at steps >= it, as `truncate_metrics` drops those lines.
    """

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.proto.summary_pb2 import Summary

        self._event, self._summary = Event, Summary
        log_dir.mkdir(parents=True, exist_ok=True)
        seq = len(event_files(log_dir))
        self._w = EventsWriter(str(log_dir / "events"), f".{seq:06d}")  # writes the file_version event
        if purge_step is not None:
            self._w.write_event(
                Event(wall_time=time.time(), step=purge_step, session_log=SessionLog(status=SessionLog.START))
            )
        self._w.flush()

    def write(self, record: dict[str, Any], wall_time: float | None = None) -> bool:
        """Write the record's scalars; False (nothing written) when it has no step or no scalar."""
        step = _step(record)
        tags = scalars_of(record)
        if step is None or not tags:
            return False
        return self.scalars(step, tags, wall_time)

    def scalars(self, step: int, tags: dict[str, float], wall_time: float | None = None) -> bool:
        """Write `tags` (tag -> value) as one event at `step`; False when there is none."""
        if not tags:
            return False
        summary = self._summary(value=[self._summary.Value(tag=t, simple_value=v) for t, v in tags.items()])
        t = time.time() if wall_time is None else wall_time
        self._w.write_event(self._event(wall_time=t, step=step, summary=summary))
        self._w.flush()
        return True

    def close(self) -> None:
        self._w.close()


def scalars_of(record: dict[str, Any]) -> dict[str, float]:
    """The `TENSORBOARD_SCALARS` of a metrics record, by their tags (what every sink plots)."""
    return {TENSORBOARD_TAGS.get(k, k): v for k in TENSORBOARD_SCALARS if (v := _scalar(record.get(k))) is not None}


def event_files(log_dir: Path) -> list[Path]:
    """The TensorBoard event files in `log_dir`, in the order TensorBoard reads them (by name)."""
    if not log_dir.is_dir():
        return []
    return sorted(p for p in log_dir.iterdir() if p.name.startswith(_EVENTS_PREFIX) and p.is_file())


def open_tensorboard(log_dir: Path, purge_step: int | None = None) -> TensorBoardSink | None:
    """A sink at `log_dir`, or None (one warning) when tensorboardX is not installed."""
    try:
        return TensorBoardSink(log_dir, purge_step)
    except ImportError as e:
        log.warning("no TensorBoard events in %s: %s (pip install tensorboardX)", log_dir, e)
        return None


class MetricsWriter:
    """Appends one JSON object per line to `path`, flushed after each line.

    `tensorboard` (a directory, by convention `<run dir>/tb`): also write each record's scalars
    there (`TensorBoardSink`). When that directory already holds event files (a resume), the
    sink purges the steps after the last line left in `path`, so TensorBoard shows the same one
    history as metrics.jsonl after `truncate_metrics`. `trackers` (trackers.open_trackers): each
    also gets each record's scalars, and the final state hash (`param_hash`) as a summary; one
    that fails is one warning and closed, the run goes on.
    """

    def __init__(self, path: Path, tensorboard: Path | None = None, trackers: Sequence[Tracker] = ()) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.tensorboard: TensorBoardSink | None = None
        if tensorboard is not None:
            purge = None
            if event_files(tensorboard):
                steps = [s for r in read_metrics(path) if isinstance(r, dict) and (s := _step(r)) is not None]
                purge = steps[-1] + 1 if steps else 0
            self.tensorboard = open_tensorboard(tensorboard, purge)
        self.trackers: list[Tracker] = list(trackers)
        self._f: TextIO = open(path, "a")

    def write(self, record: dict[str, Any]) -> None:
        clean = _clean(record)
        self._f.write(json.dumps(clean, sort_keys=True) + "\n")
        self._f.flush()
        if self.tensorboard is not None:
            self.tensorboard.write(clean)
        step, tags = _step(clean), scalars_of(clean)
        if step is not None and tags:
            self._each(lambda t: t.log(step, tags))
        if isinstance(h := clean.get("param_hash"), str):
            self._each(lambda t: t.summary({"param_hash": h}))

    def health(self, step: int, scalars: Mapping[str, float]) -> None:
        """A churn run's health at `step` (tags under `HEALTH`), to TensorBoard and the trackers
        only: timing, so it stays out of metrics.jsonl."""
        tags = {f"{HEALTH}{k}": v for k, raw in scalars.items() if (v := _scalar(raw)) is not None}
        if not tags or step < 0:
            return
        if self.tensorboard is not None:
            self.tensorboard.scalars(step, tags)
        self._each(lambda t: t.log(step, tags))

    def _each(self, call: Callable[[Tracker], None]) -> None:
        for t in list(self.trackers):
            try:
                call(t)
            except Exception as e:  # noqa: BLE001 - an outside library's failure: warn, drop it, train on
                log.warning("tracker %s left out: %s", t.name, (str(e).splitlines() or [type(e).__name__])[0])
                self.trackers.remove(t)
                with contextlib.suppress(Exception):
                    t.close()

    def close(self) -> None:
        self._f.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        self._each(lambda t: t.close())
        self.trackers = []


def export_tensorboard(records: Iterable[dict[str, Any]], log_dir: Path) -> int:
    """Write `records` (e.g. a finished run's metrics.jsonl) as event files in `log_dir`; returns
    the number of events written (0, and no directory, when tensorboardX is missing)."""
    sink = open_tensorboard(log_dir)
    if sink is None:
        return 0
    try:
        return sum(sink.write(r) for r in records if isinstance(r, dict))
    finally:
        sink.close()


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


def truncate_metrics(path: Path, upto_step: int, events_before: int | None = None) -> None:
    """Atomically rewrite `path` keeping only whole lines whose "step" is <= `upto_step`; an
    event line (one with an "event", e.g. MEMBERSHIP) only when its step is < `events_before`
    (default: <= `upto_step` as any line): a resumed evaluator writes again the events of the
    steps it takes again, and the score lines by their own rule.

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
        if not isinstance(step, int) or isinstance(step, bool) or step > upto_step:
            continue
        if events_before is not None and "event" in record and step >= events_before:
            continue
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


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


PHASE_LINE_EVERY_S = 15.0
"""Seconds between two progress lines of a phase when stderr is not a terminal (read at each
PhaseProgress's start, so tests can lower it)."""


class PhaseProgress:
    """Progress through one counted phase (scoring: examples of dev and test) on stderr.

    On a terminal: a tqdm bar, shown once the phase has taken `delay_s` (short phases stay
    silent) and removed when it ends; beside an open `Progress` bar it takes the next line. Not
    on a terminal (a log file, a pipe, a launcher's capture): one plain line at most every
    `every_s` seconds (default PHASE_LINE_EVERY_S), the first after `every_s`, and a closing
    line when any was printed, so a long phase is visibly alive and a log stays one line per
    event. `update(done, total)` is the `on_examples` callback of `Workload.scores` and
    `score_splits`; use as a context manager.
    """

    def __init__(
        self,
        desc: str,
        unit: str = "example",
        enabled: bool = True,
        stream: TextIO | None = None,
        every_s: float | None = None,
        delay_s: float = 2.0,
        clock: Any = time.monotonic,
    ) -> None:
        self.desc, self.unit, self.enabled = desc, unit, enabled
        self.stream = sys.stderr if stream is None else stream
        self.tty = _isatty(self.stream)
        self.every_s = PHASE_LINE_EVERY_S if every_s is None else every_s
        self.delay_s, self.clock = delay_s, clock
        self.t0 = self.last = clock()
        self.done = self.total = 0
        self.lines = 0
        """Plain lines printed (non-terminal mode)."""
        self.bar: Any = None

    def update(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        self.done, self.total = done, total
        if self.tty:
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(
                    total=total,
                    desc=self.desc,
                    unit=self.unit,
                    leave=False,
                    delay=self.delay_s,
                    dynamic_ncols=True,
                    file=self.stream,
                )
            self.bar.update(done - self.bar.n)
            return
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            self._line(now)

    def _line(self, now: float, closing: bool = False) -> None:
        elapsed = now - self.t0
        if closing:
            state = "done" if self.done >= self.total else "stopped"
            text = f"{self.desc}: {state}, {self.done}/{self.total} {self.unit}s in {elapsed:.0f} s"
        else:
            share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
            left = ""
            if 0 < self.done < self.total:
                left = f", about {elapsed * (self.total - self.done) / self.done:.0f} s left"
            text = f"{self.desc}: {self.done}/{self.total} {self.unit}s{share}, {elapsed:.0f} s{left}"
        self.lines += 1
        from tqdm import tqdm

        tqdm.write(text, file=self.stream)  # clears an open `Progress` bar's line first, redraws it after
        self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.lines and self.enabled:
            self._line(self.clock(), closing=True)
            self.lines = 0

    def __enter__(self) -> PhaseProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
