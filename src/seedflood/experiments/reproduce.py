"""`seedflood reproduce`: the paper's grid, planned to fit a time budget on this machine, run, reported.

Owns: the command and the running of a plan (`execute`). The grid, the cost model
and the planner are reproduce_plan.py's (its docstring says how a plan is chosen); the tables,
the verdicts and the plot are reproduce_report.py's.

    DIR/plan.json          the plan: arguments, machine, costs, steps, the runs (name, algorithm,
                           overrides), expected seconds, what was left out and why
    DIR/<name>/            one `seedflood compare` directory per run (compare.run plans, skips a
        <algorithm>/       finished run, records failures); the run directory proper

The command calibrates, plans, prints the plan, stores it, runs it and writes the report. The
same command again (same arguments) reuses the stored plan without calibrating and skips every
run whose summary.json exists; other arguments into the same DIR are refused. A run that would
end past 1.25 × the budget is not started (its row says "not run").

Assumes: compare.py's run-directory contract; one run at a time (no concurrent runs per GPU).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from seedflood.core.config import runconfig as config_mod
from seedflood.core.config.runconfig import Config, ConfigError
from seedflood.experiments import budget, compare
from seedflood.experiments.reproduce_plan import (
    ALGS16,
    GROUPS,
    PLAN,
    Base,
    Plan,
    ReproduceError,
    Spec,
    calibrate,
    describe,
    eval_every,
    grid,
    load_plan,
    plan_grid,
    save_plan,
)

DEFAULT_CONFIG = "launch/configs/rt-smollm2-16.yaml"
DEFAULT_RESULTS = "docs/results.md"


def run_config(base: Base, spec: Spec, steps: int, device: str, out: Path) -> Config:
    """The config of one planned run (compare.config_for then sets its algorithm and out_dir)."""
    extra = [
        f"run.steps={steps}",
        f"eval.every={eval_every(steps)}",
        "checkpoint.every=0",
        "checkpoint.hf_model=false",
        f"model.device={device}",
        f"sim.batched={'true' if device == 'cuda' else 'false'}",
        f"run.out_dir={out / spec.name}",
    ]
    return config_mod.load(base.config, [*base.sets, *spec.overrides, *extra])


def execute(
    base: Base, plan: Plan, device: str, out: Path, budget_s: float, command: str, echo: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """Run the plan's runs in order through compare.run (finished runs are skipped); a run that
    would end past 1.25 × the budget is not started (its row says so)."""
    t0 = time.monotonic()
    outcomes = []
    for i, (spec, expected) in enumerate(zip(plan.runs, plan.seconds), 1):
        cfg = run_config(base, spec, plan.steps, device, out)
        done = (out / spec.name / spec.algorithm / "summary.json").is_file()
        spent = time.monotonic() - t0
        if not done and spent + expected > 1.25 * budget_s:
            echo(f"reproduce: {spec.name}: not started ({spent / 60:.1f} min spent, {expected / 60:.1f} min expected)")
            outcomes.append({"algorithm": spec.algorithm, "status": "not started", "name": spec.name})
            continue
        echo(
            f"reproduce: run {i}/{len(plan.runs)} {spec.name} ({expected / 60:.1f} min expected, {spent / 60:.1f} spent)"
        )
        got = compare.run(cfg, [spec.algorithm], out / spec.name, force=False, command=command, echo=echo)
        outcomes += [{**o, "name": spec.name} for o in got]
    return outcomes


# -- the command ----------------------------------------------------------------------------------
def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `reproduce` to the `seedflood` subcommands."""
    p = sub.add_parser(
        "reproduce",
        help="plan the paper's grid to fit --budget (e.g. 30m) here, run it, write docs/results.md's tables",
        description="Calibrate a step's cost on this machine, plan the largest part of the paper's grid "
        "(16 clients ring/torus against the baselines, 16-128 clients, hops per step, SubCGE rank and "
        "refresh) that fits the budget, print the plan, run it (finished runs are skipped), then write "
        "the generated section of --results-md and a plot.",
    )
    p.error = compare.one_line_error(p)  # type: ignore[method-assign]
    p.add_argument(
        "--budget",
        help="wall time to plan for, e.g. 30m, 1800s or 0.5h (required unless --report-only; a bare number is "
        "still minutes for this release)",
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--out", default="runs/reproduce", help="directory of the plan and the runs")
    p.add_argument("--config", default=DEFAULT_CONFIG, help=f"base config (default {DEFAULT_CONFIG})")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="override for every run")
    p.add_argument("--groups", default=",".join(GROUPS), help=f"comma-separated subset of {','.join(GROUPS)}")
    p.add_argument("--algorithms", default=",".join(ALGS16), help="comma-separated subset of the grid's algorithms")
    p.add_argument("--max-steps", type=int, default=5000, help="cap on the steps of a run (the paper's 5000)")
    p.add_argument("--results-md", default=DEFAULT_RESULTS, help="file whose generated section is rewritten")
    p.add_argument("--dry-run", action="store_true", help="calibrate and print the plan; run and write nothing")
    p.add_argument("--report-only", action="store_true", help="only rewrite the tables and plot from --out")
    p.set_defaults(fn=main)
    return p


def main(args: argparse.Namespace) -> int:
    """0: every planned run finished; 1: a run failed or was not started; 2: bad input (one line)."""
    from seedflood.core.topology.resolve import TopologyError
    from seedflood.experiments import reproduce_report
    from seedflood.rundir.layout import unwritable

    try:
        out = Path(args.out)
        results_md: Path | None = Path(args.results_md)
        if args.results_md == DEFAULT_RESULTS and not Path(DEFAULT_RESULTS).is_file():
            results_md = None  # not run from the repository root: only DIR's own report
        if args.report_only:
            reproduce_report.report(out, results_md, echo=print)
            return 0
        budget_s = _budget(args.budget) * 60
        device = _device(args.device)
        base = Base(args.config, tuple(args.set))
        groups = _subset(args.groups, GROUPS, "--groups")
        algorithms = _subset(args.algorithms, ALGS16, "--algorithms")
        if args.max_steps < 1:
            raise ReproduceError(f"--max-steps must be >= 1, got {args.max_steps}")
        config_mod.load(base.config, list(base.sets))  # a bad config or --set: one line, before anything
        if not args.dry_run and (why := unwritable(out)):  # before the calibration's minutes
            raise ReproduceError(f"--out {out}: {why}")
        command = "seedflood " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else ""
        key = {
            "budget_min": budget_s / 60,
            "device": device,
            "config": base.config,
            "set": list(base.sets),
            "groups": groups,
            "algorithms": algorithms,
            "max_steps": args.max_steps,
        }
        if (out / PLAN).is_file():
            plan, body = load_plan(out)
            stored = {k: body["args"].get(k) for k in key}
            if stored != key:
                diff = ", ".join(f"{k} {stored[k]!r} -> {key[k]!r}" for k in key if stored[k] != key[k])
                raise ReproduceError(f"{out} holds the plan of other arguments ({diff}): use another --out")
            print(f"reproduce: resuming the plan stored in {out / PLAN}")
        else:
            t0 = time.monotonic()
            costs = calibrate(base, device)
            budget_s -= time.monotonic() - t0  # the calibration spent part of the budget
            plan = plan_grid(grid(groups, algorithms), costs, max(budget_s, 1.0), args.max_steps)
            if not args.dry_run:
                save_plan(out, plan, costs, {**key, "command": command, **_machine(device)})
        print(describe(plan))
        if args.dry_run:
            return 0
        outcomes = execute(base, plan, device, out, budget_s, command)
        reproduce_report.report(out, results_md, echo=print)
        return 1 if any(o["status"] in ("failed", "not started") for o in outcomes) else 0
    except (ConfigError, TopologyError) as e:
        print(f"seedflood: error: {e}", file=sys.stderr)
        return 2


def _budget(text: str | None) -> float:
    """Minutes: a duration with its unit (budget.seconds), or a bare number of minutes (the old unit, for a release)."""
    if text is None:
        raise ReproduceError("--budget MINUTES is required (or --report-only)")
    try:
        float(text)
    except ValueError:
        try:
            return budget.seconds(text) / 60
        except budget.BudgetError:
            raise ReproduceError(
                f"--budget must be a number of minutes or a duration with its unit (30m, 1800s, 0.5h), got {text!r}"
            ) from None
    if not math.isfinite(float(text)) or float(text) <= 0:
        raise ReproduceError(f"--budget must be > 0 minutes, got {text}")
    return budget.seconds(text, bare_minutes=True, command="reproduce") / 60


def _device(text: str) -> str:
    if text not in ("cpu", "cuda"):
        raise ReproduceError(f"--device must be cpu or cuda, got {text!r}")
    if text == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ReproduceError("--device cuda: no CUDA device is visible to torch here")
    return text


def _subset(text: str, allowed: Sequence[str], flag: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise ReproduceError(f"{flag}: {', '.join(bad) or 'empty'} (allowed: {', '.join(allowed)})")
    return [a for a in allowed if a in names]


def _machine(device: str) -> dict[str, Any]:
    """Where the plan was made: cores, load average (a shared machine runs slower), GPU name."""
    import os

    import torch

    info: dict[str, Any] = {"cores": os.cpu_count(), "load_average": round(os.getloadavg()[0], 2)}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info
