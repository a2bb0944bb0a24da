"""Sweep files: expansion, selection by index, validation, the launch command and the summary."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from seedflood.core.config.configerror import ConfigError
from seedflood.experiments import sweep
from seedflood.rundir.summary import ClientReports, FloodFigures, RunSummary

REPO = Path(__file__).resolve().parents[3]
DEBUG_SWEEP = REPO / "launch" / "sweeps" / "debug.yaml"


def write_sweep(tmp_path: Path, data: dict, name: str = "s.yaml") -> Path:
    base = tmp_path / "base.yaml"
    if not base.exists():
        base.write_text(yaml.safe_dump({"run": {"steps": 2}, "topology": {"nodes": 3}}))
    p = tmp_path / name
    p.write_text(yaml.safe_dump({"base": "base.yaml", **data}, sort_keys=False))
    return p


def test_debug_sweep_has_four_runs_with_own_dirs() -> None:
    s = sweep.load(DEBUG_SWEEP)
    runs = sweep.expand(s)
    assert len(s) == len(runs) == 4
    assert s.base == (REPO / "launch" / "configs" / "debug.yaml").resolve()
    assert [r.name for r in runs] == [
        "000_kind-ring_seed-0",
        "001_kind-ring_seed-1",
        "002_kind-complete_seed-0",
        "003_kind-complete_seed-1",
    ]
    assert len({r.out_dir for r in runs}) == 4
    assert all(r.overrides[-1] == f"run.out_dir={r.out_dir}" for r in runs)
    sweep.validate(s)


def test_first_axis_varies_slowest_and_fixed_come_first(tmp_path: Path) -> None:
    p = write_sweep(
        tmp_path, {"set": ["run.steps=3"], "out_root": "out", "axes": {"zo.lr": [0.5, 1], "run.seed": [7, 8, 9]}}
    )
    runs = sweep.expand(sweep.load(p), extra=["eval.every=1"])
    assert [r.point for r in runs][:4] == [
        (("zo.lr", 0.5), ("run.seed", 7)),
        (("zo.lr", 0.5), ("run.seed", 8)),
        (("zo.lr", 0.5), ("run.seed", 9)),
        (("zo.lr", 1), ("run.seed", 7)),
    ]
    assert runs[1].overrides == (
        "run.steps=3",
        "eval.every=1",
        "zo.lr=0.5",
        "run.seed=8",
        "run.out_dir=out/001_lr-0.5_seed-8",
    )


@pytest.mark.parametrize("value", [0, 1.5, 1e-06, True, "ring", "a b"])
def test_override_values_parse_back(value: object) -> None:
    assert yaml.safe_load(sweep._format_value(value)) == value


def test_no_axes_is_one_run(tmp_path: Path) -> None:
    s = sweep.load(write_sweep(tmp_path, {}))
    assert len(s) == 1 and sweep.expand(s)[0].name == "000"


def test_select_by_index_and_array_task_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = sweep.load(DEBUG_SWEEP)
    assert sweep.select(s, 2).name == "002_kind-complete_seed-0"
    assert sweep.select(s, "3").index == 3
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    assert sweep.select(s).index == 1
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID")
    with pytest.raises(sweep.SweepError, match="SLURM_ARRAY_TASK_ID"):
        sweep.select(s)
    with pytest.raises(sweep.SweepError, match="out of range.*4 runs"):
        sweep.select(s, 4)
    with pytest.raises(sweep.SweepError, match="integer"):
        sweep.select(s, "x")


@pytest.mark.parametrize(
    "data, match",
    [
        ({"axes": {"nosection.x": [1]}}, "unknown section"),
        ({"axes": {"seed": [1]}}, "section.field"),
        ({"axes": {"run.seed": []}}, "non-empty list"),
        ({"axes": {"run.seed": [[1]]}}, "scalars"),
        ({"axes": {"run.out_dir": ["a"]}}, "out_root"),
        ({"axes": [1, 2]}, "must map"),
        ({"set": "run.steps=1"}, "list of section.field=value"),
        ({"extra": 1}, "unknown key 'extra'"),
    ],
)
def test_bad_sweep_files(tmp_path: Path, data: dict, match: str) -> None:
    with pytest.raises(sweep.SweepError, match=match):
        sweep.load(write_sweep(tmp_path, data))


def test_missing_file_and_base(tmp_path: Path) -> None:
    with pytest.raises(sweep.SweepError, match="does not exist"):
        sweep.load(tmp_path / "nope.yaml")
    (tmp_path / "b.yaml").write_text("axes: {}\n")
    with pytest.raises(sweep.SweepError, match="'base'"):
        sweep.load(tmp_path / "b.yaml")
    assert issubclass(sweep.SweepError, ConfigError)  # the CLI maps it to exit status 2


def test_validate_names_the_bad_run(tmp_path: Path) -> None:
    s = sweep.load(write_sweep(tmp_path, {"axes": {"topology.nodes": [2, 0]}}))
    with pytest.raises(sweep.SweepError, match=r"run 1 \(001_nodes-0\).*topology.nodes"):
        sweep.validate(s)


def test_launch_argv_sizes_the_world_per_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = sweep.load(write_sweep(tmp_path, {"axes": {"topology.nodes": [2, 6]}}))
    monkeypatch.setenv("SEEDFLOOD_MODULE", "mymod")
    monkeypatch.setenv("MAX_RESTARTS", "3")
    argv = sweep.launch_argv(s, sweep.select(s, 1), python="py")
    assert argv[:6] == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=7", "--max-restarts=3"]
    assert argv[6:11] == ["-m", "mymod", "train", "--config", str(s.base)]
    assert argv[11:] == ["--set", "topology.nodes=6", "--set", f"run.out_dir={s.out_root / '001_nodes-6'}"]


def test_run_index_checks_the_run_before_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = write_sweep(tmp_path, {"out_root": str(tmp_path / "out"), "axes": {"run.seed": [0, 1]}})
    monkeypatch.setenv("SEEDFLOOD_MODULE", "mymod")
    calls: list[list[str]] = []
    status = {"preflight": 2}

    def fake_run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, status["preflight"])

    def fake_call(argv: list[str]) -> int:
        calls.append(argv)
        return 0

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(subprocess, "call", fake_call)
    loaded = sweep.load(s)
    run = sweep.select(loaded, 1)
    check = sweep.preflight_argv(loaded, run)
    assert check[:6] == [sys.executable, "-m", "mymod", "world-size", "--config", str(loaded.base)]
    assert check[6:] == ["--set", "run.seed=1", "--set", f"run.out_dir={run.out_dir}"]
    # A failing check: its status, and nothing started or written.
    assert sweep.run_index(s, 1) == 2
    assert calls == [check] and not (tmp_path / "out").exists()
    status["preflight"] = 0
    calls.clear()
    assert sweep.run_index(s, 1) == 0
    assert calls == [check, sweep.launch_argv(loaded, run)]
    assert (run.out_dir / "sweep-run.json").is_file()


SRC = REPO / "src" / "seedflood"


def _writer_keys(module: Path, function: str, variable: str) -> set[str]:
    """The literal keys of the dict `function` assigns to `variable` in `module` (`**extra` skipped)."""
    tree = ast.parse(module.read_text())
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == function:
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Assign)
                    and isinstance(node.value, ast.Dict)
                    and any(isinstance(t, ast.Name) and t.id == variable for t in node.targets)
                ):
                    return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    raise AssertionError(f"no `{variable} = {{...}}` in {module.name}:{function}")


# Values for the fields the evaluator (metrics.jsonl, Evaluator.score) and seedflood.roles.train
# (summary.json: rundir.summary.RunSummary) write; `_finished` writes exactly the fields the writers' source names
# (None where no value is given here), so a reader that relies on a field nobody writes gets nothing.
SAMPLE = {
    "step": 3,
    "accuracy": 0.5,
    "loss": 1.0,
    "auc": 0.6,
    "log_bytes": 400,
    "steps": 6,
    "clients": 2,
    "param_hash": "",
    "client_hashes": [],
    "consensus": True,
    "bytes_per_edge": {"0->1": 576, "1->0": 600},  # run totals per directed topology edge
    "bytes_per_edge_per_step": 98.0,  # (576 + 600) / 2 edges / 6 steps
    "bytes_total": 1476,
}


@cache
def metrics_keys() -> frozenset[str]:
    # Evaluator.score's record spreads Workload.scores' fields (`**m`) into its own literal keys.
    return frozenset(
        _writer_keys(SRC / "roles" / "evaluator.py", "score", "record")
        | _writer_keys(SRC / "ml" / "workload.py", "scores", "fields")
    )


def _blank(cls: type, **given: object) -> object:
    return cls(**{f.name: None for f in dataclasses.fields(cls) if f.init and f.name not in given}, **given)


@cache
def summary_keys() -> frozenset[str]:
    # A launched SeedFlood run's summary.json is a RunSummary with FloodFigures (train._evaluate):
    # its keys are those of to_dict, whatever the values.
    flood = _blank(FloodFigures, reports=_blank(ClientReports))
    summary = _blank(RunSummary, seedflood=flood, details={})
    assert isinstance(summary, RunSummary)
    return frozenset(summary.to_dict())


def test_summary_reads_what_the_writers_write() -> None:
    # The final line is score(..., final=True, param_hash=...): its extra keys come from Evaluator.run.
    assert set(sweep.METRIC_KEYS) <= metrics_keys() | {"param_hash"}
    assert {"param_hash", "client_hashes", "bytes_per_edge_per_step"} <= summary_keys()


def _finished(d: Path, hashes: list[str], param: str, final: bool = True) -> None:
    d.mkdir(parents=True)
    line = {k: SAMPLE.get(k) for k in metrics_keys()}
    lines = [line]
    if final:  # Evaluator.run: score(..., final=True, param_hash=...)
        lines.append({**line, "step": 6, "accuracy": 0.75, "auc": 0.8, "loss": 0.5, "final": True, "param_hash": param})
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 7, "acc')
    if final:
        (d / "summary.json").write_text(
            json.dumps(
                {
                    **{k: SAMPLE.get(k) for k in summary_keys()},
                    "param_hash": param,
                    "client_hashes": hashes,
                    "consensus": set(hashes) == {param},
                }
            )
        )


def test_summarize_statuses_and_consensus(tmp_path: Path) -> None:
    h = "ab" * 32
    _finished(tmp_path / "a", [h, h], h)
    _finished(tmp_path / "b", [h, "cd" * 32], h)
    _finished(tmp_path / "c", [], h, final=False)
    rows = sweep.summarize([tmp_path / x for x in "abcd"])
    assert [r["status"] for r in rows] == ["done", "done", "running", "missing"]
    assert [r.get("consensus") for r in rows] == ["yes", "no", None, None]
    assert rows[0]["accuracy"] == 0.75 and rows[0]["step"] == 6 and rows[2]["step"] == 3
    assert not sweep.all_done(rows) and sweep.all_done(rows[:2]) and not sweep.all_done([])


def test_format_table_tsv_json(tmp_path: Path) -> None:
    h = "ab" * 32
    _finished(tmp_path / "a", [h], h)
    rows = sweep.summarize([tmp_path / "a", tmp_path / "missing"], names=["first", "second"])
    table = sweep.format_table(rows).splitlines()
    assert table[0].split() == list(sweep.COLUMNS) and len(table) == 4
    assert "first" in table[2] and "0.75" in table[2] and h[:12] in table[2] and h[:13] not in table[2]
    tsv = [line.split("\t") for line in sweep.format_table(rows, "tsv").splitlines()]
    assert tsv[0] == list(sweep.COLUMNS) and len(tsv) == 3 and tsv[2][2] == "missing"
    js = [json.loads(x) for x in sweep.format_table(rows, "json").splitlines()]
    assert js[0]["param_hash"] == h
    with pytest.raises(sweep.SweepError, match="format"):
        sweep.format_table(rows, "xml")


def test_summarize_sweep_uses_sweep_names(tmp_path: Path) -> None:
    s = sweep.load(DEBUG_SWEEP, out_root=tmp_path)
    h = "ef" * 32
    _finished(tmp_path / "002_kind-complete_seed-0", [h] * 4, h)
    rows = sweep.summarize_sweep(s)
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    assert [r["status"] for r in rows] == ["missing", "missing", "done", "missing"]
    assert rows[2]["run"] == "002_kind-complete_seed-0"


def test_run_dirs_follow_out_root(tmp_path: Path) -> None:
    s = sweep.load(DEBUG_SWEEP, out_root=tmp_path)
    assert sweep.run_dirs(s) == [tmp_path / r.name for r in sweep.expand(s)]


def test_bytes_per_edge_per_step_from_summary(tmp_path: Path) -> None:
    h = "ab" * 32
    _finished(tmp_path / "r", [h, h], h)
    (row,) = sweep.summarize([tmp_path / "r"])
    assert row["bytes_per_edge_per_step"] == 98.0 and "bytes_per_edge" not in row
    assert row["status"] == "done" and row["consensus"] == "yes" and row["clients"] == 2
    table = sweep.format_table([row], "tsv").splitlines()
    assert table[1].split("\t")[table[0].split("\t").index("bytes_per_edge_per_step")] == "98"
