"""A pytest plugin that writes when each test started and ended, per pytest process.

Use: PYTHONPATH=tests/tools pytest -p testclock ...  (also through `make test PYTEST_ARGS=...`).
Each pytest process (an xdist worker too) appends lines `start|end <TAB> unix time <TAB> pid <TAB>
nodeid` to $TESTCLOCK_DIR/clock-<pid>.tsv (default /tmp/testclock). cpu_by_test.py joins them with
process accounting to charge every launched process's CPU to the test that started it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TextIO

_out: TextIO | None = None


def _write(kind: str, nodeid: str) -> None:
    global _out
    if _out is None:
        root = Path(os.environ.get("TESTCLOCK_DIR", "/tmp/testclock"))
        root.mkdir(parents=True, exist_ok=True)
        _out = open(root / f"clock-{os.getpid()}.tsv", "a", buffering=1)  # noqa: SIM115 (lives with the process)
    _out.write(f"{kind}\t{time.time():.3f}\t{os.getpid()}\t{nodeid}\n")


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _write("start", nodeid)


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    _write("end", nodeid)
