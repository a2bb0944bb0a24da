"""Unequal speeds, launched (`python -m seedflood.bench.speeds --launched`): the same three runs
as the in-process figure (bench/speeds.py), each one real `launch/torchrun.sh` run.

One process per client plus the evaluator, gloo edges on loopback; each client's emulated device
is its sleep before each forward: run.step_delay_s = --forward-s for the equal clients,
run.node_delay_s = --factor × that for the --slow highest ids (roles/pace.py). The rate of a run
is the evaluator's: steps appended to its log.bin per second, from the first logged step to the
last (polled every 0.1 s), so the processes' start-up (a few seconds of CPU each) is not in it.
`slow` must end on `equal`'s hash (a pace never changes a bit), which is checked.

Assumes: run from the repository root (launch/torchrun.sh, --config relative to it); the debug
model, whose own forwards are short beside the emulated ones; strict mode unless --set says
otherwise.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from seedflood.rundir.logfile import LogReader

POLL_S = 0.1


def logged_steps(run_dir: Path) -> int:
    """Whole steps in the evaluator's log (0 before it exists or while its header is written)."""
    try:
        return len(LogReader(run_dir / "log.bin").read()[1])
    except Exception:  # being written: a torn header or record is read on the next poll
        return 0


def one_launched(config: Path, sets: list[str], out: Path, timeout_s: float) -> dict[str, Any]:
    """One launched run; its steps per second between the first and the last logged step."""
    argv = [
        "bash",
        "launch/torchrun.sh",
        str(config),
        *(x for s in [*sets, f"run.out_dir={out}"] for x in ("--set", s)),
    ]
    t0 = time.monotonic()
    seen: list[tuple[float, int]] = []  # (seconds since launch, steps logged), at each change
    with open(out.parent / f"{out.name}.log", "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            if time.monotonic() - t0 > timeout_s:
                proc.kill()
                raise RuntimeError(f"{out.name}: still running after {timeout_s:g} s (log: {log.name})")
            n = logged_steps(out)
            if n and (not seen or n > seen[-1][1]):
                seen.append((time.monotonic() - t0, n))
            time.sleep(POLL_S)
    if proc.returncode != 0:
        raise RuntimeError(f"{out.name}: exit status {proc.returncode} (log: {out.parent / out.name}.log)")
    n = logged_steps(out)
    if not seen or n > seen[-1][1]:
        seen.append((time.monotonic() - t0, n))
    (t1, n1), (t2, n2) = seen[0], seen[-1]
    summary = json.loads((out / "summary.json").read_text())
    return {
        "steps": n2,
        "startup_s": t1,
        "steps_per_s": (n2 - n1) / (t2 - t1) if t2 > t1 else 0.0,
        "wall_s": time.monotonic() - t0,
        "hash": summary.get("param_hash"),
    }


class Launcher:
    """`Run`s of bench/speeds.py as launched runs, each in a fresh run directory of a temporary
    folder (kept while the context is open). A client's pace becomes its run.node_delay_s (the
    lowest pace is every client's run.step_delay_s), and the evaluator only logs: no scoring or
    checkpoints, so it keeps up."""

    def __init__(self, config: Path, timeout_s: float) -> None:
        self.config, self.timeout_s = config, timeout_s
        self._tmp = tempfile.TemporaryDirectory(prefix="speeds-launched-")
        self._runs = 0

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self._tmp.cleanup()

    def __call__(self, sets: list[str], pace: dict[int, float]) -> dict[str, Any]:
        common = min(pace.values(), default=0.0)
        own = {node: s for node, s in pace.items() if s != common}
        paced = [f"run.step_delay_s={common:g}"]
        if own:
            paced.append("run.node_delay_s={" + ", ".join(f"{node}: {s:g}" for node, s in sorted(own.items())) + "}")
        self._runs += 1
        out = Path(self._tmp.name) / f"run-{self._runs}"
        return one_launched(self.config, [*sets, "eval.every=0", "checkpoint.every=0", *paced], out, self.timeout_s)
