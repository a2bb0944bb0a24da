"""CPU seconds of every process a test suite started, charged to the test that started it.

Reads process accounting (the `acct` package: `accton FILE` on, `dump-acct FILE` to read) and
the start/end lines of the testclock plugin. A process is charged to the test its nearest pytest
ancestor (the worker) was running when the process began; processes with no pytest ancestor (SLURM
jobs, started by slurmd) are reported as unattributed, and the pytest processes' own CPU (the
in-process unit tests, collection) separately.

    accton /var/log/account/pacct
    PYTHONPATH=tests/tools make test PYTEST_ARGS="-p testclock"
    accton off; python tests/tools/cpu_by_test.py /var/log/account/pacct [TOP]
"""

from __future__ import annotations

import bisect
import collections
import datetime
import os
import subprocess
import sys
from pathlib import Path


def main(pacct: str, top: int = 30) -> None:
    procs = {}  # pid -> (command, cpu s, ppid, start unix s)
    for line in subprocess.run(["dump-acct", pacct], capture_output=True, text=True, check=True).stdout.splitlines():
        f = [x.strip() for x in line.split("|")]
        start = datetime.datetime.strptime(f[14], "%a %b %d %H:%M:%S %Y").timestamp()
        procs[int(f[9])] = (f[0], (float(f[2]) + float(f[3])) / 100, int(f[10]), start)  # ticks of 10 ms
    runs = collections.defaultdict(list)  # pytest pid -> [(start, nodeid)]
    for clock in Path(os.environ.get("TESTCLOCK_DIR", "/tmp/testclock")).glob("clock-*.tsv"):
        for line in clock.read_text().splitlines():
            kind, t, pid, nodeid = line.split("\t")
            if kind == "start":
                runs[int(pid)].append((float(t), nodeid))
    for r in runs.values():
        r.sort()

    def pytest_ancestor(pid: int) -> int | None:
        for _ in range(32):
            if pid not in procs:
                return None
            pid = procs[pid][2]
            if pid in runs:
                return pid
        return None

    by_test, by_file, count, unattributed = collections.Counter(), collections.Counter(), collections.Counter(), 0.0
    for pid, (_, cpu, _, start) in procs.items():
        if pid in runs:
            continue
        worker = pytest_ancestor(pid)
        if worker is None:
            unattributed += cpu
            continue
        starts = runs[worker]
        i = bisect.bisect_right([s for s, _ in starts], start + 1.0) - 1  # accounting has 1 s resolution
        nodeid = starts[i][1] if i >= 0 else "(collection)"
        by_test[nodeid] += cpu
        by_file[nodeid.split("::")[0]] += cpu
        count[nodeid.split("::")[0]] += 1
    own = sum(procs[p][1] for p in runs if p in procs)
    print(
        f"pytest processes' own CPU {own:.0f} s; started processes {sum(by_file.values()):.0f} s; "
        f"unattributed (no pytest ancestor, e.g. SLURM jobs) {unattributed:.0f} s"
    )
    print(f"{'CPU s':>8} {'procs':>6}  file")
    for name, cpu in by_file.most_common(top):
        print(f"{cpu:8.1f} {count[name]:6d}  {name}")
    print(f"\n{'CPU s':>8}  test")
    for name, cpu in by_test.most_common(top):
        print(f"{cpu:8.1f}  {name}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
