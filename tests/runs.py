"""The tiny launched run every dist and e2e test starts from, and the checks they share.

Owns: the debug config (tiny random model, synthetic task, 4 clients on a ring + evaluator), the
`seedflood train` command line, the churn settings list, the run's own step counter as a progress
key, `seedflood replay` of a run directory and a private copy of one (`copy_run_dir`). One place: a test adds only what it changes.

Assumes: the debug config's step records in log.bin are at least RECORD_BYTES long.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import procs

DEBUG = procs.REPO / "launch" / "configs" / "debug.yaml"
RECORD_BYTES = 30  # a step record of the debug run in log.bin is at least this (about 43 B)


def train(*overrides: str, config: Path = DEBUG, module: str = "seedflood") -> list[str]:
    """`python -m seedflood train --config DEBUG --set ...` for `overrides` (later ones win)."""
    return [sys.executable, "-m", module, "train", "--config", str(config), *procs.sets(*overrides)]


def churn(out: Path, steps: int, *extra: str) -> tuple[str, ...]:
    """A churn run's settings: settle 1, a 3 s hop timeout (a failure is noticed fast), no scoring
    or checkpoints unless `extra` asks (later settings win)."""
    base = (f"run.out_dir={out}", f"run.steps={steps}", "churn.settle=1", "transport.timeout_s=3")
    return (*base, "eval.every=0", "checkpoint.every=0", *extra)


def copy_run_dir(run_dir: Path, to: Path) -> Path:
    """A private copy of a finished run directory at `to`, its config.yaml pointing at the copy
    (for tests that cut or corrupt it)."""
    shutil.copytree(run_dir, to)
    cfg_path = to / "config.yaml"
    cfg_path.write_text(cfg_path.read_text().replace(str(run_dir), str(to)))
    return to


def log_size(out: Path) -> int:
    """The run's own step counter as a progress key: log.bin's size (-1 before it exists)."""
    return procs.size(Path(out) / "log.bin")


class Steps:
    """Steps logged since the log was first seen (its header alone, written at the start):
    `Steps(out)() >= n` holds once about n more steps are in log.bin. `node`: client N's own
    copy (clients/node-N/log.bin, churn runs), which grows with that client's steps: the
    trigger for a fault aimed at it, since the evaluator's log may lag the clients by many
    steps under load (it scores step 0 first) and a fault keyed to it can land after the end."""

    def __init__(self, out: Path, record_bytes: int = RECORD_BYTES, node: int | None = None) -> None:
        self.log = Path(out) / "log.bin" if node is None else Path(out) / "clients" / f"node-{node}" / "log.bin"
        self.record = record_bytes
        self.header = -1

    def __call__(self) -> int:
        now = procs.size(self.log)
        if now < 0:
            return -1
        if self.header < 0:
            self.header = now
        return (now - self.header) // self.record


def wait_for_steps(group: procs.Procs, out: Path, n: int, alive: list[str] | None = None, **kw: Any) -> None:
    """Until log.bin holds about n more steps than when first seen; every process in `alive`
    (all by default) must still run. Progress is the log's growth (and the outputs')."""
    steps = Steps(out)
    group.watch(steps.log)
    group.wait_for(
        lambda: steps() >= n, f"{n} steps in {steps.log}", alive=group.procs if alive is None else alive, **kw
    )


def replay(run_dir: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """What `seedflood replay RUN_DIR --json` prints last ({"steps", "param_hash"}); it must exit 0."""
    # a generous outer bound: replay of a few hundred tiny steps takes seconds
    r = procs.run([sys.executable, "-m", "seedflood", "replay", str(run_dir), "--json"], env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def summary(out: Path) -> dict[str, Any]:
    path = Path(out) / "summary.json"
    assert path.is_file(), f"no summary.json in {out}: {sorted(p.name for p in Path(out).glob('*'))}"
    return json.loads(path.read_text())


def check_churn_run(out: Path, steps: int, context: str = "", clients: int = 4) -> dict[str, Any]:
    """A churn run that ended with every client a member: nobody left, every client on the
    evaluator's hash, and the log replays to it; returns summary.json."""
    s = summary(out)
    assert s["left"] == [] and s["consensus"], f"{s}\n{context}"
    assert s["client_hashes"] == [s["param_hash"]] * clients, context
    assert replay(out) == {"steps": steps, "param_hash": s["param_hash"]}, context
    return s
