"""`seedflood compare`: several algorithms on one config, one after another, then a table and plots.

Owns: the comparison directory, the command, and what this module writes into it:

    DIR/compare.json             the base config, the algorithms and the command of the last run
    DIR/<algorithm>/             one run directory per algorithm (the run-directory contract):
        metrics.jsonl, summary.json, tb/   written by the algorithm (tb/ back-filled by `report`
                                           from metrics.jsonl when the algorithm wrote none)
        compare.json             written here: the config it ran, status, one-line error, seconds
        error.txt                the traceback of a failed run
    DIR/results.md, results.csv, acc_vs_bytes.png, acc_vs_steps.png     written by `report`
                                                                          (compare_report.py)

`run` gives every algorithm the same config (task, topology, steps, data, seed) with only
`algorithm.name` and `run.out_dir` replaced, and calls the runner: `seedflood.roles.sharedmodel.run`
for seedflood and `seedflood.experiments.baselines.run` otherwise (imported when first used). A failing
algorithm is recorded with its one-line error and the others still run. A finished run of the
same config (summary.json present, recorded config equal up to `IGNORED`) is skipped unless
`force`, which deletes DIR/<algorithm> and runs it again; a directory that holds another
config's run is refused before anything runs.

The table, results.md/.csv and the plots are compare_report.py's (`report`, which runs nothing, so
`--report-only` re-renders any time).

Assumes: the run-directory contract (metrics.jsonl, summary.json fields) of docs/design.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import traceback
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from seedflood.core.config import runconfig as config_mod
from seedflood.core.config.configerror import ConfigError
from seedflood.core.config.runconfig import Config
from seedflood.core.config.yamlread import read_yaml
from seedflood.experiments.compare_report import ALGORITHMS, COLUMNS, RECORD, found_algorithms, report
from seedflood.experiments.sweep import format_table
from seedflood.rundir.atomic import atomic_write_text

if typing.TYPE_CHECKING:
    from seedflood.rundir.summary import RunSummary

IGNORED = ("run.out_dir", "run.log_level")
"""Config keys that do not make two runs different (a moved DIR is still the same run)."""

Runner = Callable[[Config], object]
"""Runs one algorithm into cfg.run.out_dir; what it returns is not read (summary.json is)."""


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


def dispatch(cfg: Config, progress: bool = True) -> RunSummary:
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
    from seedflood.core.topology.graph import TopologyError

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
    from seedflood.core.topology.resolve import topology_of

    topology_of(cfg)  # a bad topology is one line now, not the same failure in every row
    from seedflood.rundir.layout import unwritable

    if why := unwritable(out):  # a file there: one line now, not a traceback from the first row
        raise CompareError(f"--out {out}: {why}")
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
    "CompareError",
    "add_parser",
    "config_for",
    "dispatch",
    "main",
    "plan",
    "run",
]
