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

import argparse
import json
import subprocess
import sys
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


def measure(args: argparse.Namespace, slow: list[int], base: list[str], stride: str) -> list[dict[str, Any]]:
    """The equal, slow and slow + stride runs, with flood.overlap off and on, in that order."""
    f = args.forward_s
    paced = [f"run.step_delay_s={f}", "run.node_delay_s={" + ", ".join(f"{o}: {f * args.factor:g}" for o in slow) + "}"]
    figures: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="speeds-launched-") as tmp:
        for overlap in (False, True):
            extra = [f"flood.overlap={str(overlap).lower()}"]
            extra = ["eval.every=0", "checkpoint.every=0", *extra]  # the evaluator only logs: it keeps up
            runs = [
                ("equal", [*base, *extra, f"run.step_delay_s={f}"]),
                ("slow", [*base, *extra, *paced]),
                ("slow + stride", [*base, *extra, *paced, stride]),
            ]
            rows = []
            for i, (name, sets) in enumerate(runs):
                out = Path(tmp) / f"run-{int(overlap)}-{i}"
                row = {"run": name, "overlap": overlap, **one_launched(args.config, sets, out, args.timeout)}
                print(
                    f"  {name}, overlap {overlap}: {row['steps_per_s']:.3f} steps/s "
                    f"(start-up {row['startup_s']:.1f} s, {row['wall_s']:.1f} s in all)",
                    flush=True,
                )
                rows.append(row)
            if rows[0]["hash"] != rows[1]["hash"]:
                raise RuntimeError("a pace changed the bits")
            for row in rows:
                row["of_equal_rate"] = row["steps_per_s"] / rows[0]["steps_per_s"]
            figures += rows
    sys.stdout.flush()
    return figures
