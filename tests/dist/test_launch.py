"""`seedflood launch` as a user runs it (a plain subprocess, not the harness's fork server): 4
clients on the debug ring + the evaluator, every rank forked from the launch's own fork server.

- It ends with every client on the hash of `seedflood simulate` of the same config, each rank's
  output prefixed `[rankR]: `, and each client costing well under a fresh interpreter's
  `import torch` (about 160 MiB PSS; docs/benchmarks.md): the ranks share the server's pages.
- A rank killed mid-run makes the launch end the others and exit 1 (not after the transport's
  timeout: the survivors would otherwise wait 600 s for the dead one).
- SIGTERM to the launch ends every rank and exits 143; launching again resumes the run directory
  and ends on simulate's hash of the whole run (nothing lost).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

import procs as harness
import runs
from seedflood.bench import procs as bench_procs
from seedflood.core.config import runconfig as config
from seedflood.ml import machine
from seedflood.roles.inprocess import simulate

pytestmark = pytest.mark.dist
LAUNCH = [sys.executable, "-c", "from seedflood.cli import console; console()", "launch"]
"""Not `python -m seedflood`: the harness would run that in its own fork server (tests/forked.py)."""
SLOW_HOP = "transport.timeout_s=600"  # a dead neighbour would stall its survivors this long


def _launch(group: harness.Procs, name: str, *overrides: str) -> harness.Proc:
    argv = [*LAUNCH, "--config", str(runs.DEBUG), *harness.sets(*overrides)]
    return group.start(name, argv, env=harness.env(), merge=True)


def _reference(*overrides: str) -> str:
    torch.set_num_threads(1)
    cfg = config.load(str(runs.DEBUG), [*overrides, "run.out_dir=/nonexistent"])
    hashes = set(simulate(cfg, hash_every_step=False).hashes.values())
    assert len(hashes) == 1
    return hashes.pop()


def _ranks(launcher: int) -> dict[int, int]:
    """rank -> pid of the ranks under the launch (named seedflood-rR)."""
    found = {}
    for pid in bench_procs.descendants(launcher):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith("seedflood-r"):
            found[int(comm.removeprefix("seedflood-r"))] = pid
    return found


def _gone(pids: list[int]) -> bool:
    """Every pid has exited: no /proc entry, or a zombie (an orphan's is reaped by PID 1, which in
    a container may never do it)."""
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                return False
        except (OSError, IndexError):
            pass
    return True


@pytest.mark.timeout(600)
def test_forked_launch_ends_on_simulates_hash(tmp_path):
    out = tmp_path / "run"
    sets = ("run.steps=3", "eval.every=0", "checkpoint.every=0", "run.threads=0")
    with harness.Procs(tmp_path / "procs") as group:
        p = _launch(group, "launch", *sets, f"run.out_dir={out}")
        assert group.wait(["launch"]) == [0], p.describe()
    s = json.loads((out / "summary.json").read_text())
    reference = _reference(*sets)
    assert s["consensus"] and s["param_hash"] == reference
    assert s["client_hashes"] == [reference] * 4
    assert {f"[rank{r}]: " for r in range(5)} <= {line[:9] for line in p.stdout.splitlines()}
    assert s["threads"] == [machine.threads_for(0, 5)] * 4  # run.threads = 0: the cores over 5 local processes
    clients = [m["pss"] / 2**20 for m in s["memory"]["clients"]]
    assert max(clients) < 100, clients  # a fresh interpreter's torch alone is about 160 MiB


@pytest.mark.timeout(600)
def test_a_killed_rank_ends_the_launch_with_status_1(tmp_path):
    out = tmp_path / "run"
    sets = ("run.steps=100000", "eval.every=0", "checkpoint.every=0", SLOW_HOP, f"run.out_dir={out}")
    with harness.Procs(tmp_path / "procs") as group:
        p = _launch(group, "launch", *sets)
        runs.wait_for_steps(group, out, 5)
        ranks = _ranks(p.pid)
        assert sorted(ranks) == [0, 1, 2, 3, 4], ranks
        os.kill(ranks[2], signal.SIGKILL)
        t0 = time.monotonic()
        assert group.wait(["launch"]) == [1], p.describe()
        took = time.monotonic() - t0
    assert "seedflood launch: rank 2 was killed by SIGKILL; the others were ended" in p.stdout
    assert _gone(list(ranks.values()))
    assert took < 120, took  # ended by the launch, not by the 600 s hop timeout


@pytest.mark.timeout(600)
def test_ranks_do_not_outlive_a_killed_launch(tmp_path):
    """SIGKILL to the launch (no handler runs): its fork server exits, and each rank with it
    (PR_SET_PDEATHSIG), instead of training on as orphans."""
    out = tmp_path / "run"
    sets = ("run.steps=100000", "eval.every=0", "checkpoint.every=0", SLOW_HOP, f"run.out_dir={out}")
    with harness.Procs(tmp_path / "procs") as group:
        p = _launch(group, "launch", *sets)
        runs.wait_for_steps(group, out, 3)
        ranks = _ranks(p.pid)
        assert len(ranks) == 5, ranks
        group.signal("launch", signal.SIGKILL)
        assert group.wait(["launch"]) == [-signal.SIGKILL]
        deadline = time.monotonic() + 60
        while not _gone(list(ranks.values())) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert _gone(list(ranks.values()))


@pytest.mark.timeout(900)
def test_sigterm_ends_every_rank_and_a_second_launch_resumes(tmp_path):
    out = tmp_path / "run"
    sets = ("run.steps=200", "eval.every=0", "checkpoint.every=50", SLOW_HOP)
    with harness.Procs(tmp_path / "procs") as group:
        p = _launch(group, "first", *sets, f"run.out_dir={out}")
        runs.wait_for_steps(group, out, 25)
        ranks = _ranks(p.pid)
        group.signal("first", signal.SIGTERM)
        assert group.wait(["first"]) == [128 + signal.SIGTERM], p.describe()
        assert "seedflood launch: stopped by SIGTERM" in p.stdout
        assert _gone(list(ranks.values()))
        assert not (out / "summary.json").exists()  # it was stopped before the end
        again = _launch(group, "again", *sets, f"run.out_dir={out}")  # checkpoint.resume is on by default
        assert group.wait(["again"]) == [0], again.describe()
    s = json.loads((out / "summary.json").read_text())
    reference = _reference(*sets)
    assert s["consensus"] and s["param_hash"] == reference and s["client_hashes"] == [reference] * 4
    assert re.search(r"resumed at step [1-9][0-9]* by replaying", again.stdout), again.stdout[-3000:]
