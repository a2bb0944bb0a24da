"""`python -m seedflood.bench.membership` at a tiny size: each figure is measured from a run that
ends on one hash, the join's moments come in order, and bad sizes are refused before anything
runs. No figure is asserted beyond that."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedflood.bench import membership

DEBUG = Path(__file__).resolve().parents[3] / "launch" / "configs" / "debug.yaml"
TINY = [
    "--clients",
    "4",
    "--logs",
    "4",
    "--steps",
    "20",
    "--every",
    "6",
    "--heal-after",
    "2",
    "--repeats",
    "1",
    "--forward-s",
    "0.005",
]


def test_membership_benchmark_runs_at_a_tiny_size(tmp_path, capsys):
    out = tmp_path / "m.json"
    argv = [*TINY, "--grow-to", "5", "--grow-every", "2", "--config", str(DEBUG), "--out", str(out)]
    assert membership.main(argv) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    figures = json.loads(out.read_text())
    joins = figures["join"]
    assert [j["log_steps"] for j in joins] == [4]
    for j in joins:  # the newcomer replays at least the steps before its join, then counts later
        assert j["replayed_steps"] >= j["log_steps"] and j["first_counted_step"] > j["log_steps"]
        assert 0 <= j["start_to_replayed_s"] <= j["start_to_first_counted_s"]
    runs = ["none", "none, 5 clients", "join every 6", "cut + heal every 6"]  # 5: the join run's at its end
    assert [t["run"] for t in figures["throughput"]] == runs
    assert [t["events"] for t in figures["throughput"]] == [0, 0, 1, 1]
    assert figures["throughput"][0]["of_none"] == 1.0
    sizes = [g["members"] for g in figures["growth"]]
    assert sizes[0] == 4 and sizes[-1] == 5 and sizes == sorted(sizes)


@pytest.mark.parametrize(
    "argv",
    [
        ["--clients", "2"],
        ["--logs", "x"],
        ["--only", "joins"],
        ["--heal-after", "60"],
        ["--grow-to", "8"],
        ["--forward-s", "nan"],
    ],
)
def test_membership_benchmark_refuses_sizes_it_cannot_run(argv, capsys):
    with pytest.raises(SystemExit) as e:
        membership.main([*argv, "--config", str(DEBUG)])
    assert e.value.code == 2 and "error:" in capsys.readouterr().err
