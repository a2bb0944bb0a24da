"""Helpers for the e2e tests: which program the launchers start, ports, run checks, processes.

The launchers run `python -m $SEEDFLOOD_MODULE train ...`. The tests target the real
`seedflood` by default; SEEDFLOOD_E2E_ENTRY=probe swaps in tests/e2e/gloo_probe.py (a stand-in
that honours the same contract), which is how the infrastructure is checked without the runtime:
    SEEDFLOOD_E2E_ENTRY=probe .venv/bin/python -m pytest -q tests/e2e
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
E2E_DIR = Path(__file__).resolve().parent
DEBUG_CONFIG = REPO / "launch" / "configs" / "debug.yaml"
ENTRY = os.environ.get("SEEDFLOOD_E2E_ENTRY", "seedflood")
MODULE = "gloo_probe" if ENTRY == "probe" else "seedflood"
# Every e2e run: fail fast instead of hanging on a dead peer. Bits do not depend on this.
COMMON_SETS = ("transport.timeout_s=60",)


def launcher_env(**extra: str) -> dict[str, str]:
    """Environment for a launcher: this venv first on PATH, the entry module, quiet threads."""
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["PYTHON"] = sys.executable
    env["SEEDFLOOD_MODULE"] = MODULE
    env["HF_HUB_OFFLINE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    if MODULE == "gloo_probe":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(E2E_DIR), env.get("PYTHONPATH", "")) if p)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID"):
        env.pop(key, None)  # never inherit another launcher's world
    env.update(extra)
    return env


def entry_unavailable() -> str | None:
    """Why the entry module cannot run the e2e tests, or None when it can."""
    if MODULE == "gloo_probe":
        return None
    try:
        r = subprocess.run(
            [sys.executable, "-m", MODULE, "world-size", "--config", str(DEBUG_CONFIG)],
            capture_output=True,
            text=True,
            timeout=120,
            env=launcher_env(),
            cwd=REPO,
        )
    except subprocess.TimeoutExpired:
        return "`seedflood world-size` timed out"
    if r.returncode != 0 or r.stdout.strip() != "5":
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return (
            f"`python -m seedflood world-size` is not available yet ({tail}); "
            "SEEDFLOOD_E2E_ENTRY=probe runs these tests with the stand-in"
        )
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sets(*overrides: str) -> list[str]:
    """`--set` arguments for the common settings plus `overrides`."""
    out: list[str] = []
    for text in (*COMMON_SETS, *overrides):
        out += ["--set", text]
    return out


def churn_sets(out_dir: Path, steps: int, *overrides: str) -> list[str]:
    """`--set` arguments of a churn e2e run: settle 1, a 3 s hop timeout (a failure is noticed
    fast), no scoring or checkpoints unless `overrides` ask (later settings win)."""
    base = (f"run.out_dir={out_dir}", f"run.steps={steps}", "churn.settle=1", "transport.timeout_s=3")
    return [a for text in (*base, "eval.every=0", "checkpoint.every=0", *overrides) for a in ("--set", text)]


def replay(out_dir: Path) -> dict[str, Any]:
    """What `seedflood replay OUT` prints last ({"steps", "param_hash"}); it must exit 0."""
    r = subprocess.run(
        [sys.executable, "-m", "seedflood", "replay", str(out_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=launcher_env(),
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def check_churn_run(out_dir: Path, steps: int, context: str = "", clients: int = 4) -> dict[str, Any]:
    """A churn run that ended with every client a member: nobody left, every client on the
    evaluator's hash, and the log replays to it; returns summary.json."""
    summary = read_summary(out_dir)
    assert summary["left"] == [] and summary["consensus"], f"{summary}\n{context}"
    assert summary["client_hashes"] == [summary["param_hash"]] * clients, context
    assert replay(out_dir) == {"steps": steps, "param_hash": summary["param_hash"]}, context
    return summary


def read_summary(out_dir: Path) -> dict[str, Any]:
    path = Path(out_dir) / "summary.json"
    assert path.is_file(), f"no summary.json in {out_dir}: {sorted(p.name for p in Path(out_dir).glob('*'))}"
    return json.loads(path.read_text())


def final_metrics(out_dir: Path) -> dict[str, Any]:
    lines = [json.loads(x) for x in (Path(out_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    finals = [rec for rec in lines if rec.get("final") is True]
    assert finals, f"no final metrics line in {out_dir}/metrics.jsonl"
    return finals[-1]


def check_run(out_dir: Path, clients: int = 4) -> dict[str, Any]:
    """A finished run: every client's hash equals the evaluator's; returns summary.json."""
    summary = read_summary(out_dir)
    hashes = summary["client_hashes"]
    assert len(hashes) == clients, f"{len(hashes)} client hashes, expected {clients}"
    assert set(hashes) == {summary["param_hash"]}, f"clients disagree: {hashes} vs {summary['param_hash']}"
    final = final_metrics(out_dir)
    assert final.get("param_hash", summary["param_hash"]) == summary["param_hash"]
    ckpt = Path(out_dir) / "checkpoints"
    assert ckpt.is_dir() and any(ckpt.iterdir()), f"no checkpoint in {ckpt}"
    assert (Path(out_dir) / "log.bin").is_file()
    return summary


class Procs:
    """Processes started by a test, each in its own session; `close()` kills what is left."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: Sequence[str], *, env: Mapping[str, str], log: Path, cwd: Path = REPO) -> subprocess.Popen:
        f = open(log, "ab")
        p = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        f.close()
        self.procs.append(p)
        return p

    def wait_all(self, timeout: float) -> list[int]:
        """Wait for every process; the first failure or the deadline stops the rest."""
        deadline = time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in self.procs]
            if all(c is not None for c in codes):
                return [int(c) for c in codes]  # type: ignore[arg-type]
            if any(c not in (None, 0) for c in codes) or time.monotonic() > deadline:
                self.close()
                return [p.wait() for p in self.procs]
            time.sleep(0.1)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()


def tail(path: Path, n: int = 60) -> str:
    """The last n lines of a log, without gloo's connection-retry noise."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return f"(no {path})"
    return "\n".join([line for line in lines if "debug_logger" not in line][-n:])


def run_checked(argv: Sequence[str], *, env: Mapping[str, str], log: Path, timeout: float, cwd: Path = REPO) -> None:
    """Run to completion in its own session (killed whole on timeout); assert exit status 0."""
    procs = Procs()
    try:
        procs.start(argv, env=env, log=log, cwd=cwd)
        (code,) = procs.wait_all(timeout)
    finally:
        procs.close()
    assert code == 0, f"{' '.join(map(str, argv))} exited {code}:\n{tail(log)}"
