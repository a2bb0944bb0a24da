"""Running gpu-evidence's commands against a clock, and its output folder (gpuevidence.py's plan).

Owns: `Clock` (each item's deadline: a cumulative share of the budget), `run` (a command in its own
process group, its output in the item's log, the whole group killed at the deadline), `Evidence`
(the output folder: evidence.json and evidence.md rewritten after every item, each log's tail
copied in, at most LOG_CAP bytes), and reading a run directory's progress while it runs
(`logged_steps`, `last_step`, `summary`, `worker`).

Assumes: Linux (/proc, process groups); run directories follow the run-directory contract.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOG_CAP = 15 << 20  # bytes kept of each log in OUT (the tail): under the 16 MiB a returned file may have


@dataclass
class Clock:
    """The plan's deadlines: an item may run until its cumulative share of the budget."""

    budget_s: float
    shares: Mapping[str, float]  # item -> the share of the budget it must end by (cumulative)
    t0: float = field(default_factory=time.monotonic)

    def left(self, item: str) -> float:
        return self.t0 + self.shares[item] * self.budget_s - time.monotonic()

    def spent(self) -> float:
        return time.monotonic() - self.t0


@dataclass
class Evidence:
    """The output folder and the figures gathered so far (written after every item)."""

    out: Path
    work: Path
    dry: bool
    render: Callable[[dict[str, Any]], str]  # evidence.md from the figures
    figures: dict[str, Any] = field(default_factory=dict)

    def log(self, item: str) -> Path:
        return self.work / f"{item}.log"

    def say(self, item: str, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {item}: {text}"
        print(line, flush=True)
        with self.log(item).open("a") as f:
            f.write(line + "\n")

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "evidence.json").write_text(json.dumps(self.figures, indent=1, sort_keys=True, default=str) + "\n")
        (self.out / "evidence.md").write_text(self.render(self.figures))
        for log in sorted(self.work.glob("?-*.log")):
            copy_tail(log, self.out / log.name)


def copy_tail(src: Path, dst: Path, cap: int = LOG_CAP) -> None:
    size = src.stat().st_size
    with src.open("rb") as r, dst.open("wb") as w:
        if size > cap:
            r.seek(size - cap)
            w.write(f"[... {size - cap} earlier bytes left out ...]\n".encode())
        shutil.copyfileobj(r, w)


@dataclass
class Ran:
    code: int | None  # None: killed at the deadline
    seconds: float


def run(
    ev: Evidence,
    item: str,
    argv: Sequence[str],
    timeout_s: float,
    env: dict[str, str],
    poll: Callable[[subprocess.Popen], None] | None = None,
    stdout: Path | None = None,
) -> Ran:
    """argv in its own process group, its output appended to the item's log (stdout to `stdout`
    instead, when given); killed (the whole group) at timeout_s. `poll(proc)` is called every
    0.2 s while it runs."""
    ev.say(item, "$ " + " ".join(argv))
    t0 = time.monotonic()
    if timeout_s <= 0:
        ev.say(item, "not started: no time left")
        return Ran(None, 0.0)
    with ev.log(item).open("ab") as log, (stdout or Path(os.devnull)).open("wb") as out:
        proc = subprocess.Popen(
            list(argv),
            stdout=out if stdout else log,
            stderr=log if stdout else subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout_s:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    ev.say(item, f"killed at the deadline after {time.monotonic() - t0:.0f} s")
                    return Ran(None, time.monotonic() - t0)
                if poll is not None:
                    poll(proc)
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    ran = Ran(proc.returncode, time.monotonic() - t0)
    ev.say(item, f"exit {ran.code} after {ran.seconds:.1f} s")
    return ran


def logged_steps(run_dir: Path) -> int:
    """Whole steps in a run directory's message log (0 before it exists or while unreadable)."""
    from seedflood.rundir.logfile import LogReader

    try:
        return len(LogReader(run_dir / "log.bin").read()[1])
    except Exception:  # the log is being written: its header may not be there yet
        return 0


def last_step(run_dir: Path) -> int | None:
    """The latest step a run directory shows: its log's, else its metrics' (a cut run's progress)."""
    steps = logged_steps(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text(errors="replace").splitlines():
            try:
                steps = max(steps, int(json.loads(line).get("step", 0)))
            except (ValueError, AttributeError):
                continue
    return steps or None


def summary(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def worker(store: str, rank: int) -> int | None:
    """Pid of the `seedflood train` worker (not its torchrun agent) of rank in the run on store."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"train" in cmd and b"torch.distributed.run" not in cmd and f"SEEDFLOOD_STORE={store}".encode() in env:
            if f"SEEDFLOOD_RANK={rank}".encode() in env:
                return int(d.name)
    return None
