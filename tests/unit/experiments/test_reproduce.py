"""`seedflood reproduce`: the planner fits the budget and grows monotonically with it, a tiny run
of the real algorithms (debug model) writes the tables and plot, --report-only rewrites the same
text, a second run skips finished runs, and bad input is one line with exit status 2. The hub
configs stop at the missing download with one line naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedflood import cli
from seedflood.experiments import reproduce, reproduce_report
from seedflood.experiments import reproduce_plan as rp
from seedflood.experiments.reproduce_plan import Costs, ReproduceError, grid, plan_grid, run_seconds

ROOT = Path(__file__).resolve().parents[3]
DEBUG = str(ROOT / "launch" / "configs" / "debug.yaml")
HUB_CONFIGS = sorted((ROOT / "launch" / "configs").glob("*-opt*.yaml"))

# SmolLM2-like primitives on a slow CPU: 3.6 s a forward, 0.1 s a scored example, 1 s a frame.
CPU = Costs("cpu", 3.6, 0.1, 1.0, 20.0, 106_168_320, 460_800, 700, 500, 20 * 2**30)


def test_grid_holds_the_papers_four_items_once_each() -> None:
    specs = {s.name: s for s in grid()}
    assert len(specs) == len(grid())  # no run twice
    sf = specs["ring16-seedflood"]
    assert sf.tier == 1 and set(sf.groups) == {"ring16", "scale", "hops", "subcge"}
    assert {s.algorithm for s in grid() if s.name.startswith("ring16-")} == set(rp.ALGS16)
    assert {s.algorithm for s in grid() if s.name.startswith("torus16-")} == set(rp.ALGS16)
    assert specs["torus16-dsgd"].degree == 4 and "topology.rows=4" in specs["torus16-dsgd"].overrides
    assert {n for n in (32, 64, 128) for a in ("seedflood", "dsgd", "dzsgd", "choco") if f"ring{n}-{a}" in specs} == {
        32,
        64,
        128,
    }
    assert sorted(k for k in specs if k.startswith("hops")) == ["hops1-seedflood", "hops2-seedflood", "hops4-seedflood"]
    assert "flood.hops_per_step=4" in specs["hops4-seedflood"].overrides
    assert {s.tier for s in grid() if s.name in ("ring16-dsgd", "ring16-dzsgd", "ring16-choco-lora")} == {1}
    only = grid(["hops"], ["seedflood", "dsgd"])
    assert [s.name for s in only] == ["ring16-seedflood", "hops4-seedflood", "hops1-seedflood", "hops2-seedflood"]
    tier2 = [s.name for s in grid() if s.tier == 2]  # the questions' runs first, then cheap before costly
    assert tier2[:2] == ["ring128-seedflood", "hops4-seedflood"] and tier2[-2:] == ["ring16-choco", "ring16-diloco"]


def test_cost_model_counts_forwards_frames_and_scoring() -> None:
    specs = {s.name: s for s in grid()}
    f, g = CPU.forward, CPU.frame
    assert rp.step_seconds(specs["ring16-seedflood"], CPU) == pytest.approx(32 * f)
    assert rp.step_seconds(specs["ring16-dzsgd"], CPU) == pytest.approx(16 * (2 * f + 2 * g))
    assert rp.step_seconds(specs["ring16-dsgd"], CPU) == pytest.approx(16 * (3 * f + 2 * g))
    lora = rp.step_seconds(specs["ring16-dsgd-lora"], CPU)
    assert lora == pytest.approx(16 * (3 * f + 2 * g * 460_800 / 106_168_320))
    cuda = Costs(**{**CPU.__dict__, "device": "cuda"})
    assert rp.step_seconds(specs["ring16-seedflood"], cuda) < rp.step_seconds(specs["ring16-seedflood"], CPU)
    # 10 steps: scorings at 0 and 10; a gossip run also scores every client on test at the end
    assert run_seconds(specs["ring16-seedflood"], 10, CPU) == pytest.approx(20 + 10 * 32 * f + 2 * 700 * 0.1)
    gossip = run_seconds(specs["ring16-dsgd"], 10, CPU)
    assert gossip == pytest.approx(20 + 10 * 16 * (3 * f + 2 * g) + (2 * 700 + 16 * 500) * 0.1)


BUDGETS_MIN = (12, 20, 40, 90, 240, 1000, 10_000, 100_000)


def test_the_plan_fits_the_budget_and_grows_monotonically_with_it() -> None:
    plans = [plan_grid(grid(), CPU, m * 60) for m in BUDGETS_MIN]
    for minutes, plan in zip(BUDGETS_MIN, plans):
        assert plan.total <= minutes * 60
        assert plan.seconds == [run_seconds(s, plan.steps, CPU) for s in plan.runs]
        assert all(s.tier == 1 or plan.steps >= rp.MIN_STEPS[s.tier] for s in plan.runs)
    for small, large in zip(plans, plans[1:]):
        assert small.steps <= large.steps
        assert {s.name for s in small.runs} <= {s.name for s in large.runs}
    assert plans[0].steps < plans[-1].steps and len(plans[0].runs) < len(plans[-1].runs)
    # the largest step count that fits: one more step would not
    p = plans[3]
    fits = [s for s in grid() if rp.memory_bytes(s, CPU) <= rp.MEMORY_USE * CPU.memory]
    admitted = [s for s in fits if rp.MIN_STEPS[s.tier] <= p.steps + 1]
    assert set(p.runs) <= set(admitted) and sum(run_seconds(s, p.steps + 1, CPU) for s in admitted) > 90 * 60
    assert plan_grid(grid(), CPU, 10**9, max_steps=300).steps == 300


def test_a_budget_below_one_step_of_the_core_plans_a_prefix_or_refuses() -> None:
    core = [s for s in grid() if s.tier == 1]
    one = run_seconds(core[0], 1, CPU)
    plan = plan_grid(grid(), CPU, one + 1)
    assert plan.steps == 1 and [s.name for s in plan.runs] == ["ring16-seedflood"]
    assert any("over the budget" in why for why in plan.left_out)
    with pytest.raises(ReproduceError, match="below the smallest plan"):
        plan_grid(grid(), CPU, one / 2)
    with pytest.raises(ReproduceError, match="must be > 0"):
        plan_grid(grid(), CPU, 0)


def test_runs_whose_client_vectors_do_not_fit_memory_are_left_out() -> None:
    small = Costs(**{**CPU.__dict__, "memory": 8 * 2**30})  # 16 full-parameter vectors × 3 = 19 GiB
    plan = plan_grid(grid(), small, 10**9, max_steps=50)
    names = {s.name for s in plan.runs}
    assert "ring16-seedflood" in names and "ring128-seedflood" in names and "ring16-dsgd-lora" in names
    assert "ring16-dsgd" not in names and "ring32-dzsgd" not in names
    assert any(why.startswith("ring16-dsgd: needs") and "GiB" in why for why in plan.left_out)


# -- the command, end to end on the debug model ------------------------------------------------------
TINY = Costs("cpu", 0.01, 0.001, 0.001, 1.0, 73_728, 4_096, 128, 64, 16 * 2**30)
HAND = "# Results\n\nHand-written text before.\n\n## The grid\n\n{begin}\nold\n{end}\n\nHand-written text after.\n"


@pytest.fixture
def fixed_costs(monkeypatch) -> list[str]:
    """calibrate returns TINY without loading anything; the list records its calls."""
    calls: list[str] = []

    def fake(base, device, echo=print):
        calls.append(device)
        return TINY

    monkeypatch.setattr(reproduce, "calibrate", fake)
    return calls


def argv(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "reproduce",
        "--config",
        DEBUG,
        "--out",
        str(tmp_path / "rep"),
        "--results-md",
        str(tmp_path / "results.md"),
        "--groups",
        "ring16",
        "--algorithms",
        "seedflood,dsgd",
        "--max-steps",
        "2",
        *extra,
    ]


def test_a_tiny_reproduce_writes_tables_resumes_and_rerenders(tmp_path: Path, fixed_costs, capsys) -> None:
    md = tmp_path / "results.md"
    md.write_text(HAND.format(begin=reproduce_report.BEGIN, end=reproduce_report.END))
    assert cli.main(argv(tmp_path, "--budget", "5", "--dry-run")) == 0
    out = capsys.readouterr().out
    assert "plan: 2 runs of 2 steps each" in out and "ring16-dsgd" in out
    assert not (tmp_path / "rep").exists() and "old" in md.read_text()  # a dry run writes nothing

    assert cli.main(argv(tmp_path, "--budget", "5")) == 0
    rep = tmp_path / "rep"
    text = md.read_text()
    assert text.startswith("# Results\n\nHand-written text before.") and text.endswith("Hand-written text after.\n")
    assert "\nold\n" not in text and text.count(reproduce_report.BEGIN) == 1
    rows = [line for line in text.splitlines() if line.startswith("| seedflood | ring16") or "| dsgd | ring16" in line]
    assert len(rows) == 2 and all("| 2 |" in r and " ± " in r for r in rows)  # steps and s.e. on each row
    assert "| 1.000 |" in rows[1]  # dsgd normalised to itself
    assert "SeedFlood ≥ DZSGD (16, ring): not run" in text
    assert "Training itself: SeedFlood (16, ring) moved accuracy" in text
    png = tmp_path / "results" / "reproduce.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (rep / "reproduce.png").is_file()
    assert json.loads((rep / "plan.json").read_text())["steps"] == 2
    summaries = {p: p.stat().st_mtime_ns for p in rep.glob("*/*/summary.json")}
    assert len(summaries) == 2

    # again: the stored plan is reused (no calibration), both finished runs are skipped
    capsys.readouterr()
    assert cli.main(argv(tmp_path, "--budget", "5")) == 0
    out = capsys.readouterr().out
    assert (
        "resuming the plan" in out and out.count("skipped") == 2 and fixed_costs == ["cpu", "cpu"]
    )  # dry run, first run; none now
    assert {p: p.stat().st_mtime_ns for p in rep.glob("*/*/summary.json")} == summaries
    assert md.read_text() == text

    # --report-only rewrites the same section from the run directories alone
    md.write_text(HAND.format(begin=reproduce_report.BEGIN, end=reproduce_report.END))
    assert cli.main(["reproduce", "--report-only", "--out", str(rep), "--results-md", str(md)]) == 0
    assert md.read_text() == text

    # other arguments into the same directory: refused, nothing run
    assert cli.main(argv(tmp_path, "--budget", "6")) == 2
    assert "holds the plan of other arguments (budget_min 5.0 -> 6.0)" in capsys.readouterr().err


def test_verdicts_tell_apart_only_beyond_two_standard_errors() -> None:
    def row(p: float, n: int = 500) -> dict:
        return {"accuracy": p, "se": (p * (1 - p) / n) ** 0.5}

    assert "**yes**" in reproduce_report.at_least(row(0.85), row(0.75), "x")
    assert "**no**" in reproduce_report.at_least(row(0.70), row(0.80), "x")
    assert "not enough steps to tell" in reproduce_report.at_least(row(0.76), row(0.75), "x")
    assert "not run" in reproduce_report.at_least(None, row(0.75), "x")
    hops = {"ring16-seedflood": row(0.80), "hops4-seedflood": row(0.79), "hops1-seedflood": row(0.70)}
    assert "**yes**" in reproduce_report.hops_verdict(hops)
    hops["hops1-seedflood"] = row(0.79)
    assert "not enough steps to tell" in reproduce_report.hops_verdict(hops)
    hops["hops4-seedflood"] = row(0.70)
    assert "**no**" in reproduce_report.hops_verdict(hops)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--budget", "0"], "--budget must be > 0 minutes"),
        (["--budget", "-3"], "--budget must be > 0 minutes"),
        (["--budget", "soon"], "--budget must be a number of minutes"),
        ([], "--budget MINUTES is required"),
        (["--budget", "5", "--device", "tpu"], "--device must be cpu or cuda"),
        (["--budget", "5", "--groups", "ring16,mesh"], "--groups: mesh"),
        (["--budget", "5", "--set", "zo.lr=-1"], "zo.lr"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, fixed_costs, capsys, extra, match) -> None:
    assert cli.main(argv(tmp_path, *extra)) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("seedflood: error: ") and match in err[0], err
    assert not (tmp_path / "rep").exists() and fixed_costs == []


def test_report_only_needs_a_plan(tmp_path: Path, capsys) -> None:
    assert cli.main(["reproduce", "--report-only", "--out", str(tmp_path)]) == 2
    assert "no readable plan" in capsys.readouterr().err


def test_calibration_measures_this_machine(tmp_path: Path) -> None:
    c = reproduce.calibrate(rp.Base(DEBUG), "cpu", echo=lambda _: None)
    assert c.forward > 0 and c.example > 0 and c.frame >= 0 and c.setup > 0
    assert c.trainable > c.lora > 0 and c.test == 64 and c.scored == 64 + 64 and c.memory > 0


@pytest.mark.parametrize("path", HUB_CONFIGS, ids=lambda p: p.stem)
def test_hub_configs_stop_at_the_missing_download_in_one_line(path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert len(HUB_CONFIGS) == 6
    assert cli.main(["world-size", "--config", str(path)]) == 2  # the model first
    err = capsys.readouterr().err.strip().splitlines()
    model = path.stem.split("-")[1].replace("opt", "opt-")
    assert len(err) == 1 and f"facebook/{model}" in err[0] and "HF_HUB_OFFLINE" in err[0], err
    # with a local model, the dataset is the missing download
    assert cli.main(["world-size", "--config", str(path), "--set", "model.name=tiny"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("aps/super_glue" in err[0] or "nyu-mll/glue" in err[0]), err


def test_reproduce_on_a_hub_config_stops_at_the_download(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = str(ROOT / "launch" / "configs" / "sst2-opt125m.yaml")
    assert cli.main(["reproduce", "--config", config, "--budget", "5", "--out", str(tmp_path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "facebook/opt-125m" in err[0], err


def fake_run(out: Path, spec: rp.Spec, accuracy: float, steps: int = 10) -> None:
    """A finished run directory as baselines.py / sharedmodel.py leave it (the contract's fields)."""
    run_dir = out / spec.name / spec.algorithm
    run_dir.mkdir(parents=True)
    final = {"step": steps, "accuracy": accuracy, "auc": 0.9, "threshold_accuracy": accuracy, "final": True}
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "accuracy": 0.75}) + "\n" + json.dumps(final) + "\n")
    summary = {"steps": steps, "clients": spec.clients, "final": final, "zero_shot": {"accuracy": 0.75}}
    (run_dir / "summary.json").write_text(json.dumps({**summary, "bytes_per_edge_run": 800.0, "wall_seconds": 5.0}))


def test_the_report_fills_all_four_tables_and_answers_from_the_runs(tmp_path: Path) -> None:
    specs = {s.name: s for s in grid()}
    plan = rp.Plan(10, list(specs.values()), [60.0] * len(specs))
    rp.save_plan(tmp_path, plan, CPU, {"device": "cpu", "command": "seedflood reproduce --budget 9"})
    accuracy = {  # n = 500 test examples: s.e. ≈ 0.018, so 0.05 apart is told apart, 0.01 is not
        "ring16-seedflood": 0.82,
        "ring16-dsgd": 0.80,
        "ring16-dzsgd": 0.70,
        "ring16-choco-lora": 0.81,
        "ring128-seedflood": 0.83,
        "hops1-seedflood": 0.70,
        "hops4-seedflood": 0.815,
        "rank8-seedflood": 0.78,
    }
    for name, p in accuracy.items():
        fake_run(tmp_path, specs[name], p)
    md = tmp_path / "results.md"
    reproduce_report.report(tmp_path, md, echo=lambda _: None)
    text = md.read_text()
    assert "| seedflood | ring16 | 10 | 0.820 ± 0.017 | 1.025 |" in text  # normalised to DSGD's 0.80
    assert "| dzsgd | ring16 | 10 | 0.700 ± 0.020 | 0.875 |" in text
    assert "| diloco | ring16 | (10 planned) | - | - |" in text  # planned, never run: said so
    assert "| seedflood | 128 | 10 | 0.830 ± 0.017 | ok |" in text and "| dsgd | 128 |" in text
    assert "| 8 = diameter | 10 | 0.820 ± 0.017 |" in text and "| 1 | 10 | 0.700 ± 0.020 |" in text
    assert "| rank8 | 10 | 0.780 ± 0.019 | ok |" in text and "| the config's rank and refresh | 10 |" in text
    assert "SeedFlood ≥ DZSGD (16, ring): **yes** (Δ = +0.120" in text
    assert "SeedFlood ≥ ChocoSGD-LoRA (16, ring): **not enough steps to tell** (Δ = +0.010" in text
    assert "SeedFlood at 128 clients ≥ at 16 (equal steps): **not enough steps to tell**" in text
    assert "4+ hops per step ≈ the diameter: **yes**" in text and "while 1 hop(s) score lower" in text
    assert "moved accuracy +0.070 from its zero-shot 0.750 in 10 steps" in text
    assert "Command: `seedflood reproduce --budget 9`" in text and "n = 500 test examples" in text
    rows = (tmp_path / "reproduce.csv").read_text().splitlines()
    assert len(rows) == 1 + len(specs) and rows[1].startswith("ring16-seedflood,seedflood,16,10,0.82,")
