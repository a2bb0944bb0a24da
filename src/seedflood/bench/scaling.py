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
skipped with that projection, never extrapolated. `--plot OUT.svg` draws per-client CPU per step
against N (log-log) with matplotlib, the paper's 128 clients marked. Nothing asserts a timing.

Assumes: HF_HUB_OFFLINE=1; one process, one thread; the machine's other load inflates both
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


def _config(graph: str, n: int, steps: int):
    from seedflood.core.config import runconfig as config

    return config.load(
        None,
        [
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
        ],
    )


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


def fig_scaling(
    clients: Sequence[int], graphs: Sequence[str], steps: int, budget_s: float, progress: bool = False
) -> dict[str, Any]:
    """Every (graph, N) row; `progress`: print each row (JSON) to stderr as it is measured."""
    rows = []
    for n in clients:  # the small sizes of every graph first: a cut-off run still has them
        for g in graphs:
            rows.append(measure(g, n, steps, budget_s))
            if progress:
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return {"steps": steps, "budget_s": budget_s, "rows": rows}


def print_scaling(fig: dict[str, Any], out=None) -> None:
    out = out or sys.stdout
    print(f"\n== scaling: seedflood simulate, tiny model, CPU, batch 8, sequential, {fig['steps']} steps", file=out)
    head = ("graph", "N", "D", "CPU/client/step", "forwards", "rest", "rest share", "B/edge/step", "held/client")
    rows = [head]
    for r in fig["rows"]:
        if "skipped" in r:
            rows.append((r["graph"], str(r["nodes"]), "", r["skipped"], "", "", "", "", ""))
            continue
        ms = [f"{r[k] * 1e3:.2f} ms" for k in ("client_step_cpu_s", "client_step_forwards_s", "client_step_rest_s")]
        rows.append(
            (
                r["graph"],
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
    out.flush()


def plot(fig: dict[str, Any], path: str) -> None:
    """Per-client CPU per step (total and the rest) against N, log-log; the paper's N marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = plt.figure(figsize=(5, 3.5)).gca()
    for g in dict.fromkeys(r["graph"] for r in fig["rows"]):
        done = [r for r in fig["rows"] if r["graph"] == g and "skipped" not in r]
        ns = [r["nodes"] for r in done]
        ax.plot(ns, [r["client_step_cpu_s"] * 1e3 for r in done], "o-", label=f"{g}: total")
        ax.plot(ns, [r["client_step_rest_s"] * 1e3 for r in done], "s--", label=f"{g}: all but forwards")
    ax.axvline(PAPER_CLIENTS, color="grey", lw=0.8, ls=":", label=f"paper: {PAPER_CLIENTS} clients")
    ax.set(xscale="log", yscale="log", xlabel="clients N", ylabel="CPU ms per client per step")
    ax.legend(fontsize=7)
    plt.tight_layout()
    plt.savefig(path)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m seedflood.bench.scaling", description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS))
    p.add_argument("--graphs", nargs="+", choices=GRAPHS, default=list(GRAPHS))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--budget", type=float, default=1800.0, help="seconds of CPU a configuration may take")
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--plot", metavar="OUT.svg")
    a = p.parse_args(argv)
    fig = fig_scaling(a.clients, a.graphs, a.steps, a.budget, progress=True)
    print_scaling(fig)
    if a.json:
        Path(a.json).write_text(json.dumps(fig, indent=1) + "\n")
    if a.plot:
        plot(fig, a.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
