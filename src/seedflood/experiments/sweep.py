"""Sweeps: expand a sweep file into runs, pick one run, and gather finished runs into a table.

Owns: the sweep file format, the mapping index -> (overrides, run directory), the command that
runs one configuration under torchrun (after the same `world-size` preflight as
launch/torchrun.sh), and the summary table of a sweep, read from the fields seedflood.roles.train and
the evaluator write (metrics.jsonl lines, summary.json).

A sweep file is YAML:

    base: ../configs/debug.yaml      # the config every run starts from (relative to this file)
    out_root: runs/sweep-debug       # run directories go under here (relative to the cwd)
    set: [run.steps=6]               # optional overrides applied to every run
    axes:                            # the grid; the first axis varies slowest
      topology.kind: [ring, complete]
      run.seed: [0, 1]

Run i of the grid gets the overrides of its grid point plus `run.out_dir=<out_root>/<name>`,
where name is e.g. `002_kind-complete_seed-0`. Indices are stable as long as the axes are.

Assumes: pure Python + yaml + the config module; `launch_argv` only builds a command line and
`summarize` only reads files. Errors are `SweepError` (a `ConfigError`: one line, exit status 2).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from seedflood.core.config import runconfig as config_mod
from seedflood.core.config.configerror import ConfigError
from seedflood.core.config.yamlread import read_yaml
from seedflood.rundir.metrics import read_metrics

logger = logging.getLogger(__name__)

SWEEP_KEYS = ("base", "out_root", "set", "axes")

# Columns of the summary table, in order; values missing from a run print as "-".
COLUMNS = (
    "index",
    "run",
    "status",
    "step",
    "accuracy",
    "auc",
    "loss",
    "bytes_per_edge_per_step",
    "consensus",
    "param_hash",
)


class SweepError(ConfigError):
    """A problem with a sweep file or an index; the message is one line."""


@dataclass(frozen=True)
class Sweep:
    """A parsed sweep file."""

    base: Path
    """The base config (absolute, resolved against the sweep file's directory)."""
    out_root: Path
    """Directory holding one run directory per grid point."""
    fixed: tuple[str, ...] = ()
    """`section.field=value` overrides applied to every run."""
    axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    """(section.field, values) per axis, in file order; the first varies slowest."""
    source: str = ""
    """Path of the sweep file ('' when built in code)."""

    def __len__(self) -> int:
        return math.prod(len(values) for _, values in self.axes)


@dataclass(frozen=True)
class SweepRun:
    """One grid point: what `seedflood train` gets for it."""

    index: int
    name: str
    """Directory name under out_root, e.g. `002_kind-complete_seed-0`."""
    out_dir: Path
    overrides: tuple[str, ...] = field(default_factory=tuple)
    """All `--set` values, fixed ones first, `run.out_dir=...` last."""
    point: tuple[tuple[str, Any], ...] = ()
    """(section.field, value) of this grid point only."""


def _format_value(value: Any) -> str:
    """A value as `--set` text that YAML parses back to the same value."""
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-") or "x"


def _check_key(key: Any, where: str) -> str:
    if not isinstance(key, str) or "." not in key:
        raise SweepError(f"{where}: {key!r} must look like section.field")
    section = key.partition(".")[0]
    if section not in config_mod.SECTIONS:
        raise SweepError(f"{where}: unknown section {section!r} (allowed: {', '.join(config_mod.SECTIONS)})")
    return key


def from_dict(data: Any, *, root: Path | None = None, out_root: str | Path | None = None, source: str = "") -> Sweep:
    """Validate a sweep mapping. `root` resolves `base`; `out_root` overrides the file's."""
    where = source or "sweep"
    if not isinstance(data, Mapping):
        raise SweepError(f"{where}: must be a mapping with keys {', '.join(SWEEP_KEYS)}")
    for key in data:
        if key not in SWEEP_KEYS:
            raise SweepError(f"{where}: unknown key {key!r} (allowed: {', '.join(SWEEP_KEYS)})")
    base = data.get("base")
    if not isinstance(base, str) or not base:
        raise SweepError(f"{where}: 'base' must name a config file")
    base_path = Path(base)
    if not base_path.is_absolute():
        base_path = (root or Path.cwd()) / base_path
    out = out_root if out_root is not None else data.get("out_root", "runs/sweep")
    if not isinstance(out, (str, Path)) or not str(out):
        raise SweepError(f"{where}: 'out_root' must be a directory path")
    fixed = data.get("set") or []
    if not isinstance(fixed, list) or not all(isinstance(s, str) and "=" in s for s in fixed):
        raise SweepError(f"{where}: 'set' must be a list of section.field=value strings")
    for text in fixed:
        _check_key(text.partition("=")[0].strip(), f"{where}: set")
    axes_raw = data.get("axes") or {}
    if not isinstance(axes_raw, Mapping):
        raise SweepError(f"{where}: 'axes' must map section.field to a list of values")
    axes: list[tuple[str, tuple[Any, ...]]] = []
    for key, values in axes_raw.items():
        _check_key(key, f"{where}: axes")
        if key == "run.out_dir":
            raise SweepError(f"{where}: axes: run.out_dir is set per run from out_root")
        if not isinstance(values, list) or not values:
            raise SweepError(f"{where}: axes.{key} must be a non-empty list of values")
        if any(isinstance(v, (dict, list)) for v in values):
            raise SweepError(f"{where}: axes.{key} values must be scalars")
        axes.append((key, tuple(values)))
    return Sweep(base=base_path.resolve(), out_root=Path(out), fixed=tuple(fixed), axes=tuple(axes), source=source)


def load(path: str | Path, *, out_root: str | Path | None = None) -> Sweep:
    """Read a sweep file; `base` resolves against the file's directory."""
    p = Path(path)
    data = read_yaml(p, "sweep file", SweepError)
    return from_dict(data, root=p.resolve().parent, out_root=out_root, source=str(p))


def expand(sweep: Sweep, extra: Sequence[str] = ()) -> list[SweepRun]:
    """Every grid point in index order; `extra` overrides (e.g. from --set) apply to all runs."""
    keys = [k for k, _ in sweep.axes]
    runs = []
    for index, values in enumerate(itertools.product(*(v for _, v in sweep.axes))):
        point = tuple(zip(keys, values))
        name = f"{index:03d}" + "".join(f"_{_slug(k.rpartition('.')[2])}-{_slug(_format_value(v))}" for k, v in point)
        out_dir = sweep.out_root / name
        overrides = (
            *sweep.fixed,
            *extra,
            *(f"{k}={_format_value(v)}" for k, v in point),
            f"run.out_dir={out_dir}",
        )
        runs.append(SweepRun(index=index, name=name, out_dir=out_dir, overrides=overrides, point=point))
    return runs


def run_dirs(sweep: Sweep) -> list[Path]:
    """The run directory of every grid point, in index order."""
    return [r.out_dir for r in expand(sweep)]


def select(sweep: Sweep, index: int | str | None = None, extra: Sequence[str] = ()) -> SweepRun:
    """Run `index` of the sweep; None reads $SLURM_ARRAY_TASK_ID."""
    if index is None:
        index = os.environ.get("SLURM_ARRAY_TASK_ID")
        if index is None:
            raise SweepError("no --index given and SLURM_ARRAY_TASK_ID is not set")
    try:
        i = int(index)
    except (TypeError, ValueError):
        raise SweepError(f"sweep index must be an integer, got {index!r}") from None
    n = len(sweep)
    if not 0 <= i < n:
        raise SweepError(f"sweep index {i} out of range: the sweep has {n} runs (0..{n - 1})")
    return expand(sweep, extra)[i]


def validate(sweep: Sweep, extra: Sequence[str] = ()) -> list[config_mod.Config]:
    """Load every run's config, so a bad value fails before any job starts."""
    configs = []
    for run in expand(sweep, extra):
        try:
            configs.append(config_mod.load(sweep.base, list(run.overrides)))
        except ConfigError as e:
            raise SweepError(f"sweep run {run.index} ({run.name}): {e}") from None
    return configs


def launch_argv(
    sweep: Sweep,
    run: SweepRun,
    *,
    python: str | None = None,
    module: str | None = None,
    max_restarts: int | None = None,
) -> list[str]:
    """The single-node torchrun command for one run (clients + evaluator on this machine).

    python defaults to the running interpreter, module to $SEEDFLOOD_MODULE or `seedflood`,
    max_restarts to $MAX_RESTARTS or 0.
    """
    cfg = config_mod.load(sweep.base, list(run.overrides))
    python = python or sys.executable
    module = module or os.environ.get("SEEDFLOOD_MODULE", "seedflood")
    if max_restarts is None:
        max_restarts = int(os.environ.get("MAX_RESTARTS", "0"))
    argv = [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={cfg.topology.nodes + 1}",
        f"--max-restarts={max_restarts}",
        "-m",
        module,
        "train",
        "--config",
        str(sweep.base),
    ]
    for text in run.overrides:
        argv += ["--set", text]
    return argv


def preflight_argv(sweep: Sweep, run: SweepRun, *, python: str | None = None, module: str | None = None) -> list[str]:
    """`MODULE world-size` for one run: the check launch/torchrun.sh makes before torchrun starts.

    python and module default like `launch_argv`.
    """
    python = python or sys.executable
    module = module or os.environ.get("SEEDFLOOD_MODULE", "seedflood")
    argv = [python, "-m", module, "world-size", "--config", str(sweep.base)]
    for text in run.overrides:
        argv += ["--set", text]
    return argv


def run_index(
    path: str | Path, index: int | str | None = None, *, extra: Sequence[str] = (), out_root: str | Path | None = None
) -> int:
    """`seedflood sweep FILE --index I`: run configuration I in the foreground, return its status.

    The run's config is checked first (`preflight_argv`, with its one-line error on stderr); when
    that fails, its status is returned and nothing else starts.
    """
    import subprocess

    sweep = load(path, out_root=out_root)
    run = select(sweep, index, extra)
    argv = launch_argv(sweep, run)
    checked = subprocess.run(preflight_argv(sweep, run), stdout=subprocess.DEVNULL)
    if checked.returncode != 0:
        return checked.returncode
    run.out_dir.mkdir(parents=True, exist_ok=True)
    (run.out_dir / "sweep-run.json").write_text(
        json.dumps(
            {
                "sweep": str(Path(path).resolve()),
                "index": run.index,
                "name": run.name,
                "overrides": list(run.overrides),
                "argv": argv,
            },
            indent=1,
        )
        + "\n"
    )
    logger.info("sweep run %d/%d %s: %s", run.index, len(sweep), run.name, " ".join(argv))
    return subprocess.call(argv)


def last_final(metrics: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(last score line, last line with final: true) of a metrics.jsonl; bad lines and event
    lines (a roster change: metrics.MEMBERSHIP) are skipped."""
    records = [r for r in read_metrics(metrics) if isinstance(r, dict) and "event" not in r]
    finals = [r for r in records if r.get("final") is True]
    return (records[-1] if records else None), (finals[-1] if finals else None)


# What the evaluator writes (seedflood.roles.evaluator.Evaluator.score, one line per evaluation; the last
# one has final: true and param_hash) and what the summary reads from it.
METRIC_KEYS = ("step", "accuracy", "auc", "loss", "param_hash")


def summarize(run_dirs: Sequence[str | Path], names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One row per run directory, from its metrics.jsonl and summary.json (seedflood.roles.train writes both).

    status: done (summary.json and a final metrics line), running (metrics but no final line),
    missing (nothing yet). step, accuracy, auc, loss, param_hash: the final metrics line, else the
    last one. From summary.json: consensus (every client hash equals the evaluator's: yes/no),
    clients, and bytes_per_edge_per_step (the mean over topology edges and steps; summary.json's
    bytes_per_edge is a per-edge map of run totals, not shown).
    """
    rows = []
    for i, d in enumerate(run_dirs):
        d = Path(d)
        row: dict[str, Any] = {"index": i, "run": names[i] if names else d.name, "dir": str(d)}
        last, final = last_final(d / "metrics.jsonl")
        summary: dict[str, Any] | None = None
        try:
            loaded = json.loads((d / "summary.json").read_text())
            summary = loaded if isinstance(loaded, dict) else None
        except (OSError, json.JSONDecodeError):
            summary = None
        rec = final or last or {}
        for key in METRIC_KEYS:
            if key in rec:
                row[key] = rec[key]
        if summary is not None:
            row.setdefault("param_hash", summary.get("param_hash"))
            per_step = summary.get("bytes_per_edge_per_step")
            if isinstance(per_step, (int, float)) and not isinstance(per_step, bool):
                row["bytes_per_edge_per_step"] = per_step
            hashes = summary.get("client_hashes") or []
            ok = bool(hashes) and all(h == summary.get("param_hash") for h in hashes)
            row["consensus"] = "yes" if ok else "no"
            row["clients"] = len(hashes)
        row["status"] = "done" if (final and summary is not None) else "running" if last else "missing"
        rows.append(row)
    return rows


def summarize_sweep(sweep: Sweep) -> list[dict[str, Any]]:
    """`summarize` over every run of the sweep, indexed and named like `expand`."""
    runs = expand(sweep)
    rows = summarize([r.out_dir for r in runs], [r.name for r in runs])
    for row, run in zip(rows, runs):
        row["index"] = run.index
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{16,}", value):
        return value[:12]  # a hash: enough to compare by eye
    return str(value)


def format_table(rows: Sequence[Mapping[str, Any]], fmt: str = "table", columns: Sequence[str] = COLUMNS) -> str:
    """Rows as an aligned text table (`table`), tab-separated values (`tsv`) or JSON lines (`json`)."""
    if fmt == "json":
        return "".join(json.dumps(dict(r), sort_keys=True) + "\n" for r in rows)
    if fmt not in ("table", "tsv"):
        raise SweepError(f"unknown summary format {fmt!r} (allowed: table, tsv, json)")
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    if fmt == "tsv":
        return "".join("\t".join(line) + "\n" for line in [list(columns), *cells])
    widths = [max(len(c), *(len(line[j]) for line in cells)) if cells else len(c) for j, c in enumerate(columns)]
    out = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in cells]
    return "\n".join(out) + "\n"


def all_done(rows: Sequence[Mapping[str, Any]]) -> bool:
    """True when there are rows and every run finished (sweep-summary's exit status 0)."""
    return bool(rows) and all(r.get("status") == "done" for r in rows)
