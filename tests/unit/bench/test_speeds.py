"""`python -m seedflood.bench.speeds` at a tiny size: every run is measured and written, the
strided runs carry fewer messages (the slow client's skipped steps), a pace changes no bit, and
bad sizes are refused before anything is built. No figure is asserted beyond that."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedflood.bench import speeds

DEBUG = Path(__file__).resolve().parents[3] / "launch" / "configs" / "debug.yaml"


def test_speeds_benchmark_runs_at_a_tiny_size(tmp_path, capsys):
    out = tmp_path / "speeds.json"
    argv = ["--steps", "2", "--clients", "3", "--slow", "1", "--forward-s", "0.001", "--config", str(DEBUG)]
    assert speeds.main([*argv, "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    runs = json.loads(out.read_text())["runs"]
    assert [(r["run"], r["overlap"]) for r in runs] == [
        (name, overlap) for overlap in (False, True) for name in ("equal", "slow", "slow + stride")
    ]
    for r in runs:
        assert r["steps_per_s"] > 0 and r["train_loss"] > 0, r
        # node 2 (stride 3) originates on step 0 only of 0..1: 3 clients x 2 steps, less 1
        assert r["messages"] == (5 if r["run"] == "slow + stride" else 6), r
    assert runs[0]["hash"] == runs[1]["hash"] != runs[2]["hash"]


@pytest.mark.parametrize("argv", [["--slow", "3", "--clients", "3"], ["--stride", "0"], ["--factor", "0.5"]])
def test_bad_sizes_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        speeds.main([*argv, "--config", str(DEBUG)])
    assert "need" in capsys.readouterr().err
