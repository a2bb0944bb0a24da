"""Churn in a launched run (docs/design.md §13): 1 evaluator + 4 clients as processes, one gloo
group per edge (links.py), `churn.settle: 1`. A client SIGKILLed or SIGSTOPped mid-run leaves the
others training to the end without a restart: they exit 0, every survivor holds the same bits
after every step and the evaluator's final hash, the log records the leave, and `seedflood
replay` of the log reproduces the hash.
"""

from __future__ import annotations

import contextlib
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

from seedflood.rundir.checkpoint import LogReader
from seedflood.core.membership import Change

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
    """5 processes of one churn run started by hand, so a test can restart one (same RANK);
    the ranks in `later` are left for the test to `start` (a process slow to start)."""

    def __init__(
        self, tmp_path: Path, sets: list[str], env: dict[str, str] | None = None, later: tuple[int, ...] = ()
    ) -> None:
        from seedflood.comm.runtime import free_port

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
        self.procs: list = [None if r in later else self.start(r) for r in range(5)]

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

    def output(self) -> str:
        """Everything the processes printed so far (all incarnations)."""
        text = ""
        for f in self.logs:
            f.flush()
            text += Path(f.name).read_text()
        return text

    def wait(self, deadline: float, ranks: range | list[int] = range(5)) -> str:
        """Wait for the processes of `ranks` (all by default; on a failure or timeout all are
        killed); returns every output's tail for assertion messages."""
        ok = False
        try:
            for r in ranks:
                self.procs[r].wait(timeout=max(1.0, deadline - time.monotonic()))
            ok = True
        finally:
            if not ok or list(ranks) == list(range(5)):
                self.kill()
        return self.tails()

    def kill(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def tails(self) -> str:
        text = ""
        for f in self.logs:
            f.flush()
            text += f"--- {f.name}\n{Path(f.name).read_text()[-3000:]}\n"
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
    from seedflood.comm.runtime import free_port

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
        # no client logs: with them the evaluator reads the reports from this disk (tested below)
        sets = churn_sets(out, f"run.steps={steps}", "eval.client_logs=")
        run = Launch(tmp_path, sets, {"SEEDFLOOD_STORE": store.address})
        deadline = time.monotonic() + 200
        wait_for_steps(out, 20, run.procs, deadline)
        os.killpg(store.proc.pid, signum)
        text = run.wait(deadline)
    assert [p.returncode for p in run.procs] == [0] * 5, text
    # a client's report is a store set, sent without an answer: whether it fails is down to timing
    assert "evaluator: no final report from nodes [0, 1, 2, 3]" in text, text
    s = json.loads((out / "summary.json").read_text())
    assert s["consensus"] is None and s["client_hashes"] == [None] * 4, s
    assert s["left"] == [] and s["steps"] == steps
    assert "consensus: unchecked (no client reported: the store is gone)" in text, text
    assert "bytes per edge per step: unknown (no client reported)" in text, text
    replay = subprocess.run(
        [sys.executable, "-m", "seedflood", "replay", str(out)], capture_output=True, text=True, timeout=120
    )
    assert json.loads(replay.stdout.strip().splitlines()[-1]) == {"steps": steps, "param_hash": s["param_hash"]}


def replay(run_dir: Path) -> dict:
    p = subprocess.run(
        [sys.executable, "-m", "seedflood", "replay", str(run_dir)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("store_host", ["own-store", "evaluator"])
def test_an_evaluator_restarted_after_the_clients_finished_completes_the_run_from_their_logs(tmp_path, store_host):
    """F9: SIGKILL the evaluator mid-run and start it again only once every client has finished
    (exit 0). Nobody streams any more, so the steps it missed exist only in the clients' own logs
    (eval.client_logs, on this disk): the restarted evaluator takes them from there, ends with
    every step in its log and a summary.json whose consensus holds, and its log, like each
    client's, replays to the final hash. With the store in rank 0 (`evaluator`) the restart comes
    back to a fresh, empty store: the clients' final reports are read from their logs too."""
    steps = 300
    env = {}
    with contextlib.ExitStack() as stack:
        if store_host == "own-store":
            env["SEEDFLOOD_STORE"] = stack.enter_context(own_store(tmp_path)).address
        out = tmp_path / "run"
        run = Launch(tmp_path, churn_sets(out, f"run.steps={steps}", "checkpoint.every=50"), env)
        deadline = time.monotonic() + 300
        wait_for_steps(out, 20, run.procs, deadline)
        os.kill(run.procs[0].pid, signal.SIGKILL)
        run.procs[0].wait()
        logged = len(LogReader(out / "log.bin").read()[1])
        run.wait(deadline, ranks=[1, 2, 3, 4])  # the clients never wait for the evaluator
        assert [p.returncode for p in run.procs[1:]] == [0] * 4, run.tails()
        assert logged < steps, logged
        run.procs[0] = run.start(0)
        text = run.wait(deadline)
    assert run.procs[0].returncode == 0, text
    assert re.search(rf"evaluator: took steps {logged}\.\.{steps - 1} from the client log", text), text
    s = check_run(out, steps, text)
    assert s["resumed_from_step"] == steps  # its log was completed before it resumed
    for n in range(4):
        assert replay(out / "clients" / f"node-{n}") == {"steps": steps, "param_hash": s["param_hash"]}


def test_a_client_slower_to_start_than_the_hop_timeout_still_trains(tmp_path):
    """F10: node 2 starts (finishes loading its model) well after transport.timeout_s (3 s) but
    within transport.startup_timeout_s: the others wait for it, saying so on screen, and all
    four train the whole run together (nobody left out at step 0)."""
    out = tmp_path / "slow"
    sets = churn_sets(out, "run.steps=60", "transport.startup_timeout_s=240")
    run = Launch(tmp_path, sets, later=(VICTIM + 1,))
    deadline = time.monotonic() + 300
    waiting = re.compile(r"node \d: waiting for nodes \[2\] to start \((\d+) s of 240\)")
    while not waiting.search(run.output()):  # the others are up and wait for node 2
        assert time.monotonic() < deadline and all(p.poll() is None for p in run.procs if p), run.tails()
        time.sleep(0.2)
    time.sleep(4 * 3)  # node 2 is now later than 4 hop timeouts
    run.procs[VICTIM + 1] = run.start(VICTIM + 1)
    text = run.wait(deadline)
    assert [p.returncode for p in run.procs] == [0] * 5, text
    assert "not connected to" not in text, text
    s = check_run(out, 60, text)
    assert s["membership_changes"] == [], s["membership_changes"]


def test_a_client_later_than_the_start_up_bound_joins_by_a_sponsor(tmp_path):
    """F10, past the bound: node 2 starts after transport.startup_timeout_s (10 s). The others
    start without it (it leaves at step 0); when it comes up it finds the run started and joins
    as a restarted client does: a neighbour sponsors it, it replays the log and counts again.
    All four end on the evaluator's hash."""
    out = tmp_path / "late"
    run = Launch(tmp_path, churn_sets(out, "transport.startup_timeout_s=10"), later=(VICTIM + 1,))
    deadline = time.monotonic() + 300
    while "not connected to [2] at start-up" not in run.output():
        assert time.monotonic() < deadline and all(p.poll() is None for p in run.procs if p), run.tails()
        time.sleep(0.2)
    run.procs[VICTIM + 1] = run.start(VICTIM + 1)
    text = run.wait(deadline)
    assert [p.returncode for p in run.procs] == [0] * 5, text
    assert "node 2: the run started without it" in text and "rejoined by replaying" in text, text
    check_run(out, STEPS, text)
    reader = LogReader(out / "log.bin")
    reader.read()
    (leave, join) = sorted(reader.changes.items())
    assert leave == (0, Change(0, leave=(VICTIM,))) and join[1].join == ((VICTIM, 1),), reader.changes


def test_an_evaluator_whose_clients_all_went_silent_exits_within_its_bound(tmp_path):
    """F11: every client is stopped (SIGSTOP: silent, sockets open) mid-run. The evaluator edge
    beats like a topology edge, so the evaluator finds its stream silent within
    transport.timeout_s, waits for an attach node at most max(transport.startup_timeout_s, 10 ×
    transport.timeout_s) = 20 s, saying so on screen, and exits 1 with one line (before, a
    receive with no bound on the stalled sender held it for ever)."""
    out = tmp_path / "silent"
    sets = churn_sets(out, "transport.timeout_s=2", "transport.startup_timeout_s=20")
    run = Launch(tmp_path, sets)
    deadline = time.monotonic() + 240
    wait_for_steps(out, 20, run.procs, deadline)
    for p in run.procs[1:]:
        os.kill(p.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        run.procs[0].wait(timeout=max(1.0, deadline - time.monotonic()))
        took = time.monotonic() - stopped
    finally:
        text = run.wait(time.monotonic() + 1, ranks=[])
        run.kill()
    assert run.procs[0].returncode == 1, text
    assert "no client has streamed to it for 20 s" in text, text
    assert re.search(r"evaluator: waiting for the attach node to stream from step \d+ \(1\d s of 20\)", text), text
    # silence found (2 s + a beat), the 20 s bound, exit; a loaded 2-core machine gets the rest
    assert took < 20 + 25, took


def test_a_client_restarted_later_than_the_step_window_rejoins_with_audits_on(tmp_path):
    """F8: node 3 is SIGKILLed after 15 steps and started again more than 2 × flood.step_window
    steps later, with audits on: its sponsor hands it the notes it holds (AUDIT notes of old
    steps among them), and every client must still end on the evaluator's hash, with a log that
    replays to it. Before the core fix (notes kept one or two steps past the wire window were
    handed over, and the newcomer flooded them back) the sponsor and the newcomer both stopped:
    'note step .. outside window ..'. Audits every step, so such a note is there whatever step
    the rejoin lands on (with audit_every=5 two rejoin steps in five hit it)."""
    window = 16
    out = tmp_path / "window"
    sets = churn_sets(out, "churn.audit_every=1", f"flood.step_window={window}")
    run = Launch(tmp_path, sets)
    deadline = time.monotonic() + 300
    wait_for_steps(out, 15, run.procs, deadline)
    os.kill(run.procs[4].pid, signal.SIGKILL)
    run.procs[4].wait()
    down = [p for i, p in enumerate(run.procs) if i != 4]
    wait_for_steps(out, 3 * window, down, deadline)
    run.procs[4] = run.start(4)
    text = run.wait(deadline)
    assert all(p.returncode == 0 for p in run.procs), text
    check_run(out, STEPS, text)
    reader = LogReader(out / "log.bin")
    reader.read()
    (leave, join) = sorted(reader.changes.items())
    assert leave[1].leave == (3,) and join[1].join == ((3, 2),), reader.changes
    assert join[0] - leave[0] > 2 * window, reader.changes
