"""Unequal speeds benchmark (`python -m seedflood.bench.speeds`): what zo.stride buys when a few clients are slower.

Runs the debug config (launch/configs/debug.yaml: tiny random Llama, synthetic task) on a ring of
--clients through the in-process runtime (`roles.inprocess.simulate`: one thread per client, the
real client loop, flood and in-memory transport), strict, in three runs:

1. equal          — every client sleeps --forward-s before each forward (its emulated device);
2. slow           — the --slow highest node ids sleep --factor × that (a slower device), no stride;
3. slow + stride  — the same, with zo.stride {slow node: --stride} (they originate only on
                    steps s % stride == 0, so on the others they run no forward and no sleep).

each once with flood.overlap off and once on (the hops of step t run during step t+1's
estimates, so a client may be one step ahead of a neighbour). The sleep is the pace of
`run.step_delay_s` (a launched client's emulated device, roles/train.py), given per node
(`simulate(pace=...)`); the tiny model's own forwards are short beside it. For each run: steps
per second of the step loop (wall time less the time to build the clients' workloads, measured
once beforehand), that rate against the equal run's with the same overlap, and the mean train
loss (the whole train split) of the final model after the same number of steps. A two-step run
first warms the process up (not timed). `slow` holds
the bits of `equal` (a pace never changes a bit), which is checked. Nothing here asserts a
figure: these are measurements, printed.

    HF_HUB_OFFLINE=1 .venv/bin/python -m seedflood.bench.speeds [--steps 30] [--clients 8] [--slow 2]
        [--factor 3] [--stride 3] [--forward-s 0.03] [--launched] [--set section.key=value ...] [--out f.json]

`--launched`: each run is one real launch/torchrun.sh run instead (bench/speedslaunched.py; the
rate is the evaluator's log growth after start-up; no train loss).

Assumes: run from the repository root (or --config); torch on CPU with one intra-op thread; the
machine's load adds noise to every rate (rerun to see how much).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from seedflood.bench import speedslaunched
from seedflood.bench.common import add_run_args, figure_process, train_loss, write_json
from seedflood.core.config import runconfig as config
from seedflood.core.config.runconfig import Config
from seedflood.ml.workload import Workload
from seedflood.roles.inprocess import simulate

DEBUG = Path("launch/configs/debug.yaml")  # --config, relative to the working directory


def build_seconds(cfg: Config) -> float:
    """What building every client's workload takes (simulate does it before the first step)."""
    t0 = time.perf_counter()
    for _ in range(cfg.topology.nodes):
        Workload.build(cfg)
    return time.perf_counter() - t0


def one_run(cfg: Config, pace: dict[int, float], setup_s: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    r = simulate(cfg, hash_every_step=False, pace=pace)
    wall = time.perf_counter() - t0
    hashes = set(r.hashes.values())
    if len(hashes) != 1:
        raise RuntimeError(f"clients differ at the end: {sorted(hashes)}")
    loop = max(1e-9, wall - setup_s)
    return {
        "steps": cfg.run.steps,
        "wall_s": wall,
        "loop_s": loop,
        "steps_per_s": cfg.run.steps / loop,
        "messages": sum(len(m) for _, m in r.records),
        "train_loss": train_loss(r.workloads[0]),
        "hash": hashes.pop(),
    }


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="steps of each run (default 30)")
    ap.add_argument("--clients", type=int, default=8, help="clients on the debug ring (default 8)")
    ap.add_argument("--slow", type=int, default=2, help="how many clients are slower (default 2)")
    ap.add_argument("--factor", type=float, default=3.0, help="how much slower their forwards are (default 3)")
    ap.add_argument("--stride", type=int, default=3, help="zo.stride m of the slow clients (default 3)")
    ap.add_argument("--forward-s", type=float, default=0.03, help="an equal client's emulated forward (default 0.03)")
    ap.add_argument(
        "--launched",
        action="store_true",
        help="each run a real launch/torchrun.sh run (a process per client, gloo), not in process",
    )
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a launched run may take (default 600)")
    add_run_args(ap, DEBUG)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.steps < 1 or args.clients < 3 or not 1 <= args.slow < args.clients or args.stride < 1:
        ap.error("need --steps >= 1, --clients >= 3, 1 <= --slow < --clients and --stride >= 1")
    if not (math.isfinite(args.factor) and args.factor >= 1 and math.isfinite(args.forward_s) and args.forward_s >= 0):
        ap.error("need a finite --factor >= 1 and a finite --forward-s >= 0")
    with figure_process(ap, args.config):
        return _measure(args)


def _measure(args: argparse.Namespace) -> int:
    n, f = args.clients, args.forward_s
    slow = list(range(n - args.slow, n))
    base = [f"run.steps={args.steps}", f"topology.nodes={n}", "run.threads=1", *args.set]
    stride = "zo.stride={" + ", ".join(f"{o}: {args.stride}" for o in slow) + "}"
    equal = {i: f for i in range(n)}
    unequal = {i: f * (args.factor if i in slow else 1.0) for i in range(n)}
    print(
        f"seedflood.bench.speeds: {args.config} with {' '.join(base)}; {n} clients, nodes {slow} "
        f"{args.factor:g}x slower (forward {f:g} s vs {f * args.factor:g} s), stride {args.stride}"
    )
    if args.launched:
        with speedslaunched.Launcher(args.config, args.timeout) as launch:
            figures = _runs(args, base, stride, equal, unequal, launch)
        return _report(args, figures, ["overlap", "steps_per_s", "of_equal_rate", "startup_s"], {})
    simulate(config.load(args.config, [*base, "run.steps=2"]), hash_every_step=False)  # warm-up, not timed
    setup = build_seconds(config.load(args.config, base))
    print(f"  building {n} workloads: {setup:.2f} s (subtracted from each run's wall time)", flush=True)

    def in_process(sets: list[str], pace: dict[int, float]) -> dict[str, Any]:
        return one_run(config.load(args.config, sets), pace, setup)

    figures = _runs(args, base, stride, equal, unequal, in_process)
    return _report(
        args, figures, ["overlap", "steps_per_s", "of_equal_rate", "messages", "train_loss"], {"setup_s": setup}
    )


Run = Callable[[list[str], dict[int, float]], dict[str, Any]]
"""One measured run of the config with these overrides, each client paced by its seconds."""


def _runs(
    args: argparse.Namespace,
    base: list[str],
    stride: str,
    equal: dict[int, float],
    unequal: dict[int, float],
    run: Run,
) -> list[dict[str, Any]]:
    """The equal, slow and slow + stride runs, with flood.overlap off and on, each against the
    equal run's rate with the same overlap; `slow` must hold `equal`'s bits."""
    figures: list[dict[str, Any]] = []
    for overlap in (False, True):
        sets = [*base, f"flood.overlap={str(overlap).lower()}"]
        rows = []
        for name, extra, pace in [("equal", [], equal), ("slow", [], unequal), ("slow + stride", [stride], unequal)]:
            row = {"run": name, "overlap": overlap, **run([*sets, *extra], pace)}
            print(f"  {name}, overlap {overlap}: {row['steps_per_s']:.3f} steps/s, {row['wall_s']:.1f} s", flush=True)
            rows.append(row)
        if rows[0]["hash"] != rows[1]["hash"]:
            raise RuntimeError("a pace changed the bits")
        for row in rows:
            row["of_equal_rate"] = row["steps_per_s"] / rows[0]["steps_per_s"]
        figures += rows
    return figures


def _report(args: argparse.Namespace, figures: list[dict[str, Any]], keys: list[str], extra: dict[str, Any]) -> int:
    """The table of the runs, and the JSON file with --out."""
    print()
    widths = [max(len("slow + stride"), 4)] + [max(len(k), 10) for k in keys]
    print("  ".join(h.ljust(w) for h, w in zip(["run", *keys], widths)))
    for row in figures:
        cells = [row["run"], *(f"{row[k]:.4g}" if isinstance(row[k], float) else str(row[k]) for k in keys)]
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths)))
    sys.stdout.flush()
    if args.out:
        write_json(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, **extra, "runs": figures})
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
