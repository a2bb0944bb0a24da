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


def test_launched_runs_pace_only_the_slow_clients_and_compare_to_the_equal_run(monkeypatch, tmp_path, capsys):
    """`--launched` (bench/speedslaunched.py) without launching: each run's overrides give every
    client --forward-s and the slow ones --factor x that, the strided run adds zo.stride, and the
    equal and slow runs must share a hash (a pace changes no bit)."""
    from seedflood.bench import speedslaunched

    launched: list[list[str]] = []

    def fake(config, sets, out, timeout_s):
        launched.append(sets)
        rate = 1.0 if "run.node_delay_s" not in " ".join(sets) else 0.5
        return {"steps": 2, "startup_s": 1.0, "steps_per_s": rate, "wall_s": 3.0, "hash": "h"}

    monkeypatch.setattr(speedslaunched, "one_launched", fake)
    argv = ["--launched", "--steps", "2", "--clients", "4", "--slow", "1", "--forward-s", "0.1"]
    assert speeds.main([*argv, "--config", str(DEBUG), "--out", str(tmp_path / "l.json")]) == 0
    equal, slow, strided = launched[:3]
    assert "run.step_delay_s=0.1" in equal and not any("node_delay" in s for s in equal)
    assert "run.node_delay_s={3: 0.3}" in slow
    assert "zo.stride={3: 3}" in strided and "zo.stride={3: 3}" not in slow
    runs = json.loads((tmp_path / "l.json").read_text())["runs"]
    assert [r["of_equal_rate"] for r in runs] == [1.0, 0.5, 0.5] * 2

    def forked(config, sets, out, timeout_s):
        return {**fake(config, sets, out, timeout_s), "hash": " ".join(sets)}

    monkeypatch.setattr(speedslaunched, "one_launched", forked)
    with pytest.raises(RuntimeError, match="a pace changed the bits"):
        speeds.main([*argv, "--config", str(DEBUG)])


def test_a_run_directory_without_a_log_has_no_steps_yet(tmp_path):
    from seedflood.bench.speedslaunched import logged_steps

    assert logged_steps(tmp_path) == 0
