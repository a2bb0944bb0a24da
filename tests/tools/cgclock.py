"""CPU seconds per test, counted by a cgroup per pytest process: a pytest plugin and its report.

Each pytest process (an xdist worker, or the only one) moves itself into its own cgroup-v1
cpuacct group under /sys/fs/cgroup/cpuacct/suite/ when pytest configures it, so every process it
starts from then on is counted there: forked children of the fork server, children reparented to
init, grandchildren of launchers. Process accounting (cpu_by_test.py) charges a process to the
test its nearest pytest ancestor ran, and a forked child that outlives its parent loses that
ancestor; a cgroup keeps it. Tests run one at a time in a worker, so the group's usage between a
test's start and finish is that test's CPU, its own and everything it started. SLURM's jobs run
under slurmd, outside the group: not counted.

    mkdir -p /tmp/cgclock
    PYTHONPATH=tests/tools make test PYTEST_ARGS="-p cgclock"      # root, cgroup v1 cpuacct
    python tests/tools/cgclock.py [TOP]                            # per file, then per test

Writes `nodeid <TAB> cpu s <TAB> wall s` lines to $CGCLOCK_DIR/<pid>.tsv (default /tmp/cgclock).
The xdist controller also sees every test start and finish (it only reports them); its file, the
one with the most lines, is left out of the report.
"""

from __future__ import annotations

import collections
import os
import sys
import time
from pathlib import Path
from typing import TextIO

ROOT = Path("/sys/fs/cgroup/cpuacct/suite")
OUT = Path(os.environ.get("CGCLOCK_DIR", "/tmp/cgclock"))
_group: Path | None = None
_out: TextIO | None = None
_started: dict[str, tuple[int, float]] = {}  # nodeid -> (cgroup usage in ns, wall time)


def _usage() -> int:
    assert _group is not None
    return int((_group / "cpuacct.usage").read_text())


def pytest_configure(config: object) -> None:
    global _group, _out
    _group = ROOT / f"w{os.getpid()}"
    _group.mkdir(parents=True, exist_ok=True)
    (_group / "cgroup.procs").write_text(str(os.getpid()))
    OUT.mkdir(parents=True, exist_ok=True)
    _out = open(OUT / f"{os.getpid()}.tsv", "a", buffering=1)  # noqa: SIM115 (lives with the process)


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _started[nodeid] = (_usage(), time.time())


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    used, began = _started.pop(nodeid)
    assert _out is not None
    _out.write(f"{nodeid}\t{(_usage() - used) / 1e9:.3f}\t{time.time() - began:.3f}\n")


def report(top: int = 30) -> None:
    """Per file, then per test: CPU seconds and wall seconds, largest CPU first."""
    files = {f: f.read_text().splitlines() for f in OUT.glob("*.tsv")}
    controller = max(files, key=lambda f: len(files[f]), default=None)
    cpu: collections.Counter[str] = collections.Counter()
    wall: collections.Counter[str] = collections.Counter()
    tests = []
    for f, lines in files.items():
        if f == controller and len(files) > 1:
            continue
        for line in lines:
            nodeid, c, w = line.split("\t")
            cpu[nodeid.split("::")[0]] += float(c)
            wall[nodeid.split("::")[0]] += float(w)
            tests.append((float(c), float(w), nodeid))
    print(f"tests' CPU {sum(cpu.values()):.0f} s, summed wall {sum(wall.values()):.0f} s, {len(tests)} tests")
    print(f"{'CPU s':>8} {'wall s':>8}  file")
    for name, c in cpu.most_common(top):
        print(f"{c:8.1f} {wall[name]:8.1f}  {name}")
    print(f"\n{'CPU s':>8} {'wall s':>8}  test")
    for c, w, nodeid in sorted(tests, reverse=True)[:top]:
        print(f"{c:8.1f} {w:8.1f}  {nodeid}")


if __name__ == "__main__":
    report(*(int(a) for a in sys.argv[1:2]))
