"""`seedflood bench`: parses its options, runs the selected figures and prints one table per figure.

Owns: the figure names (FIGURES, in run order), the runner of each (RUNNERS: `Options -> dict`,
JSON-friendly results), the argument parser, and `main`, which runs the selected figures with
torch's thread count and the library's logging restored afterwards and optionally writes all of
them as one JSON document. The programs are benchmarks, not tests: nothing here asserts a timing.

Figures (docs/benchmarks.md explains each; one module per figure):
  bytes    traffic.py   bytes per edge per step and per run for two model sizes (must be equal)
  apply    apply.py     time to apply n messages of one step through Applier.apply (subcge:
                        accumulate, and the merge on its own), vs gaussian, as fractions of one
                        plain forward
  step     step.py      ZO step efficiency = 2 × plain forward time / client step time, subcge
                        and gaussian
  catchup  catchup.py   catch-up by replaying 10⁵ messages (default cadence) vs loading a full
                        state file, and vs gaussian regeneration (projected from one message)
  hop      memhop.py    flood latency per hop and per step with the in-memory network on rings
  tradeoff tradeoff.py  subcge rank x merge cadence: live per-step overhead vs catch-up time
  hops     hops.py      real gloo processes: our flood hop against a bare exchange
  overlap  overlap.py   real gloo processes with slowed hops: flood.overlap off vs on
  sim      sim.py       client-steps per second of simulate's estimates, sequential vs batched
                        beside the batched floor, N = 1, 16, 64, 128 (--sim-clients)
  goodput  goodput.py   churn runs in process: steps/s under a failure schedule (cut + heal, join,
                        kill + restart, mixed) / steps/s with none, ring of 8 and 4×4 torus
  load     load.py      anonymous memory a fresh process gains in model.load / the model's bytes
                        (goal <= 0.2), with and without the imports

The timing rules every figure follows are in bench/common.py. torch runs one intra-op thread by
default (--threads).

Assumes: offline use (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from seedflood.bench.apply import fig_apply
from seedflood.bench.catchup import fig_catchup
from seedflood.bench.common import DEFAULT_MODEL, Options, keep_threads, quiet_logs
from seedflood.bench.memhop import fig_hop
from seedflood.bench.step import fig_step
from seedflood.bench.tradeoff import fig_tradeoff
from seedflood.bench.traffic import fig_bytes

FIGURES = ("bytes", "apply", "step", "catchup", "hop", "tradeoff", "hops", "overlap", "sim", "goodput", "load")


def fig_hops(opts: Options) -> dict[str, Any]:
    """Real gloo processes, N = 4…32: our flood hop against a bare exchange (bench/hops.py)."""
    from seedflood.bench import hops as bench_hops

    fig = bench_hops.fig_hops(opts.quick, repeats=opts.repeats("hops"))
    bench_hops.print_hops(fig, opts.out)
    return fig


def fig_overlap(opts: Options) -> dict[str, Any]:
    """Real gloo processes with slowed hops: step time with flood.overlap off vs on
    (bench/overlap.py). The hops are slowed by a sleep per exchange equal to two forwards (a
    latency); `python -m seedflood.bench.overlap` also runs it over netns with a tbf cap."""
    from seedflood.bench import overlap as bench_overlap

    fig = bench_overlap.fig_overlap(opts.quick, rate=None)
    bench_overlap.print_overlap(fig, opts.out)
    return fig


def fig_sim(opts: Options) -> dict[str, Any]:
    """Client-steps per second of simulate's estimates, sequential vs batched, beside the floor
    (bench/sim.py)."""
    from seedflood.bench import sim as bench_sim

    clients = opts.sim_clients or (bench_sim.QUICK_CLIENTS if opts.quick else bench_sim.DEFAULT_CLIENTS)
    return bench_sim.fig_sim(
        opts.model,
        clients,
        rounds=opts.repeats("sim"),
        budget_s=opts.sim_budget_s,
        direction=opts.sim_direction,
        chunk=opts.sim_chunk,
        device=opts.sim_device,
        out=opts.out,
    )


def fig_goodput(opts: Options) -> dict[str, Any]:
    """Churn runs in process: goodput under four failure schedules (bench/goodput.py)."""
    from seedflood.bench import goodput

    quick = goodput.QUICK if opts.quick else {"steps": goodput.STEPS, "every": goodput.EVERY, "period": goodput.PERIOD}
    steps = opts.goodput_steps or quick["steps"]
    graphs = opts.goodput_graphs or (("ring8",) if opts.quick else tuple(goodput.GRAPHS))
    return goodput.fig_goodput(steps, opts.repeats("goodput"), graphs, opts.out, quick["every"], quick["period"])


def fig_load(opts: Options) -> dict[str, Any]:
    """Anonymous memory gained across model.load in fresh processes (bench/load.py)."""
    from seedflood.bench import load

    return load.fig_load(opts, device=opts.load_device)


RUNNERS: dict[str, Callable[[Options], dict[str, Any]]] = {
    "bytes": fig_bytes,
    "apply": fig_apply,
    "step": fig_step,
    "catchup": fig_catchup,
    "hop": fig_hop,
    "tradeoff": fig_tradeoff,
    "hops": fig_hops,
    "overlap": fig_overlap,
    "sim": fig_sim,
    "goodput": fig_goodput,
    "load": fig_load,
}


# -- entry -----------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="seedflood bench", description="Measure the figures of docs/benchmarks.md.")
    p.add_argument("--quick", action="store_true", help="tiny model and small sizes (CI smoke test, seconds)")
    p.add_argument(
        "--only",
        nargs="+",
        choices=FIGURES,
        metavar="NAME",
        help=f"run only these figures ({', '.join(FIGURES)}); default: all",
    )
    p.add_argument("--json", metavar="OUT", help="also write every figure as JSON to OUT")
    p.add_argument(
        "--model",
        help=f"model for apply/step/catchup and the large side of bytes (default {DEFAULT_MODEL}; 'tiny' with --quick)",
    )
    p.add_argument("--repeats", type=int, default=0, help="timed repeats per measurement (default 5; 3 with --quick)")
    p.add_argument(
        "--gaussian-budget",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds the gaussian side of 'apply' may spend in total (default 60)",
    )
    p.add_argument(
        "--sim-clients",
        type=int,
        nargs="+",
        metavar="N",
        help="sim: client counts (default 1 16 64 128; 1 4 with --quick)",
    )
    p.add_argument(
        "--sim-budget", type=float, default=120.0, metavar="S", help="sim: seconds one side may take (default 120)"
    )
    p.add_argument("--sim-chunk", type=int, default=0, metavar="C", help="sim: clients per batched forward (0 = all)")
    p.add_argument("--sim-direction", choices=("subcge", "gaussian"), default="subcge", help="sim: direction family")
    p.add_argument("--sim-device", default="cpu", help="sim: model.device (cpu, cuda, cuda:N)")
    p.add_argument(
        "--goodput-steps",
        type=int,
        default=0,
        metavar="N",
        help="goodput: steps per run (default 150; 30 with --quick)",
    )
    p.add_argument(
        "--goodput-graphs",
        nargs="+",
        choices=("ring8", "torus4x4"),
        metavar="G",
        help="goodput: graphs (default ring8 torus4x4; ring8 with --quick)",
    )
    p.add_argument("--load-device", default="cpu", help="load: the device the model is loaded onto (cpu, cuda, cuda:N)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on a shared machine 2+ OpenMP threads stall for "
        "seconds whenever another process holds a core; 0 = torch's default)",
    )
    return p


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:  # `seedflood bench -- --quick`: the separator the CLI may pass through
        argv = argv[1:]
    args = build_parser().parse_args(argv)
    if args.repeats < 0 or args.threads < 0 or args.gaussian_budget < 0 or args.goodput_steps < 0:
        print(
            "seedflood bench: error: --repeats, --threads, --gaussian-budget and --goodput-steps must be >= 0",
            file=sys.stderr,
        )
        return 2
    opts = Options(args)
    names = [n for n in FIGURES if n in (args.only or FIGURES)]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with keep_threads():
        if args.threads:
            torch.set_num_threads(args.threads)
        return _run(opts, names, args.json)


def _run(opts: Options, names: list[str], json_out: str | None) -> int:
    meta = {
        "quick": opts.quick,
        "model": opts.model,
        "repeats": {n: opts.repeats(n) for n in names},
        "figures": names,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    print(
        f"seedflood bench: {', '.join(names)} on {opts.model}; torch {torch.__version__}, "
        f"{meta['threads']} threads, {meta['cpus']} CPUs; times are medians (min–max, ×repeats)",
        file=opts.out,
    )
    figures: dict[str, Any] = {}
    with quiet_logs():
        for name in names:
            t0 = time.perf_counter()
            with keep_threads(), torch.no_grad():
                figures[name] = RUNNERS[name](opts)
            figures[name]["wall_s"] = time.perf_counter() - t0
            print(f"   ({name}: {figures[name]['wall_s']:.1f} s)", file=opts.out)
    if json_out:
        path = Path(json_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"meta": meta, "figures": figures}, indent=2, sort_keys=True) + "\n")
        print(f"wrote {path}", file=opts.out)
    return 0
