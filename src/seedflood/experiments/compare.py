"""`seedflood compare`: several algorithms on one config, one after another, then a table and plots.

Owns: the comparison directory and what is written into it by this module:

    DIR/compare.json             the base config, the algorithms and the command of the last run
    DIR/<algorithm>/             one run directory per algorithm (the run-directory contract):
        metrics.jsonl, summary.json, tb/   written by the algorithm (tb/ back-filled by `report`
                                           from metrics.jsonl when the algorithm wrote none)
        compare.json             written here: the config it ran, status, one-line error, seconds
        error.txt                the traceback of a failed run
    DIR/results.md, results.csv, acc_vs_bytes.png, acc_vs_steps.png     written by `report`

`run` gives every algorithm the same config (task, topology, steps, data, seed) with only
`algorithm.name` and `run.out_dir` replaced, and calls the runner: `seedflood.roles.sharedmodel.run`
for seedflood and `seedflood.experiments.baselines.run` otherwise (imported when first used). A failing
algorithm is recorded with its one-line error and the others still run. A finished run of the
same config (summary.json present, recorded config equal up to `IGNORED`) is skipped unless
`force`, which deletes DIR/<algorithm> and runs it again; a directory that holds another
config's run is refused before anything runs.

`report` runs nothing (it reads the run directories), so it re-renders any time (`--report-only`). Bytes per edge are the
summary's `bytes_per_edge_run`; the accuracy-against-bytes plot places each scoring step s at
`bytes_per_edge_cumulative[s - 1]` (0 bytes at step 0, which a log axis cannot show).

Assumes: the run-directory contract (metrics.jsonl, summary.json fields) of docs/design.md;
matplotlib (Agg canvas, no pyplot state) and tensorboardX are imported only by `report`.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import sys
import time
import traceback
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from seedflood.core import config as config_mod
from seedflood.core.config import Config
from seedflood.core.configerror import ConfigError
from seedflood.core.systemsections import AlgorithmConfig
from seedflood.core.yamlread import read_yaml
from seedflood.experiments.sweep import format_table, last_final
from seedflood.rundir.atomic import atomic_write_text
from seedflood.rundir.metrics import TENSORBOARD_DIR, event_files, export_tensorboard, human_bytes, read_metrics

ALGORITHMS: tuple[str, ...] = typing.get_args(typing.get_type_hints(AlgorithmConfig)["name"])
"""Every algorithm `algorithm.name` accepts, in table order (seedflood first)."""

IGNORED = ("run.out_dir", "run.log_level")
"""Config keys that do not make two runs different (a moved DIR is still the same run)."""

RECORD = "compare.json"
Runner = Callable[[Config], dict[str, Any]]

# Table columns: CSV field names (and the stdout table's), Markdown headers.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("algorithm", "algorithm"),
    ("accuracy", "final accuracy"),
    ("auc", "AUC"),
    ("threshold_accuracy", "dev-threshold accuracy"),
    ("bytes_per_edge", "bytes per edge"),
    ("bytes_ratio", "bytes / SeedFlood's"),
    ("wall_seconds", "wall time"),
    ("consensus_distance", "consensus distance"),
    ("worst_accuracy", "worst-client accuracy"),
    ("bit_identical", "bit-identical"),
    ("status", "status"),
)
CSV_FIELDS = (*(k for k, _ in COLUMNS[:-1]), "bytes_per_edge_human", "steps", "clients", "status", "error")


class CompareError(ConfigError):
    """A bad `seedflood compare` invocation or comparison directory; one line, exit status 2."""


# -- the comparison -------------------------------------------------------------------------------
def parse_algorithms(text: str | None) -> list[str]:
    """'seedflood,dzsgd' -> ['seedflood', 'dzsgd'] (None: all of them); unknown or repeated names,
    or a '-lora' name of an algorithm without a LoRA variant (diloco, mezo, seedflood), raise
    CompareError."""
    if text is None:
        return list(ALGORITHMS)
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise CompareError(f"--algorithms: name at least one of {', '.join(ALGORITHMS)}")
    for name in names:
        if name.endswith("-lora") and name not in ALGORITHMS and name.removesuffix("-lora") in ALGORITHMS:
            lora = ", ".join(a for a in ALGORITHMS if a.endswith("-lora"))
            raise CompareError(f"--algorithms: {name.removesuffix('-lora')} has no LoRA variant (those are: {lora})")
        if name not in ALGORITHMS:
            raise CompareError(f"--algorithms: unknown algorithm {name!r} (allowed: {', '.join(ALGORITHMS)})")
    if len(set(names)) != len(names):
        raise CompareError(f"--algorithms: {text!r} names an algorithm twice")
    return names


def config_for(cfg: Config, algorithm: str, out: Path) -> Config:
    """`cfg` with algorithm.name = `algorithm` and run.out_dir = out/algorithm, validated again."""
    data = cfg.to_dict()
    data["algorithm"]["name"] = algorithm
    data["run"]["out_dir"] = str(out / algorithm)
    return config_mod.from_dict(data, source=cfg.source)


def _identity(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config_mod.flat(data).items() if k not in IGNORED}


def recorded_config(run_dir: Path) -> dict[str, Any] | None:
    """The config a run directory ran with (its compare.json, else the config.yaml the algorithm
    wrote), as a full to_dict(); None when there is none or it cannot be read."""
    try:
        data = json.loads((run_dir / RECORD).read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        data = None
    try:
        if data is None:
            data = read_yaml(run_dir / "config.yaml")
        return config_mod.from_dict(data).to_dict()
    except ConfigError:
        return None


def _differs(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    a, b = _identity(old), _identity(new)
    return [f"{k} ({a.get(k)!r} -> {b.get(k)!r})" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def plan(cfg: Config, algorithms: Sequence[str], out: Path, force: bool = False) -> list[tuple[str, Config, str]]:
    """(algorithm, its config, 'run' | 'skip') for each algorithm. Raises CompareError, before
    anything runs, when DIR/<algorithm> holds the run of another config and `force` is off."""
    steps = []
    for alg in algorithms:
        acfg = config_for(cfg, alg, out)
        run_dir = out / alg
        action = "run"
        if run_dir.exists() and not force:
            if not run_dir.is_dir():
                raise CompareError(f"{run_dir} exists and is not a directory")
            old = recorded_config(run_dir)
            if old is not None and (diff := _differs(old, acfg.to_dict())):
                raise CompareError(
                    f"{run_dir} holds a run of another config: {', '.join(diff)}; "
                    "use --force to run it again or another --out"
                )
            if old is None and any(run_dir.iterdir()):
                raise CompareError(f"{run_dir} is not empty and records no config: use --force or another --out")
            if (run_dir / "summary.json").is_file():
                action = "skip"
        steps.append((alg, acfg, action))
    return steps


def dispatch(cfg: Config, progress: bool = True) -> dict[str, Any]:
    """Run one algorithm to its end in cfg.run.out_dir; returns its summary."""
    if cfg.algorithm.name == "seedflood":
        from seedflood.roles import sharedmodel

        return sharedmodel.run(cfg, progress=progress)
    from seedflood.experiments import baselines

    return baselines.run(cfg, progress=progress)


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _record(run_dir: Path, acfg: Config, **fields: Any) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    body = {"algorithm": acfg.algorithm.name, **fields, "config": acfg.to_dict()}
    atomic_write_text(run_dir / RECORD, json.dumps(body, indent=1, sort_keys=True) + "\n")


def run(
    cfg: Config,
    algorithms: Sequence[str],
    out: Path,
    runner: Runner = dispatch,
    force: bool = False,
    command: str = "",
    echo: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Run `algorithms` one after another (see the module doc); returns one outcome per algorithm:
    {algorithm, status: done | skipped | failed, error, seconds}. `echo` gets one line per event."""
    out = Path(out)
    steps = plan(cfg, algorithms, out, force)
    out.mkdir(parents=True, exist_ok=True)
    base = cfg.to_dict()
    base["run"]["out_dir"] = str(out)
    atomic_write_text(
        out / RECORD,
        json.dumps({"algorithms": list(algorithms), "command": command, "config": base}, indent=1) + "\n",
    )
    outcomes = []
    for i, (alg, acfg, action) in enumerate(steps, 1):
        run_dir = out / alg
        if action == "skip":
            echo(f"compare: {alg}: skipped, {run_dir} holds a finished run of this config (--force runs it again)")
            outcomes.append({"algorithm": alg, "status": "skipped", "error": None, "seconds": 0.0})
            continue
        if force and run_dir.is_dir():
            shutil.rmtree(run_dir)
        elif force and run_dir.exists():
            run_dir.unlink()
        (run_dir / "error.txt").unlink(missing_ok=True)  # a resumed run's earlier failure
        echo(f"compare: {alg} ({i}/{len(steps)}) in {run_dir}")
        _record(run_dir, acfg, status="running", error=None, seconds=None)
        t0 = time.monotonic()
        error = None
        try:
            runner(acfg)
            if not (run_dir / "summary.json").is_file():
                error = f"{alg} wrote no {run_dir / 'summary.json'}"
        except Exception as e:  # any failure of one algorithm is a row of the table
            error = one_line(e)
            (run_dir / "error.txt").write_text(traceback.format_exc())
        seconds = round(time.monotonic() - t0, 2)
        status = "failed" if error else "done"
        _record(run_dir, acfg, status=status, error=error, seconds=seconds)
        echo(f"compare: {alg} {'FAILED: ' + error if error else 'done'} ({seconds:.1f} s)")
        outcomes.append({"algorithm": alg, "status": status, "error": error, "seconds": seconds})
    return outcomes


# -- the report -----------------------------------------------------------------------------------
def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def found_algorithms(out: Path) -> list[str]:
    """The algorithms with a run directory under `out`, in table order."""
    return [a for a in ALGORITHMS if (out / a).is_dir()]


def run_row(run_dir: Path) -> dict[str, Any]:
    """One table row from a run directory (values as numbers; None where the run has none)."""
    summary = read_json(run_dir / "summary.json") or {}
    record = read_json(run_dir / RECORD) or {}
    last, final_line = last_final(run_dir / "metrics.jsonl")
    final = summary.get("final") if isinstance(summary.get("final"), dict) else (final_line or last or {})
    row: dict[str, Any] = {"algorithm": run_dir.name}
    for key in ("accuracy", "auc", "threshold_accuracy", "consensus_distance", "worst_accuracy"):
        row[key] = number(final.get(key))
        if row[key] is None and key in ("consensus_distance", "worst_accuracy"):
            row[key] = number(summary.get(key))  # a baseline's summary also carries both
    row["bytes_per_edge"] = number(summary.get("bytes_per_edge_run"))
    row["wall_seconds"] = number(summary.get("wall_seconds"))
    bit = summary.get("bit_identical")
    row["bit_identical"] = bit if isinstance(bit, bool) else None
    if row["worst_accuracy"] is None and bit is True:
        row["worst_accuracy"] = row["accuracy"]  # every client holds the same bits, so the same score
    row["steps"], row["clients"] = summary.get("steps"), summary.get("clients")
    row["error"] = record.get("error")
    if summary:
        row["status"] = "ok"
    elif record.get("status") == "failed":
        row["status"] = "failed"
    else:
        row["status"] = "incomplete"
    row["bytes_per_edge_human"] = human_bytes(row["bytes_per_edge"]) if row["bytes_per_edge"] is not None else None
    return row


def table_rows(out: Path, algorithms: Sequence[str]) -> list[dict[str, Any]]:
    """`run_row` of each algorithm plus bytes_ratio: its bytes per edge over SeedFlood's."""
    rows = [run_row(out / a) for a in algorithms]
    ref = next((r["bytes_per_edge"] for r in rows if r["algorithm"] == "seedflood"), None)
    for r in rows:
        b = r["bytes_per_edge"]
        r["bytes_ratio"] = b / ref if (b is not None and ref) else None
    return rows


def _exact(v: float) -> str:
    return f"{int(v)}" if float(v).is_integer() else f"{v:.2f}"


def md_cell(key: str, row: dict[str, Any]) -> str:
    v = row.get(key)
    if key == "status":
        text = row["status"] + (f": {row['error']}" if row.get("error") else "")
        return text.replace("|", "\\|")
    if v is None:
        return "-"
    if key == "bytes_per_edge":
        return f"{_exact(v)} B" if abs(v) < 1024 else f"{human_bytes(v)} ({_exact(v)} B)"
    if key == "bytes_ratio":
        return f"{v:.3g}×"
    if key == "wall_seconds":
        return f"{v:.1f} s"
    if key == "bit_identical":
        return "yes" if v else "no"
    if key == "consensus_distance":
        return f"{v:.3g}"  # a distance in parameter units: often small, never a fraction of 1
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v).replace("|", "\\|")


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table (COLUMNS)."""
    lines = ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(md_cell(k, r) for k, _ in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _csv_value(v: Any) -> Any:
    if v is None:
        return ""
    return repr(v) if isinstance(v, float) else v  # repr: the exact float, read back by float()


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _csv_value(r.get(k)) for k in CSV_FIELDS})


def curves(run_dir: Path) -> list[tuple[int, float, float | None]]:
    """(step, accuracy, cumulative bytes per edge after that step) at each scoring step of a run;
    bytes None when the summary has no cumulative list (or it is shorter than the step)."""
    summary = read_json(run_dir / "summary.json") or {}
    cum = summary.get("bytes_per_edge_cumulative")
    cum = cum if isinstance(cum, list) else None
    out = []
    for r in read_metrics(run_dir / "metrics.jsonl"):
        step, acc = r.get("step") if isinstance(r, dict) else None, number(r.get("accuracy"))
        if not isinstance(step, int) or isinstance(step, bool) or step < 0 or acc is None:
            continue
        if cum is None or step > len(cum):
            x = None
        else:
            x = 0.0 if step == 0 else number(cum[step - 1])  # entry i: after step i, i.e. i + 1 steps
        out.append((step, acc, x))
    return out


def color(algorithm: str) -> str:
    """The same colour for an algorithm in every plot of every comparison."""
    return f"C{ALGORITHMS.index(algorithm) % 10}" if algorithm in ALGORITHMS else "k"


def plot(out: Path, algorithms: Sequence[str]) -> tuple[float, float] | None:
    """acc_vs_bytes.png (log x: cumulative bytes per edge; points at 0 bytes cannot show) and
    acc_vs_steps.png. Returns the bytes plot's x limits (None: no run has a positive byte count)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series = {a: curves(out / a) for a in algorithms}
    series = {a: pts for a, pts in series.items() if pts}
    zero_shot = next((acc for pts in series.values() for s, acc, _ in pts if s == 0), None)

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    positive = []
    for alg, pts in series.items():
        xy = [(x, acc) for _, acc, x in pts if x is not None and x > 0]
        if xy:
            positive += [x for x, _ in xy]
            ax.plot(*zip(*xy), marker="o", markersize=3, label=alg, color=color(alg))
        else:  # mezo (no edges) or a run without a byte count: named, not drawn
            ax.plot([], [], " ", label=f"{alg}: no bytes sent" if pts[-1][2] == 0 else f"{alg}: no byte count")
    xlim = None
    if positive:
        ax.set_xscale("log")
        xlim = (min(positive) / 2, max(positive) * 2)  # every point inside, with a margin
        ax.set_xlim(*xlim)
    if zero_shot is not None:
        ax.axhline(zero_shot, color="grey", linestyle=":", linewidth=1, label="zero-shot")
    ax.set_xlabel("cumulative bytes per edge (log)")
    ax.set_ylabel("test accuracy")
    ax.set_title("accuracy against communication")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(out / "acc_vs_bytes.png", dpi=120)

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for alg, pts in series.items():
        steps, accs = [s for s, _, _ in pts], [acc for _, acc, _ in pts]
        ax.plot(steps, accs, marker="o", markersize=3, label=alg, color=color(alg))
    ax.set_xlabel("step")
    ax.set_ylabel("test accuracy")
    ax.set_title("accuracy against steps")
    ax.grid(True, alpha=0.3)
    if series:
        ax.legend(fontsize="small")
    fig.savefig(out / "acc_vs_steps.png", dpi=120)
    return xlim


def _describe(out: Path, rows: Sequence[dict[str, Any]]) -> list[str]:
    meta = read_json(out / RECORD) or {}
    lines = []
    cfg = meta.get("config")
    if isinstance(cfg, dict):
        try:
            c = config_mod.from_dict(cfg)
            lines.append(
                f"Task `{c.task.name}`, model `{c.model.name}`, {c.topology.nodes} clients on `{c.topology.kind}`, "
                f"{c.run.steps} steps, seed {c.run.seed}; the full config is in compare.json."
            )
        except ConfigError:
            pass
    if meta.get("command"):
        lines.append(f"Command: `{meta['command']}`")
    return lines


def report(out: Path, algorithms: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Write results.md, results.csv, acc_vs_bytes.png and acc_vs_steps.png from the run
    directories under `out` (default: every algorithm found there), back-fill each run's tb/
    from its metrics.jsonl when it has no event files, and return the rows."""
    out = Path(out)
    algorithms = list(algorithms) if algorithms is not None else found_algorithms(out)
    rows = table_rows(out, algorithms)
    for alg in algorithms:
        metrics = out / alg / "metrics.jsonl"
        if metrics.is_file() and not event_files(out / alg / TENSORBOARD_DIR):
            export_tensorboard(read_metrics(metrics), out / alg / TENSORBOARD_DIR)
    write_csv(out / "results.csv", rows)
    plot(out, algorithms)
    text = [
        "# seedflood compare",
        "",
        *_describe(out, rows),
        "",
        markdown(rows),
        "Final accuracy, AUC and dev-threshold accuracy are the last scoring of the run (gossip "
        "algorithms: the clients' average model). Bytes per edge: mean over directed topology edges "
        "of the bytes one edge carried in the whole run (exact count in brackets). Worst-client "
        "accuracy of a bit-identical run is its accuracy."
        + (
            " A `-lora` algorithm trains and sends only LoRA adapters (its bytes are those of the "
            "adapter vector); the base weights stay frozen and the same on every client."
            if any(a.endswith("-lora") for a in algorithms)
            else ""
        ),
        "",
        "![accuracy against cumulative bytes per edge](acc_vs_bytes.png)",
        "",
        "![accuracy against steps](acc_vs_steps.png)",
        "",
    ]
    atomic_write_text(out / "results.md", "\n".join(text))
    return rows


# -- the command ----------------------------------------------------------------------------------
def one_line_error(parser: argparse.ArgumentParser) -> Callable[[str], typing.NoReturn]:
    def error(message: str) -> typing.NoReturn:
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)

    return error


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `compare` to the `seedflood` subcommands (`sub` from add_subparsers)."""
    p = sub.add_parser(
        "compare",
        help="run several algorithms on one config, then tabulate and plot them (results.md)",
        description="Run the chosen algorithms one after another on the same config, each in "
        "OUT/<algorithm>, then write OUT/results.md, results.csv, acc_vs_bytes.png, acc_vs_steps.png.",
    )
    p.error = one_line_error(p)  # type: ignore[method-assign]  # argument errors: one line, exit 2
    p.add_argument("--config", help="run config YAML (defaults when omitted)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="override a config value")
    p.add_argument("--algorithms", help=f"comma-separated, in order (default: {','.join(ALGORITHMS)})")
    p.add_argument("--out", help="comparison directory (required)")
    p.add_argument("--steps", help="run.steps for every algorithm")
    p.add_argument("--force", action="store_true", help="run again algorithms whose finished run is in OUT")
    p.add_argument("--report-only", action="store_true", help="only re-render the table and plots from OUT")
    p.set_defaults(fn=main)
    return p


def main(args: argparse.Namespace) -> int:
    """`seedflood compare`: 0 when every algorithm ran (or was skipped), 1 when one failed, 2 (one
    line on stderr) for a bad invocation."""
    from seedflood.core.graph import TopologyError

    try:
        return _main(args)
    except (ConfigError, TopologyError) as e:
        print(f"seedflood: error: {e}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    if not args.out:
        raise CompareError("--out DIR is required")
    out = Path(args.out)
    if args.report_only:
        extra = [f for f, v in (("--config", args.config), ("--set", args.set), ("--steps", args.steps)) if v]
        if extra or args.force:
            raise CompareError(f"--report-only re-renders OUT and takes no {(extra or ['--force'])[0]}")
        if not out.is_dir():
            raise CompareError(f"--out {out}: no such directory")
        algorithms = parse_algorithms(args.algorithms) if args.algorithms else found_algorithms(out)
        if not algorithms:
            raise CompareError(f"{out} holds no algorithm run directory ({', '.join(ALGORITHMS)})")
        rows = report(out, algorithms)
        _print(out, rows)
        return 0
    overrides = list(args.set or [])
    if args.steps is not None:
        try:
            steps = int(args.steps)
        except ValueError:
            raise CompareError(f"--steps must be an integer, got {args.steps!r}") from None
        overrides.append(f"run.steps={steps}")
    cfg = config_mod.load(args.config, overrides)
    algorithms = parse_algorithms(args.algorithms)
    from seedflood.rundir import resume as rundir

    rundir.topology_of(cfg)  # a bad topology is one line now, not the same failure in every row
    outcomes = run(cfg, algorithms, out, runner=dispatch, force=args.force, command=_command())
    rows = report(out, algorithms)
    _print(out, rows)
    return 1 if any(o["status"] == "failed" for o in outcomes) else 0


def _command() -> str:
    import shlex

    return "seedflood " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else ""


def _print(out: Path, rows: Sequence[dict[str, Any]]) -> None:
    shown = [{**r, "bytes_per_edge": r["bytes_per_edge_human"]} for r in rows]
    print(format_table(shown, "table", columns=[k for k, _ in COLUMNS]), end="")
    print(f"wrote {out / 'results.md'}, results.csv, acc_vs_bytes.png, acc_vs_steps.png")


__all__ = [
    "ALGORITHMS",
    "CompareError",
    "add_parser",
    "config_for",
    "dispatch",
    "main",
    "plan",
    "report",
    "run",
]
