"""`python -m seedflood.bench.clip` at a tiny size: every run is measured and written, the lie
reaches the applier (the clipped runs clamp the liar, the unclipped ones clamp nothing), and bad
sizes are refused before anything is built. No figure is asserted beyond that."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedflood.bench import clip

DEBUG = Path(__file__).resolve().parents[3] / "launch" / "configs" / "debug.yaml"


def test_clip_benchmark_runs_at_a_tiny_size(tmp_path, capsys):
    out = tmp_path / "clip.json"
    assert clip.main(["--steps", "2", "--clients", "3", "--config", str(DEBUG), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "random ±100 liar + clip 5" in printed and f"wrote {out}" in printed
    figures = {r.pop("run"): r for r in json.loads(out.read_text())["runs"]}
    assert list(figures) == [
        "zero-shot (base model)",
        "honest",
        "honest + clip 5",
        "x10 liar",
        "x10 liar + clip 5",
        "random ±100 liar",
        "random ±100 liar + clip 5",
    ]
    for name, f in figures.items():
        assert 0.0 <= f["test_accuracy"] <= 1.0 and f["train_loss"] > 0, name
        if "clip" not in name and name != "zero-shot (base model)":
            assert f["clamped_liar"] == f["clamped_honest"] == 0, name
    assert figures["random ±100 liar"]["largest_applied_scalar"] > 1.0  # the lie went in whole
    assert figures["random ±100 liar + clip 5"]["clamped_liar"] >= 1  # and was clamped
    assert figures["honest"]["messages"] == 2 * 3


@pytest.mark.parametrize(
    "argv", [["--clip", "0.5"], ["--clients", "2"], ["--liar", "3", "--clients", "3"], ["--random-scale", "1e7"]]
)
def test_clip_benchmark_refuses_sizes_it_cannot_run(argv, capsys):
    with pytest.raises(SystemExit) as e:
        clip.main([*argv, "--config", str(DEBUG)])
    assert e.value.code == 2 and "error:" in capsys.readouterr().err
