"""`seedflood bench --only load` (bench/load.py, bench/load_worker.py): its arithmetic and a quick
run's shape (a fresh interpreter on a ~38 MB tiny directory), never a memory threshold: the
figures are printed, and tests/unit/ml/test_mapped_load.py checks the mapping itself.
"""

from __future__ import annotations

import json

import pytest

from seedflood.bench import cli as bench
from seedflood.bench import load


def test_growth_subtracts_the_points():
    run = {
        "model_bytes": 1000,
        "mapped_bytes": 900,
        "hash": "ab",
        "points": {"torch": 100, "imports": 300, "end": 350},
        "peak": 400,
    }
    g = load.growth(run)
    assert g["load_bytes"] == 50 and g["load_peak_bytes"] == 100  # end - imports; peak - imports
    assert g["imports_bytes"] == 200 and g["with_imports_bytes"] == 250  # imports - torch; end - torch
    assert g["load_ratio"] == pytest.approx(0.05) and g["with_imports_ratio"] == pytest.approx(0.25)
    assert g["mapped_bytes"] == 900 and g["hash"] == "ab"


def test_quick_run_prints_each_repeat(tmp_path, capsys):
    out = tmp_path / "load.json"
    assert bench.main(["--only", "load", "--quick", "--repeats", "1", "--json", str(out)]) == 0
    fig = json.loads(out.read_text())["figures"]["load"]
    assert fig["goal"] == load.GOAL and fig["device"] == "cpu" and len(fig["runs"]) == 1
    (run,) = fig["runs"]
    assert run["model_bytes"] > 30e6  # QUICK_TINY in float32
    assert run["mapped_bytes"] == run["model_bytes"]  # every parameter byte in the file's map
    assert run["load_ratio"] == pytest.approx(run["load_bytes"] / run["model_bytes"])
    assert run["load_peak_bytes"] >= run["load_bytes"]  # the end is one of the samples
    assert fig["median"]["load_bytes"] == run["load_bytes"]
    text = capsys.readouterr().out
    assert "load/model" in text and "median" in text and run["hash"][:12] in text
