"""Benchmark: the cost of `seedflood simulate` against N, split into forwards and the rest.

Owns the figure `scaling` (`python -m seedflood.bench.scaling`): for each graph (an (almost)
square torus and a random 3-regular graph) and N (default 16, 64, 256, 1024) it runs the
shared-model simulation (roles/sharedmodel.py: the tiny model on the CPU, batch 8, the
sequential estimator, one torch thread) for `steps` steps and drain, and reports
  - per-client CPU per step: process CPU time / (N × steps), split into the forwards (every
    client's two-point estimates, `SharedModel.estimate`) and everything else (the lockstep
    flood, lockarrays.py: frames, checks, completeness; the apply); the share of everything else;
  - bytes per edge per step (transport.ByteCounter: header + frame, the drain included);
  - messages held per client: the mean over clients of the messages in its flood right after a
    step's hops (before that step is applied), the peak over steps.
A configuration whose first step's CPU time × steps would exceed `budget_s` is reported as
skipped with that projection, never extrapolated. `--launched` (default N 16, 64, 128): the same
settings run by `seedflood launch` (N client processes + the evaluator, bench/procs.py's `launch`),
each row from the clients' own reports (summary.json `cost`, roles/cost.py: CPU of the steps and
drain without start-up, of the forwards, peak messages held after a step's hops), the mean over
clients; `--minus S` subtracts a run of S steps client by client (the drain and the fill cancel).
`--plot OUT.svg` draws per-client CPU per step against N (log-log) with matplotlib, launched rows
with their own markers (`--with JSON`: add an earlier --json's rows), the paper's 128 clients
marked. Nothing asserts a timing.

Assumes: HF_HUB_OFFLINE=1; simulate: one process, one thread; the machine's other load inflates both
sides alike (the share is the figure to read).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

GRAPHS = ("torus", "random_regular")
CLIENTS = (16, 64, 256, 1024)
PAPER_CLIENTS = 128


def _sets(graph: str, n: int, steps: int) -> list[str]:
    return [
        "model.name=tiny",
        "model.device=cpu",
        "task.name=synthetic",
        f"task.train_examples={max(1000, 8 * n)}",
        "task.dev_examples=0",
        "task.test_examples=8",
        "task.batch_size=8",
        f"topology.kind={graph}",
        f"topology.nodes={n}",
        f"run.steps={steps}",
        "run.threads=1",
        "sim.batched=false",
    ]


def _config(graph: str, n: int, steps: int):
    from seedflood.core.config import runconfig as config

    return config.load(None, _sets(graph, n, steps))


def measure(graph: str, n: int, steps: int, budget_s: float) -> dict[str, Any]:
    """One row: run the simulation of (graph, n) for `steps` steps; see the module docstring."""
    import torch

    from seedflood.core.flood.protocol import Protocol
    from seedflood.core.topology import resolve as topo
    from seedflood.ml.workload import Workload
    from seedflood.roles.sharedmodel import SharedModel

    torch.set_num_threads(1)
    cfg = _config(graph, n, steps)
    top = topo.build(cfg.topology)
    sim = SharedModel(cfg, top, Protocol.of(cfg, top.diameter), Workload.build(cfg))
    estimate, forwards, held, started = sim.estimate, [0.0], [], [0.0]

    def timed(t: int):  # the forwards of step t
        c0 = time.process_time()
        out = estimate(t)
        forwards[0] += time.process_time() - c0
        return out

    run_hops = sim.lockstep.run_hops

    def hops(t: int) -> None:  # the messages held right after a step's hops, before its apply
        run_hops(t)
        held.append(statistics.mean(f.held_count for f in sim.lockstep.floods))

    def after(t: int) -> None:
        if t == 0 and (time.process_time() - started[0]) * steps > budget_s:
            raise _OverBudget((time.process_time() - started[0]) * steps)

    sim.estimate = timed  # type: ignore[method-assign]
    sim.lockstep.run_hops = hops  # type: ignore[method-assign]
    started[0] = time.process_time()
    try:
        sim.run(after_step=after)
    except _OverBudget as e:
        return {"graph": graph, "nodes": n, "skipped": f"projected {e.args[0]:.0f} s > budget {budget_s:.0f} s"}
    cpu = time.process_time() - started[0]
    rest = cpu - forwards[0]
    return {
        "graph": graph,
        "nodes": n,
        "diameter": top.diameter,
        "steps": steps,
        "cpu_s": cpu,
        "forwards_s": forwards[0],
        "client_step_cpu_s": cpu / (n * steps),
        "client_step_forwards_s": forwards[0] / (n * steps),
        "client_step_rest_s": rest / (n * steps),
        "rest_share": rest / cpu if cpu > 0 else 0.0,
        "bytes_per_edge_step": sim.counter.mean_bytes_per_edge_per_step(),
        "held_per_client": max(held) if held else 0.0,
    }


class _OverBudget(Exception):
    pass


LAUNCHED_CLIENTS = (16, 64, 128)
LAUNCH_SETS = ("eval.every=0", "checkpoint.every=0", "transport.timeout_s=600")
"""Besides the simulate rows' settings: no evaluation or checkpoint mid-run; 129 ranks starting on
2 cores reach the rendezvous late."""


def measure_launched(graph: str, n: int, steps: int, timeout_s: float, minus: int = 0) -> dict[str, Any]:
    """One launched row: `seedflood launch` of the same settings (n client processes + the
    evaluator, bench/procs.py's `launch`), from the clients' own reports (roles/cost.py); with
    `minus` > 0, a second run of that many steps whose costs are subtracted (`launched_row`)."""
    from seedflood.bench import procs

    sets = [*LAUNCH_SETS]
    runs = [
        procs.launch(None, [*_sets(graph, n, s), *sets], "fork", every_s=2.0, timeout_s=timeout_s)
        for s in ([steps, minus] if minus else [steps])
    ]
    return launched_row(graph, n, steps, runs[0]["summary"], minus, runs[-1]["summary"] if minus else None) | {
        "wall_s": sum(r["wall_s"] for r in runs),
        "load_before": list(runs[0]["load_before"]),
        "load_after": list(runs[-1]["load_after"]),
    }


def _costs(summary: dict[str, Any], n: int) -> list[dict[str, Any]]:
    costs = [c for c in summary.get("cost") or [] if c and c.get("run_cpu_s") is not None]
    if len(costs) != n:
        raise ValueError(f"{len(costs)} of {n} clients reported their cost")
    return costs


def launched_row(
    graph: str, n: int, steps: int, summary: dict[str, Any], minus: int = 0, shorter: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A launched run's row from its summary.json: per client CPU per step (the CPU of its steps
    and drain, start-up excluded; with `shorter`, the summary of a run of `minus` steps, the
    difference of each client's costs over steps − minus, so the drain and the pipeline's fill
    cancel), split into its forwards and the rest, the mean over clients
    (`client_step_cpu_max_s`: the slowest client's); bytes per edge per step; held per client:
    the mean over clients of each one's peak right after a step's hops, before its apply."""
    costs = _costs(summary, n)
    zero = {"run_cpu_s": 0.0, "forwards_s": 0.0}
    base = _costs(shorter, n) if shorter is not None else [zero] * n
    span = steps - (minus if shorter is not None else 0)
    cpu = [(c["run_cpu_s"] - b["run_cpu_s"]) / span for c, b in zip(costs, base, strict=True)]
    fwd = [(c["forwards_s"] - b["forwards_s"]) / span for c, b in zip(costs, base, strict=True)]
    mean_cpu, mean_fwd = statistics.mean(cpu), statistics.mean(fwd)
    return {
        "graph": graph,
        "nodes": n,
        "launched": True,
        "diameter": summary["diameter"],
        "steps": steps,
        "minus_steps": minus if shorter is not None else 0,
        "client_step_cpu_s": mean_cpu,
        "client_step_cpu_max_s": max(cpu),
        "client_step_forwards_s": mean_fwd,
        "client_step_rest_s": mean_cpu - mean_fwd,
        "rest_share": (mean_cpu - mean_fwd) / mean_cpu if mean_cpu > 0 else 0.0,
        "bytes_per_edge_step": summary["bytes_per_edge_per_step"],
        "held_per_client": statistics.mean(c["held_peak"] for c in costs),
        "consensus": summary.get("consensus"),
    }


def fig_scaling(
    clients: Sequence[int],
    graphs: Sequence[str],
    steps: int,
    budget_s: float,
    progress: bool = False,
    launched: bool = False,
    minus: int = 0,
) -> dict[str, Any]:
    """Every (graph, N) row; `progress`: print each row (JSON) to stderr as it is measured;
    `launched`: `seedflood launch` runs (`budget_s`: each one's timeout) instead of simulate, less
    a run of `minus` steps (0: none)."""
    rows = []
    for n in clients:  # the small sizes of every graph first: a cut-off run still has them
        for g in graphs:
            rows.append(measure_launched(g, n, steps, budget_s, minus) if launched else measure(g, n, steps, budget_s))
            if progress:
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return {"steps": steps, "budget_s": budget_s, "rows": rows}


def print_scaling(fig: dict[str, Any], out=None) -> None:
    out = out or sys.stdout
    print(f"\n== scaling: tiny model, CPU, batch 8, sequential, 1 thread, {fig['steps']} steps", file=out)
    head = ("graph", "run", "N", "D", "CPU/client/step", "forwards", "rest", "rest share", "B/edge/step", "held/client")
    rows = [head]
    for r in fig["rows"]:
        if "skipped" in r:
            rows.append((r["graph"], "simulate", str(r["nodes"]), "", r["skipped"], "", "", "", "", ""))
            continue
        ms = [f"{r[k] * 1e3:.2f} ms" for k in ("client_step_cpu_s", "client_step_forwards_s", "client_step_rest_s")]
        rows.append(
            (
                r["graph"],
                "launched" if r.get("launched") else "simulate",
                str(r["nodes"]),
                str(r["diameter"]),
                *ms,
                f"{r['rest_share']:.0%}",
                f"{r['bytes_per_edge_step']:.0f}",
                f"{r['held_per_client']:.0f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)), file=out)
    for r in fig["rows"]:
        if r.get("launched"):
            load = lambda v: " ".join(f"{x:.1f}" for x in v)  # noqa: E731
            print(
                f"  launched {r['graph']} {r['nodes']} ({r['steps']} steps less {r['minus_steps']}): wall {r['wall_s']:.0f} s, slowest client"
                f" {r['client_step_cpu_max_s'] * 1e3:.2f} ms, load {load(r['load_before'])} before,"
                f" {load(r['load_after'])} after, consensus {r['consensus']}",
                file=out,
            )
    out.flush()


def plot(fig: dict[str, Any], path: str) -> None:
    """Per-client CPU per step (total and the rest) against N, log-log; the paper's N marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = plt.figure(figsize=(7, 3.5)).gca()
    for launched in (False, True):
        for g in dict.fromkeys(r["graph"] for r in fig["rows"]):
            done = [
                r for r in fig["rows"] if r["graph"] == g and "skipped" not in r and bool(r.get("launched")) == launched
            ]
            if not done:
                continue
            ns, how = [r["nodes"] for r in done], "launched" if launched else "simulate"
            total, rest = ("^-", "v--") if launched else ("o-", "s--")
            ax.plot(ns, [r["client_step_cpu_s"] * 1e3 for r in done], total, label=f"{g}, {how}: total")
            ax.plot(ns, [r["client_step_rest_s"] * 1e3 for r in done], rest, label=f"{g}, {how}: all but forwards")
    ax.axvline(PAPER_CLIENTS, color="grey", lw=0.8, ls=":", label=f"paper: {PAPER_CLIENTS} clients")
    ax.set(xscale="log", yscale="log", xlabel="clients N", ylabel="CPU ms per client per step")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    plt.tight_layout()
    plt.savefig(path)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m seedflood.bench.scaling", description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, nargs="+", help=f"default {CLIENTS}; launched {LAUNCHED_CLIENTS}")
    p.add_argument("--graphs", nargs="+", choices=(*GRAPHS, "ring"), default=list(GRAPHS))
    p.add_argument("--launched", action="store_true", help="`seedflood launch` runs (N processes) instead of simulate")
    p.add_argument("--minus", type=int, default=0, help="launched: subtract a run of this many steps (drain, fill)")
    p.add_argument("--with", dest="with_", nargs="+", default=[], metavar="JSON", help="earlier --json rows to add")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument(
        "--budget", type=float, default=1800.0, help="seconds of CPU a configuration may take (launched: its timeout)"
    )
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--plot", metavar="OUT.svg")
    a = p.parse_args(argv)
    clients = a.clients or list(LAUNCHED_CLIENTS if a.launched else CLIENTS)
    fig = fig_scaling(clients, a.graphs, a.steps, a.budget, progress=True, launched=a.launched, minus=a.minus)
    for path in a.with_:
        fig["rows"] += json.loads(Path(path).read_text())["rows"]
    print_scaling(fig)
    if a.json:
        Path(a.json).write_text(json.dumps(fig, indent=1) + "\n")
    if a.plot:
        plot(fig, a.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
