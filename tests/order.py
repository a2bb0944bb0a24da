"""The suite's file order: longest first, so the workers end together (a pytest plugin).

Owns: the order in which test files reach xdist's workers, and the measured table it follows
(`tests/durations.json`: seconds of wall time per test file, summed over its tests' set-up, call
and tear-down in one `make test`).
Assumes: `--dist loadfile --no-loadscope-reorder` (xdist hands out whole files in collection
order; without the flag it sorts them by test count, which sent the one 270-second SLURM test,
a file of two tests, out last, alone on a half-idle machine). Order is all it changes: every
collected test still runs, and a file missing from the table (a new one) counts as the median.

    make durations   # runs the suite and rewrites tests/durations.json from what it measured
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

TABLE = Path(__file__).with_name("durations.json")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--store-durations", metavar="PATH", help="write seconds of wall time per test file to PATH")


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(trylast=True)  # after the skip markers: reorder what is collected, drop nothing
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    seconds: dict[str, float] = json.loads(TABLE.read_text()) if TABLE.exists() else {}
    unknown = statistics.median(seconds.values()) if seconds else 0.0
    first = {}  # file -> index of its first test: ties keep collection order
    for i, item in enumerate(items):
        first.setdefault(_file(item.nodeid), i)
    # sorted() is stable: a file's own tests keep their order, and every worker sorts alike.
    items.sort(key=lambda it: (-seconds.get(_file(it.nodeid), unknown), first[_file(it.nodeid)]))


class _Recorder:
    """Sums each file's reported durations (on the controller, where every worker's reports arrive)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[_file(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        table = {f: round(s, 1) for f, s in sorted(self.seconds.items())}
        self.path.write_text(json.dumps(table, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--store-durations")
    if path and not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        config.pluginmanager.register(_Recorder(Path(path)), "order-recorder")
