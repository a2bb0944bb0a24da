"""Churn in a launched run (docs/design.md §13): 1 evaluator + 4 clients as processes, one gloo
group per edge (links.py), `churn.settle: 1`. A client SIGKILLed or SIGSTOPped mid-run leaves the
others training to the end without a restart: they exit 0, every survivor holds the same bits
after every step and the evaluator's final hash, the log records the leave, and `seedflood
replay` of the log reproduces the hash.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from seedflood.checkpoint import LogReader

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]
DEBUG = str(ROOT / "launch" / "configs" / "debug.yaml")
TRAIN = [sys.executable, "-m", "seedflood", "train", "--config", DEBUG]
VICTIM = 2  # topology node (rank 3); the evaluator attaches to node 0


def churn_run(run_world, out: Path, signum: int, victim: int = VICTIM) -> tuple[list, dict]:
    sets = [
        f"run.out_dir={out}",
        "run.steps=40",
        "run.hash_steps=true",
        "churn.settle=1",
        "transport.timeout_s=3",
        "eval.every=0",
        "checkpoint.every=10",
    ]
    header: list[int] = []
    hit: list[bool] = []

    def strike(popens: list[subprocess.Popen]) -> None:
        if hit:
            others_done = all(p.poll() is not None for i, p in enumerate(popens) if i != victim + 1)
            if others_done and popens[victim + 1].poll() is None:
                os.kill(popens[victim + 1].pid, signal.SIGKILL)  # the stopped one: end it
            return
        log = out / "log.bin"
        if not log.is_file():
            return
        size = log.stat().st_size
        header[:] = header or [size]
        if size >= header[0] + 3 * 30:  # a few steps logged
            os.kill(popens[victim + 1].pid, signum)
            hit.append(True)

    procs = run_world(TRAIN + [a for o in sets for a in ("--set", o)], nprocs=5, timeout_s=240, on_poll=strike)
    assert hit, "the fault must land mid-run"
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    return procs, summary


def check_survivors(procs: list, s: dict, out: Path, victim: int) -> None:
    for i, p in enumerate(procs):
        if i != victim + 1:
            assert p.returncode == 0, p.describe()
    assert procs[victim + 1].returncode == -signal.SIGKILL
    assert s["left"] == [victim], s.get("membership_changes")
    assert s["client_hashes"][victim] is None
    survivors = [h for n, h in enumerate(s["client_hashes"]) if n != victim]
    assert survivors == [s["param_hash"]] * 3 and s["consensus"]
    steps = [hs for n, hs in enumerate(s["client_step_hashes"]) if n != victim]
    assert all(hs == steps[0] for hs in steps) and len(steps[0]) == 40
    reader = LogReader(out / "log.bin")
    _, records = reader.read()
    assert len(records) == 40
    ((step, change),) = reader.changes.items()
    assert change.leave == (victim,) and f"step {step}: leave {victim}" in s["membership_changes"][0]
    replay = subprocess.run(
        [sys.executable, "-m", "seedflood", "replay", str(out)], capture_output=True, text=True, timeout=120
    )
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout.strip().splitlines()[-1]) == {"steps": 40, "param_hash": s["param_hash"]}


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSTOP], ids=["kill", "stop"])
def test_survivors_of_a_crash_or_stall_finish_bit_identical(run_world, tmp_path, signum):
    out = tmp_path / signal.Signals(signum).name
    procs, s = churn_run(run_world, out, signum)
    check_survivors(procs, s, out, VICTIM)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSTOP], ids=["kill", "stop"])
def test_the_evaluator_follows_the_next_client_when_its_attach_client_fails(run_world, tmp_path, signum):
    """The evaluator's attach client (node 0) crashes or stalls mid-run: the clients decide its
    leave, node 1 becomes the attach node (`Roster.attach`) and answers the evaluator, which
    takes the steps it lacks from node 1's catch-up and follows it to the end (a stalled node 0's
    edge is closed under it). The run directory holds the whole run."""
    out = tmp_path / signal.Signals(signum).name
    procs, s = churn_run(run_world, out, signum, victim=0)
    check_survivors(procs, s, out, 0)
    assert "evaluator: following node 1" in procs[0].stderr, procs[0].describe()


class Launch:
    """5 processes of one churn run started by hand, so a test can restart one (same RANK)."""

    def __init__(self, tmp_path: Path, sets: list[str], env: dict[str, str] | None = None) -> None:
        from seedflood.runtime import free_port

        self.tmp = tmp_path
        self.argv = TRAIN + [a for o in sets for a in ("--set", o)]
        self.base = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": "5",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
            **(env or {}),
        }
        self.logs: list = []
        self.procs = [self.start(r) for r in range(5)]

    def start(self, rank: int) -> subprocess.Popen:
        f = open(self.tmp / f"{rank}.{len(self.logs)}.log", "w+")
        self.logs.append(f)
        env = {**self.base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        return subprocess.Popen(self.argv, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)

    def restart(self, rank: int) -> None:
        os.kill(self.procs[rank].pid, signal.SIGKILL)
        self.procs[rank].wait()
        time.sleep(1.0)
        self.procs[rank] = self.start(rank)

    def wait(self, deadline: float) -> str:
        """Wait for every process; returns their outputs (tails) for assertion messages."""
        try:
            for p in self.procs:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            for p in self.procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            text = ""
            for f in self.logs:
                f.seek(0)
                text += f"--- {f.name}\n{f.read()[-3000:]}\n"
                f.close()
        return text


def wait_for_steps(out: Path, n: int, procs: list, deadline: float) -> None:
    """Until the log holds about n more steps than its header (30 bytes a step here)."""
    log = out / "log.bin"
    header: list[int] = []
    while not header or log.stat().st_size < header[0] + n * 30:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        if log.is_file() and not header:
            header.append(log.stat().st_size)
        time.sleep(0.02)


def check_run(out: Path, steps: int, text: str) -> dict:
    s = json.loads((out / "summary.json").read_text())
    assert s["left"] == [] and s["consensus"], text
    assert s["client_hashes"] == [s["param_hash"]] * 4
    replay = subprocess.run(
        [sys.executable, "-m", "seedflood", "replay", str(out)], capture_output=True, text=True, timeout=120
    )
    assert json.loads(replay.stdout.strip().splitlines()[-1]) == {"steps": steps, "param_hash": s["param_hash"]}
    return s


STEPS = 1500  # the tiny model steps fast: enough of the run must be left when a restart is up


def churn_sets(out: Path, *extra: str) -> list[str]:
    return [
        f"run.out_dir={out}",
        f"run.steps={STEPS}",
        "churn.settle=1",
        "transport.timeout_s=3",
        "eval.every=0",
        "checkpoint.every=0",
        *extra,
    ]


def test_a_killed_client_restarts_and_rejoins_by_replay(tmp_path):
    """SIGKILL node 2 mid-run, start it again (same RANK: a new incarnation in the run's store):
    a neighbour sponsors it, it replays the log it is handed and counts again; all four clients
    end with the evaluator's hash and the log records the leave and the join."""
    out = tmp_path / "rejoin"
    run = Launch(tmp_path, churn_sets(out, "run.hash_steps=true"))
    deadline = time.monotonic() + 240
    wait_for_steps(out, 5, run.procs, deadline)
    run.restart(VICTIM + 1)
    text = run.wait(deadline)
    assert all(p.returncode == 0 for p in run.procs), text
    check_run(out, STEPS, text)
    reader = LogReader(out / "log.bin")
    _, records = reader.read()
    assert len(records) == STEPS
    (leave, join) = sorted(reader.changes.items())
    assert leave[1].leave == (VICTIM,) and join[1].join == ((VICTIM, 2),), reader.changes
    assert "rejoined by replaying" in text


@dataclass
class Store:
    address: str  # HOST:PORT, for SEEDFLOOD_STORE
    proc: subprocess.Popen


@contextmanager
def own_store(tmp_path: Path) -> Iterator[Store]:
    """`seedflood store` in a process of its own (killed on the way out, stopped or not)."""
    from seedflood.runtime import free_port

    port = free_port()
    with open(tmp_path / "store.log", "w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "seedflood", "store", "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            start_new_session=True,
        )
        try:
            yield Store(f"127.0.0.1:{port}", proc)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_evaluator_dies_the_clients_train_on_and_its_restart_catches_up(tmp_path):
    """With the store in its own process (`seedflood store`, SEEDFLOOD_STORE), SIGKILL the
    evaluator mid-run and start it again: the clients never wait for it, and the restarted
    evaluator resumes from its log and checkpoint, takes the steps it missed from its attach
    client and ends with the clients' hash (and a log that replays to it)."""
    with own_store(tmp_path) as store:
        out = tmp_path / "eval"
        run = Launch(tmp_path, churn_sets(out, "checkpoint.every=100"), {"SEEDFLOOD_STORE": store.address})
        deadline = time.monotonic() + 240
        wait_for_steps(out, 150, run.procs, deadline)
        run.restart(0)
        text = run.wait(deadline)
    assert all(p.returncode == 0 for p in run.procs), text
    # the restarted evaluator published the step it needs: the catch-up starts there, not at 0
    assert re.search(r"the evaluator follows this node; sent it steps [1-9]\d*\.\.", text), text
    s = check_run(out, STEPS, text)
    assert 0 < s["resumed_from_step"] < STEPS  # it resumed from its own log, then caught up


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSTOP], ids=["kill", "stop"])
def test_the_store_dies_mid_run_and_the_run_ends_without_it(tmp_path, signum):
    """The store's host dies (SIGKILL: its connections close) or goes silent (SIGSTOP, as a host
    cut off by the network: a TCPStore call to it would block until TCP gives up) mid-run.
    Nothing trains through the store, so every process still ends 0 and only the clients' final
    reports are lost: the evaluator finds the store gone within transport.timeout_s (not the 300 s
    it gives a slow client to report) and writes a summary that says the consensus is unchecked,
    with a log that replays to its hash."""
    steps = 300
    with own_store(tmp_path) as store:
        out = tmp_path / "store"
        sets = churn_sets(out, f"run.steps={steps}")
        run = Launch(tmp_path, sets, {"SEEDFLOOD_STORE": store.address})
        deadline = time.monotonic() + 200
        wait_for_steps(out, 20, run.procs, deadline)
        os.killpg(store.proc.pid, signum)
        text = run.wait(deadline)
    assert [p.returncode for p in run.procs] == [0] * 5, text
    # a client's report is a store set, sent without an answer: whether it fails is down to timing
    assert "evaluator: no final reports from the clients" in text, text
    s = json.loads((out / "summary.json").read_text())
    assert s["consensus"] is None and s["client_hashes"] == [None] * 4, s
    assert s["left"] == [] and s["steps"] == steps
    assert "consensus: unchecked (no client reported: the store is gone)" in text, text
    assert "bytes per edge per step: unknown (no client reported)" in text, text
    replay = subprocess.run(
        [sys.executable, "-m", "seedflood", "replay", str(out)], capture_output=True, text=True, timeout=120
    )
    assert json.loads(replay.stdout.strip().splitlines()[-1]) == {"steps": steps, "param_hash": s["param_hash"]}
