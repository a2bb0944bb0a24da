"""The report of a `seedflood compare` directory: table rows, results.md/.csv and the plots.

Owns: reading a comparison directory back (compare.py writes it; docs/design.md's run-directory
contract) into one row per algorithm, and what `report` writes from those rows:

    DIR/results.md, results.csv, acc_vs_bytes.png, acc_vs_steps.png
    DIR/<algorithm>/tb/    back-filled from metrics.jsonl when the algorithm wrote no event files

plus the names both sides share: every algorithm in table order (`ALGORITHMS`), the record file
(`RECORD`) and the table's columns. It runs nothing, so it re-renders any time (`--report-only`).
Bytes per edge are the summary's `bytes_per_edge_run`; the accuracy-against-bytes plot places
each scoring step s at `bytes_per_edge_cumulative[s - 1]` (0 bytes at step 0, which a log axis
cannot show).

Assumes: the run-directory contract (metrics.jsonl, summary.json fields) of docs/design.md;
matplotlib (Agg canvas, no pyplot state) and tensorboardX are imported only by `report`/`plot`.
"""

from __future__ import annotations

import csv
import json
import math
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seedflood.core.config import runconfig as config_mod
from seedflood.core.config.configerror import ConfigError
from seedflood.core.config.systemsections import AlgorithmConfig
from seedflood.experiments.sweep import last_final
from seedflood.rundir.atomic import atomic_write_text
from seedflood.rundir.metrics import TENSORBOARD_DIR, event_files, export_tensorboard, human_bytes, read_metrics

ALGORITHMS: tuple[str, ...] = typing.get_args(typing.get_type_hints(AlgorithmConfig)["name"])
"""Every algorithm `algorithm.name` accepts, in table order (seedflood first)."""

RECORD = "compare.json"
"""DIR/compare.json (the base config, the algorithms, the command) and DIR/<algorithm>/compare.json
(the config it ran, status, one-line error, seconds): written by compare.run, read here."""

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
