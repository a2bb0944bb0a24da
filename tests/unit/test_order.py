"""tests/order.py: test files reach the workers longest first, and nothing collected is dropped."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import order


def test_files_run_longest_first_a_new_file_as_the_median_and_none_is_dropped(tmp_path: Path, monkeypatch) -> None:
    table = tmp_path / "durations.json"
    table.write_text(json.dumps({"a.py": 5.0, "b.py": 50.0, "d.py": 1.0}))
    monkeypatch.setattr(order, "TABLE", table)
    ids = ["a.py::t1", "c.py::t1", "b.py::t1", "a.py::t2", "d.py::t1", "b.py::t2", "e.py::t1"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    order.pytest_collection_modifyitems(items)
    # b 50 s; c and e unknown: the median, 5 s, ties in collection order after a (5 s, first seen); d 1 s.
    assert [i.nodeid for i in items] == [
        "b.py::t1",
        "b.py::t2",
        "a.py::t1",
        "a.py::t2",
        "c.py::t1",
        "e.py::t1",
        "d.py::t1",
    ]


def test_without_a_table_the_collection_order_stands(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(order, "TABLE", tmp_path / "absent.json")
    ids = ["z.py::t", "a.py::t1", "a.py::t2"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    order.pytest_collection_modifyitems(items)
    assert [i.nodeid for i in items] == ids


def test_the_recorder_sums_each_files_phases(tmp_path: Path) -> None:
    rec = order._Recorder(tmp_path / "out.json")
    for nodeid, seconds in [("a.py::t1", 1.25), ("a.py::t1", 0.5), ("b.py::t", 2.0), ("a.py::t2", 3.0)]:
        rec.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=seconds))
    rec.pytest_sessionfinish()
    assert json.loads((tmp_path / "out.json").read_text()) == {"a.py": 4.8, "b.py": 2.0}
