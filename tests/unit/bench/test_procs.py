"""bench/procs.py's readings of /proc and its per-role figures, and ml/machine.py's thread
variables: no launched run (tests/dist/test_many.py runs one; docs/benchmarks.md has the figures)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from seedflood.bench import procs
from seedflood.ml import machine

MIB = 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="Linux /proc")
def test_pss_threads_and_descendants_of_a_child():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in procs.descendants(os.getpid())
        assert procs.pss(child.pid) > 0 and procs.threads(child.pid) >= 1
        assert procs.role(child.pid) is None  # no RANK, not torchrun's agent
    finally:
        child.kill()
        child.wait()
    assert procs.pss(child.pid) is None  # gone


@pytest.mark.skipif(not os.path.exists("/proc/self/comm"), reason="Linux /proc")
@pytest.mark.parametrize(("rank", "role"), [(0, "evaluator"), (3, "client")])
def test_a_rank_seedflood_launch_forked_is_known_by_its_name(rank, role):
    """`seedflood launch` names each rank seedflood-rR (prctl); its /proc environ has no RANK."""
    name = f"seedflood-r{rank}".encode()
    code = (
        f"import ctypes, sys, time; ctypes.CDLL(None).prctl(15, {name!r}, 0, 0, 0); print(flush=True); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"\n"  # named by now
        assert procs.role(child.pid) == role
    finally:
        child.kill()
        child.wait()


def test_per_role_means_of_means_and_peaks():
    got = procs.per_role(
        [
            {"role": "client", "pss": [100 * MIB, 150 * MIB], "threads": 3},
            {"role": "client", "pss": [110 * MIB, 170 * MIB], "threads": 5},
            {"role": "evaluator", "pss": [200 * MIB], "threads": 8},
        ]
    )
    assert got["client"] == {"n": 2, "mean": 132.5, "peak_mean": 160.0, "peak_max": 170.0, "threads": 5}
    assert got["evaluator"]["peak_max"] == 200.0 and "launcher" not in got


def test_thread_variables_follow_run_threads_and_leave_a_lone_default_alone():
    env: dict[str, str] = {}
    machine.threads_env(0, 1, env)  # one process, torch's default: nothing set
    assert env == {}
    machine.threads_env(0, 129, env)
    assert env == dict.fromkeys(machine.THREAD_VARS, "1")
    machine.threads_env(3, 1, env)
    assert env == dict.fromkeys(machine.THREAD_VARS, "3")
