"""`seedflood compare`: runs every algorithm on one config (fake runners here), skips finished runs,
records failures, and reports a table, a CSV and two plots from run directories that follow the
run-directory contract (synthetic metrics.jsonl / summary.json written by the tests)."""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import struct
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from seedflood.core.config import runconfig as config
from seedflood.experiments import compare, compare_report
from seedflood.rundir.metrics import event_files

STEPS, EVERY = 10, 5

# (accuracy at steps 0, 5, 10), bytes one edge carries per step, consensus distance, bit-identical
RUNS: dict[str, dict[str, Any]] = {
    "seedflood": {"acc": (0.5, 0.625, 0.75), "per_step": 64.0, "distance": 0.0, "bit": True},
    "dzsgd": {"acc": (0.5, 0.5625, 0.6875), "per_step": 2.5e8, "distance": 0.125, "bit": False, "worst": 0.625},
    "dsgd": {"acc": (0.5, 0.75, 0.875), "per_step": 2.5e8, "distance": 0.25, "bit": False, "worst": 0.8125},
    "choco": {"acc": (0.5, 0.5, 0.625), "per_step": 2.5e6, "distance": 0.5, "bit": False, "worst": 0.5},
    "mezo": {"acc": (0.5, 0.5625, 0.625), "per_step": 0.0, "distance": 0.0, "bit": None},
    # worst-client accuracy only in summary.json (as baselines.py writes for identical clients)
    "diloco": {"acc": (0.5, 0.5, 0.5625), "per_step": 1e6, "distance": 0.0, "bit": None, "summary_worst": 0.5625},
}


def write_run(run_dir: Path, algorithm: str, steps: int = STEPS) -> dict[str, Any]:
    """A finished run directory as the contract describes it (metrics.jsonl, summary.json)."""
    spec = RUNS[algorithm]
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, step in enumerate(range(0, steps + 1, EVERY)):
        acc = spec["acc"][i]
        line = {"step": step, "accuracy": acc, "loss": 1 - acc, "auc": acc + 0.0625, "threshold_accuracy": acc - 0.0625}
        line["elapsed_seconds"] = float(step)
        if "worst" in spec:
            line |= {"consensus_distance": spec["distance"], "worst_accuracy": spec["worst"]}
        lines.append(line | ({"final": True} if step == steps else {}))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    # bytes: the per-step figure every step, plus a drain of half a step counted in the last entry
    cumulative = [spec["per_step"] * (s + 1) for s in range(steps)]
    cumulative[-1] += spec["per_step"] / 2
    summary = {
        "algorithm": algorithm,
        "steps": steps,
        "clients": 8,
        "topology": "ring",
        "final": lines[-1],
        "bytes_per_edge_run": cumulative[-1],
        "bytes_per_edge_cumulative": cumulative,
        "wall_seconds": 12.0,
        "consensus_distance": spec["distance"],
        "bit_identical": spec["bit"],
    }
    if "summary_worst" in spec:
        summary["worst_accuracy"] = spec["summary_worst"]
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return summary


class FakeRunner:
    """Writes the run directory the real entry point would; `fail` names algorithms that raise."""

    def __init__(self, fail: tuple[str, ...] = ()) -> None:
        self.fail = fail
        self.configs: list[config.Config] = []

    def __call__(self, cfg: config.Config) -> dict[str, Any]:
        self.configs.append(cfg)
        if cfg.algorithm.name in self.fail:
            raise RuntimeError(f"{cfg.algorithm.name} ran out of memory\nsecond line of the message")
        return write_run(Path(cfg.run.out_dir), cfg.algorithm.name)

    @property
    def ran(self) -> list[str]:
        return [c.algorithm.name for c in self.configs]


def base_cfg(*overrides: str) -> config.Config:
    return config.load(None, ["run.steps=10", "topology.nodes=8", "eval.every=5", *overrides])


def is_png(path: Path) -> bool:
    data = path.read_bytes()
    width, height = struct.unpack(">II", data[16:24])  # IHDR, the first chunk
    return data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and width > 0 and height > 0


# -- report ---------------------------------------------------------------------------------------
@pytest.fixture
def compared(tmp_path: Path) -> Path:
    """seedflood, dsgd and diloco finished, dzsgd failed (its compare.json says so)."""
    out = tmp_path / "cmp"
    write_run(out / "seedflood", "seedflood")
    write_run(out / "diloco", "diloco")
    write_run(out / "dsgd", "dsgd")
    (out / "dzsgd").mkdir()
    (out / "dzsgd" / "compare.json").write_text(json.dumps({"status": "failed", "error": "ValueError: a|b"}))
    return out


def test_report_rows_table_and_csv(compared: Path) -> None:
    rows = compare_report.report(compared)
    assert [r["algorithm"] for r in rows] == ["seedflood", "dzsgd", "dsgd", "diloco"]  # table order, not disk's
    sf, dz, ds, dl = rows
    assert (sf["accuracy"], sf["auc"], sf["threshold_accuracy"]) == (0.75, 0.8125, 0.6875)
    assert sf["bytes_per_edge"] == 64.0 * 10 + 32.0 and sf["bytes_ratio"] == 1.0
    assert (sf["consensus_distance"], sf["worst_accuracy"], sf["bit_identical"]) == (0.0, 0.75, True)
    assert ds["bytes_per_edge"] == 2.5e8 * 10.5 and ds["bytes_ratio"] == pytest.approx(2.5e8 * 10.5 / 672)
    assert (ds["consensus_distance"], ds["worst_accuracy"], ds["bit_identical"]) == (0.25, 0.8125, False)
    assert ds["wall_seconds"] == 12.0 and ds["status"] == "ok"
    assert dz["status"] == "failed" and dz["accuracy"] is None and dz["error"] == "ValueError: a|b"
    assert (dl["worst_accuracy"], dl["bit_identical"], dl["bytes_ratio"]) == (0.5625, None, 1.05e7 / 672)

    md = (compared / "results.md").read_text()
    assert "| seedflood | 0.750 | 0.812 | 0.688 | 672 B | 1× | 12.0 s | 0 | 0.750 | yes | ok |" in md
    assert (
        "| dsgd | 0.875 | 0.938 | 0.812 | 2.4 GB (2625000000 B) | 3.91e+06× | 12.0 s | 0.25 | 0.812 | no | ok |" in md
    )
    assert "| dzsgd | - | - | - | - | - | - | - | - | - | failed: ValueError: a\\|b |" in md
    assert "(acc_vs_bytes.png)" in md and "(acc_vs_steps.png)" in md

    with open(compared / "results.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["algorithm"] for r in table] == ["seedflood", "dzsgd", "dsgd", "diloco"]
    assert float(table[2]["bytes_per_edge"]) == 2.625e9 and table[2]["bytes_per_edge_human"] == "2.4 GB"
    assert float(table[2]["bytes_ratio"]) == pytest.approx(2.625e9 / 672)
    assert float(table[0]["accuracy"]) == 0.75 and table[0]["bit_identical"] == "True"
    assert table[1]["status"] == "failed" and table[1]["error"] == "ValueError: a|b" and table[1]["accuracy"] == ""

    for name in ("acc_vs_bytes.png", "acc_vs_steps.png"):
        assert is_png(compared / name), name


def test_report_fills_tensorboard_from_metrics(compared: Path) -> None:
    compare_report.report(compared)
    for alg in ("seedflood", "dsgd"):
        assert event_files(compared / alg / "tb"), alg
    assert not (compared / "dzsgd" / "tb").exists()  # no metrics, nothing to show


def test_bytes_plot_places_each_score_after_its_steps(compared: Path) -> None:
    # entry i of the cumulative list is after step i (i + 1 steps): score at step 5 -> entry 4
    assert compare_report.curves(compared / "seedflood") == [(0, 0.5, 0.0), (5, 0.625, 64.0 * 5), (10, 0.75, 672.0)]
    lo, hi = compare_report.plot(compared, ["seedflood", "dzsgd", "dsgd"])
    first = 64.0 * 5  # SeedFlood's first nonzero point, 7 decades below dsgd's bytes
    assert 0 < lo <= first and lo >= first / 10, "SeedFlood's first point must show on the log axis"
    assert hi >= 2.625e9


# -- run ------------------------------------------------------------------------------------------
def test_every_algorithm_runs_the_same_config_in_its_own_dir(tmp_path: Path) -> None:
    runner = FakeRunner()
    cfg = base_cfg("zo.lr=2.0")
    outcomes = compare.run(cfg, ["seedflood", "dsgd", "choco"], tmp_path / "c", runner=runner, echo=lambda s: None)
    assert [o["status"] for o in outcomes] == ["done"] * 3
    assert runner.ran == ["seedflood", "dsgd", "choco"]
    for c in runner.configs:
        assert c.run.out_dir == str(tmp_path / "c" / c.algorithm.name)
        d, want = c.to_dict(), cfg.to_dict()
        for k in ("algorithm", "run"):
            d[k].pop("name" if k == "algorithm" else "out_dir")
            want[k].pop("name" if k == "algorithm" else "out_dir")
        assert d == want


def test_a_failing_algorithm_is_reported_and_the_rest_still_run(tmp_path: Path) -> None:
    runner = FakeRunner(fail=("dzsgd",))
    lines: list[str] = []
    out = tmp_path / "c"
    outcomes = compare.run(base_cfg(), ["seedflood", "dzsgd", "dsgd"], out, runner=runner, echo=lines.append)
    assert runner.ran == ["seedflood", "dzsgd", "dsgd"]
    assert [o["status"] for o in outcomes] == ["done", "failed", "done"]
    assert outcomes[1]["error"] == "RuntimeError: dzsgd ran out of memory"
    assert "compare: dzsgd FAILED: RuntimeError: dzsgd ran out of memory" in "\n".join(lines)
    assert "Traceback" in (out / "dzsgd" / "error.txt").read_text()
    rows = compare_report.report(out)
    assert [r["status"] for r in rows] == ["ok", "failed", "ok"]
    assert "| failed: RuntimeError: dzsgd ran out of memory |" in (out / "results.md").read_text()


def test_a_runner_that_writes_no_summary_is_a_failure(tmp_path: Path) -> None:
    outcomes = compare.run(base_cfg(), ["mezo"], tmp_path / "c", runner=lambda cfg: {}, echo=lambda s: None)
    assert outcomes[0]["status"] == "failed" and "wrote no" in outcomes[0]["error"]


def test_finished_runs_are_skipped_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "c"
    first = FakeRunner(fail=("dsgd",))
    compare.run(base_cfg(), ["seedflood", "dsgd"], out, runner=first, echo=lambda s: None)
    lines: list[str] = []
    again = FakeRunner()
    outcomes = compare.run(base_cfg("run.log_level=debug"), ["seedflood", "dsgd"], out, runner=again, echo=lines.append)
    assert again.ran == ["dsgd"], "the finished seedflood run is skipped, the failed dsgd one runs again"
    assert outcomes[0]["status"] == "skipped" and "compare: seedflood: skipped" in lines[0]

    (out / "seedflood" / "stale").write_text("from the earlier run")
    forced = FakeRunner()
    compare.run(base_cfg(), ["seedflood", "dsgd"], out, runner=forced, force=True, echo=lambda s: None)
    assert forced.ran == ["seedflood", "dsgd"]
    assert not (out / "seedflood" / "stale").exists(), "--force starts the run directory afresh"


def test_a_dir_holding_another_configs_run_is_refused_before_anything_runs(tmp_path: Path) -> None:
    out = tmp_path / "c"
    compare.run(base_cfg(), ["seedflood", "dsgd"], out, runner=FakeRunner(), echo=lambda s: None)
    runner = FakeRunner()
    with pytest.raises(compare.CompareError, match=r"dsgd holds a run of another config: zo.lr \(10.0 -> 2.0\)"):
        compare.run(base_cfg("zo.lr=2.0"), ["mezo", "dsgd"], out, runner=runner, echo=lambda s: None)
    assert runner.ran == []


def test_dispatch_sends_seedflood_to_sharedmodel_and_the_rest_to_baselines(monkeypatch) -> None:
    calls = []
    for package, name in (("roles", "sharedmodel"), ("experiments", "baselines")):
        mod = types.ModuleType(f"seedflood.{package}.{name}")
        mod.run = lambda cfg, progress=True, name=name: calls.append((name, cfg.algorithm.name, progress)) or {}
        monkeypatch.setitem(sys.modules, f"seedflood.{package}.{name}", mod)
        monkeypatch.setattr(importlib.import_module(f"seedflood.{package}"), name, mod, raising=False)
    for alg in compare_report.ALGORITHMS:
        compare.dispatch(config.load(None, [f"algorithm.name={alg}"]), progress=False)
    assert calls == [("sharedmodel", "seedflood", False)] + [
        ("baselines", a, False) for a in compare_report.ALGORITHMS[1:]
    ]


# -- the command ----------------------------------------------------------------------------------
def cli(argv: list[str]) -> int:
    """`seedflood <argv>` through a parser that holds only what compare.add_parser adds."""
    parser = argparse.ArgumentParser(prog="seedflood")
    sub = parser.add_subparsers(dest="command", required=True)
    compare.add_parser(sub)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code)
    return args.fn(args)


def test_the_command_runs_reports_and_rerenders(tmp_path: Path, monkeypatch, capsys) -> None:
    runner = FakeRunner(fail=("choco",))
    monkeypatch.setattr(compare, "dispatch", runner)
    out = tmp_path / "c"
    argv = ["compare", "--algorithms", "seedflood,dsgd,choco", "--out", str(out), "--steps", "10"]
    assert cli([*argv, "--set", "eval.every=5"]) == 1  # one algorithm failed
    assert all(c.run.steps == 10 and c.eval.every == 5 for c in runner.configs)
    text = capsys.readouterr().out
    assert "compare: choco FAILED" in text and "wrote " in text and "\nseedflood  0.75 " in text
    (out / "results.md").unlink()
    assert cli(["compare", "--report-only", "--out", str(out)]) == 0
    assert "| dsgd | 0.875 |" in (out / "results.md").read_text()
    assert cli([*argv, "--set", "eval.every=5", "--algorithms", "seedflood,dsgd"]) == 0
    assert "compare: dsgd: skipped" in capsys.readouterr().out
    assert runner.ran == ["seedflood", "dsgd", "choco"]


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--algorithms", "seedflood,sgd"], "unknown algorithm 'sgd'"),
        (["--algorithms", "dsgd,dsgd"], "names an algorithm twice"),
        (["--algorithms", ","], "name at least one"),
        (["--steps", "ten"], "--steps must be an integer"),
        (["--steps", "0"], "run.steps: must be >= 1"),
        (["--set", "zo.nope=1"], "unknown key 'zo.nope'"),
        (["--steps"], "argument --steps: expected one argument"),
        (["--report-only", "--config", "x.yaml"], "--report-only re-renders OUT and takes no --config"),
        (["--report-only", "--out", "MISSING"], "no such directory"),
        (["--report-only", "--out", "EMPTY"], "holds no algorithm run directory"),
        (["--config", "MISSING/c.yaml"], "config file .* does not exist"),
        ([], "--out DIR is required"),
    ],
)
def test_argument_errors_are_one_line_exit_2(tmp_path: Path, monkeypatch, capsys, argv, match) -> None:
    monkeypatch.setattr(compare, "dispatch", FakeRunner())
    (tmp_path / "EMPTY").mkdir()
    argv = [a.replace("MISSING", str(tmp_path / "missing")).replace("EMPTY", str(tmp_path / "EMPTY")) for a in argv]
    if "--out" not in argv and argv != [] and argv[-1] != "--steps":
        argv += ["--out", str(tmp_path / "out")]
    assert cli(["compare", *argv]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    import re

    assert re.search(match, err[0]), err[0]
    assert not (tmp_path / "out").exists(), "nothing is written for a bad invocation"
