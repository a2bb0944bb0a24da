"""`seedflood bench`: measures the figures docs/design.md §11 publishes and prints one table per figure.

Owns: the benchmark programs (not tests: nothing here asserts a timing). Each figure is a function
`fig_<name>(opts) -> dict` that builds what it needs from the public modules, measures, prints a
table and returns JSON-friendly results; `main` runs the selected figures and optionally writes
all of them as one JSON document.

Figures (benchmarks/README.md explains each):
  bytes    bytes per edge per step and per run for two model sizes (must be equal)
  apply    time to apply n messages of one step through Applier.apply (subcge: accumulate, and
           the merge on its own), vs gaussian, as fractions of one plain forward
  step     ZO step efficiency = 2 × plain forward time / client step time, subcge and gaussian
  catchup  catch-up by replaying 10⁵ messages (default cadence) vs loading a full state file,
           and vs gaussian regeneration (projected from one message)
  hop      flood latency per hop and per step with the in-memory network on rings of N nodes
  tradeoff subcge rank x merge cadence: live per-step overhead vs catch-up time of 10⁵ messages
  sim      client-steps per second of simulate's estimates, sequential vs batched (sim.batched)
           beside the batched floor, N = 1, 16, 64, 128 (bench_sim.py; --sim-clients)

Timing rules: shared, noisy machines. Every timed quantity is repeated, reported as the median
with its min–max spread, and quantities that are compared are measured alternately in one run
(a burst of load hits both). Wall time is `time.perf_counter`; ratios are also given on this
process's CPU time (`time.process_time`), which foreign load hardly moves. torch runs one
intra-op thread by default (--threads). Nothing is extrapolated: a size that would blow the time
budget is printed as "skipped".

Assumes: offline use (HF_HUB_OFFLINE=1); 'smollm2-135m' is converted into the local cache on its
first load (~20 s, once).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seedflood.bench.common import NullDirection, table

FIGURES = ("bytes", "apply", "step", "catchup", "hop", "tradeoff", "hops", "overlap", "sim")
DEFAULT_MODEL = "smollm2-135m"
PAPER_STEPS = 5000  # the paper's ZO runs: 5,000 steps
PAPER_TARGET_BYTES = 400_000  # ≈ 400 KB per edge per run reported for SeedFlood
_TAG_BENCH = 0xBE4C  # domain tag of the benchmark's random scalars

# Two tiny widths for `bytes --quick` (and the small side of the default run).
TINY_SMALL = "model.tiny={hidden_size: 64, intermediate_size: 128}"
TINY_LARGE = "model.tiny={hidden_size: 128, intermediate_size: 256}"


# -- options and output ---------------------------------------------------------------------------
class Options:
    """What the command line chose; every figure reads only what it needs."""

    # Timed repeats per figure when --repeats is not given (sized for a run of a few minutes).
    DEFAULT_REPEATS = {"apply": 5, "step": 3, "catchup": 3}

    def __init__(self, args: argparse.Namespace) -> None:
        self.quick: bool = args.quick
        self.model: str = args.model or ("tiny" if args.quick else DEFAULT_MODEL)
        self._repeats: int = args.repeats
        self.gaussian_budget_s: float = args.gaussian_budget
        self.sim_clients: list[int] | None = getattr(args, "sim_clients", None)
        self.sim_budget_s: float = getattr(args, "sim_budget", 120.0)
        self.sim_chunk: int = getattr(args, "sim_chunk", 0)
        self.sim_direction: str = getattr(args, "sim_direction", "subcge")
        self.sim_device: str = getattr(args, "sim_device", "cpu")
        self.out = sys.stdout

    def repeats(self, figure: str) -> int:
        if self._repeats:
            return self._repeats
        return 3 if self.quick else self.DEFAULT_REPEATS.get(figure, 3)

    @property
    def tiny(self) -> bool:
        return self.model == "tiny"

    def model_overrides(self) -> list[str]:
        return [f"model.name={self.model}"] + ([TINY_SMALL] if self.tiny else [])


def _cfg(overrides: Sequence[str]):
    from seedflood.core import config

    return config.load(None, list(overrides))


def _stats(xs: Sequence[float]) -> dict[str, float]:
    """median, min, max and count of a list of seconds."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _ms(s: dict[str, float] | None) -> str:
    """'12.3 ms (11.9–13.0, ×5)' from _stats, or 'skipped'."""
    if s is None:
        return "skipped"
    f = _fmt_time
    return f"{f(s['median'])} ({f(s['min'])}–{f(s['max'])}, ×{s['n']})"


def _fmt_time(seconds: float) -> str:
    ms = seconds * 1e3
    if ms < 1:
        return f"{ms:.3f} ms"
    if ms < 100:
        return f"{ms:.1f} ms"
    return f"{ms:.0f} ms"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Hide the library's info logs while measuring (restored afterwards; the caller's logging
    configuration is left alone)."""
    lg = logging.getLogger("seedflood")
    old = lg.level
    lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        lg.setLevel(old)


@contextlib.contextmanager
def _keep_threads() -> Iterator[None]:
    """Restore torch's thread count (Workload.build may set it from run.threads; main sets it)."""
    n = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _scalars(n: int, key: int) -> np.ndarray:
    """n reproducible N(0, 1) scalars (what a message carries; values do not affect timing)."""
    from seedflood.core import rng

    return rng.generator(_TAG_BENCH, key).standard_normal(n)


def _messages(step: int, n_origins: int, run_seed: int, key: int):
    from seedflood.core import rng
    from seedflood.core.message import Message

    xs = _scalars(n_origins, key * 1_000_003 + step)
    return [Message.make(o, step, rng.derive(run_seed, o, step, 0), float(xs[o])) for o in range(n_origins)]


# -- 1. bytes --------------------------------------------------------------------------------------
def fig_bytes(opts: Options) -> dict[str, Any]:
    """Bytes per directed edge per step and per run, 4 clients on a ring, for two model sizes."""
    import dataclasses

    from seedflood.bench import wirecost
    from seedflood.core import topology as topo
    from seedflood.core.transport import HEADER
    from seedflood.roles.simulation import simulate

    steps = 3
    common = [
        "task.name=synthetic",
        "task.batch_size=2",
        "task.train_examples=64",
        "task.dev_examples=0",
        "task.test_examples=8",
        "topology.kind=ring",
        "topology.nodes=4",
        f"run.steps={steps}",
        "run.threads=1",  # 4 client threads on shared cores: one torch thread each
    ]
    if opts.quick or opts.tiny:
        sizes = [("tiny h64", ["model.name=tiny", TINY_SMALL]), ("tiny h128", ["model.name=tiny", TINY_LARGE])]
    else:
        sizes = [("tiny h64", ["model.name=tiny", TINY_SMALL]), (opts.model, [f"model.name={opts.model}"])]
    rows, results = [], []
    for label, model_over in sizes:
        cfg = _cfg(common + model_over)
        t0 = time.perf_counter()
        res = simulate(cfg, hash_every_step=False)
        wall = time.perf_counter() - t0
        w = res.workloads[0]
        c = res.counter
        edge_step = [n for _, a, b, n in c.rows() if b >= 0]
        per_run = list(c.per_edge_total().values())
        r = {
            "model": label,
            "params": sum(p.numel() for p in w.model.parameters()),
            "trainable": w.direction.numel,
            "steps": steps,
            "directed_edges": len(per_run),
            "bytes_per_edge_per_step": c.mean_bytes_per_edge_per_step(),
            "bytes_per_edge_per_step_min": min(edge_step),
            "bytes_per_edge_per_step_max": max(edge_step),
            "bytes_per_edge_per_run": statistics.mean(per_run),
            "bytes_total": c.total(),
            "consensus": len(set(res.hashes.values())) == 1,
            "wall_s": wall,
            "rows": c.rows(),
        }
        results.append(r)
        rows.append(
            [
                label,
                f"{r['params']:,}",
                f"{r['trainable']:,}",
                f"{r['bytes_per_edge_per_step']:.1f}",
                f"{r['bytes_per_edge_per_run']:.1f}",
                r["bytes_total"],
                "yes" if r["consensus"] else "NO",
            ]
        )
        del res, w
    a, b = results
    equal = a["rows"] == b["rows"]
    for r in results:
        r.pop("rows")
    # The paper's setting: 16 clients on a ring, 5,000 steps, counted exactly by the real flood
    # and codec without a model (wirecost; equal to a simulated run's counter row for row).
    paper_steps = 300 if opts.quick else PAPER_STEPS
    t0 = time.perf_counter()
    paper = wirecost.project(topo.ring(16), paper_steps)
    paper_wall = time.perf_counter() - t0
    out = {
        "sizes": results,
        "equal": equal,
        "param_ratio": b["params"] / a["params"],
        "trainable_ratio": b["trainable"] / a["trainable"],
        "bytes_ratio": b["bytes_total"] / a["bytes_total"],
        "paper": {
            "nodes": 16,
            "steps": paper_steps,
            "target_per_run": PAPER_TARGET_BYTES if paper_steps == PAPER_STEPS else None,
            "settings": [dataclasses.asdict(r) for r in paper],
            "wall_s": paper_wall,
        },
    }
    table(
        opts.out,
        f"bytes: traffic per directed edge, 4 clients on a ring, {steps} steps",
        ["model", "params", "trainable d", "B/edge/step", "B/edge/run", "B total", "consensus"],
        rows,
        [
            f"every (step, edge) count identical across the two sizes: {'yes' if equal else 'NO'}; "
            f"parameter ratio {out['param_ratio']:.1f}x (trainable {out['trainable_ratio']:.1f}x), "
            f"byte ratio {out['bytes_ratio']:.3f}"
        ],
    )
    table(
        opts.out,
        f"bytes: the paper's setting, 16 clients on a ring, K = 1, {paper_steps:,} steps, per directed edge",
        list(wirecost.HEADERS),
        wirecost.rows(paper),
        [
            "v1: 24-byte records with the seed; v2: seed derived, step in the header, narrow fields "
            f"(message.py); every frame + a {HEADER}-byte length. The paper reports about 400 KB per edge "
            f"per run ({PAPER_STEPS:,} steps); counted in {paper_wall:.1f} s"
        ],
    )
    return out


# -- 2. apply --------------------------------------------------------------------------------------
class _Timed:
    """Wraps a callable and adds the wall time of every call to `.total`."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.total = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.total += time.perf_counter() - t0


def _now() -> tuple[float, float]:
    """(wall, CPU of this process) in seconds. CPU time hardly moves when other processes take
    the cores away, so ratios are reported on both clocks."""
    return time.perf_counter(), time.process_time()


def _ratio(a: dict[str, float] | None, b: dict[str, float] | None) -> float | None:
    return a["median"] / b["median"] if a and b and b["median"] > 0 else None


def _x(r: float | None, digits: int = 0) -> str:
    return "skipped" if r is None else f"{r:.{digits}f}x"


def _forward_workload(opts: Options, extra: Sequence[str] = ()):
    """A workload whose `loss(0, step)` is one plain forward of the `step` figure's size (batch 16,
    64 tokens; task rt, or synthetic on the tiny model), plus a timer of that forward."""
    from seedflood.ml.workload import Workload

    task = (
        ["task.name=synthetic", "task.train_examples=256", "task.dev_examples=0", "task.test_examples=8"]
        if opts.tiny
        else ["task.name=rt", "task.train_examples=1000", "task.dev_examples=0", "task.test_examples=8"]
    )
    cfg = _cfg(opts.model_overrides() + task + ["task.batch_size=16", "task.max_tokens=64", "topology.nodes=1", *extra])
    w = Workload.build(cfg)
    w.batch(0, 0)  # encoded once, outside every timing

    def forward() -> tuple[float, float]:
        """(wall, cpu) of one plain forward on the canonical state."""
        with w.direction.current():
            w0, c0 = _now()
            w.loss(0, 0)
            w1, c1 = _now()
        return w1 - w0, c1 - c0

    return w, forward


def fig_apply(opts: Options) -> dict[str, Any]:
    """Applier.apply on one step of n messages, subcge (accumulate; merge timed on its own) vs
    gaussian, each against one plain forward measured in the same run."""
    from seedflood.core import directions
    from seedflood.core.directions import SubCGE
    from seedflood.core.protocol import Protocol
    from seedflood.core.replay import Applier

    ns = [16, 64, 256, 1024]
    repeats = opts.repeats("apply")
    w, forward = _forward_workload(opts, ["zo.lr=1e-4"])
    cfg = w.cfg
    model, names = w.model, list(w.direction.names)
    sub = SubCGE(model, names, cfg.run.seed, cfg.subspace)  # default cadence: step 0 does not merge
    gau = directions.Gaussian(model, names, cfg.run.seed)
    # Basis generation is a once-per-epoch cost (every `refresh` steps): timed on its own.
    basis = []
    for _ in range(min(3, repeats)):
        fresh = SubCGE(model, names, cfg.run.seed, cfg.subspace)
        t0 = time.perf_counter()
        fresh.basis(0)
        basis.append(time.perf_counter() - t0)
    sub.basis(0)

    def once(direction, msgs) -> tuple[float, float, float]:
        """(wall, cpu, merge wall) of applying one step of `msgs` on a fresh Applier; subcge's
        pending core is then merged and timed separately (what a merge at this step costs)."""
        applier = Applier(direction, Protocol.of(_cfg([f"topology.nodes={len(msgs)}"]), 1))
        w0, c0 = _now()
        applier.apply(0, msgs)
        w1, c1 = _now()
        direction.merge_all()
        return w1 - w0, c1 - c0, time.perf_counter() - w1

    # Warm-up (first allocations, first matmuls, first forward) for everything, not timed.
    forward()
    once(sub, _messages(0, 16, cfg.run.seed, 0))
    rate = once(gau, _messages(0, 1, cfg.run.seed, 0))[0]  # s per gaussian message, refined below
    spent = 0.0
    fwd: list[tuple[float, float]] = []
    rows, per_n = [], []
    for n in ns:
        msgs = _messages(0, n, cfg.run.seed, n)
        s_runs, g_runs = [], []
        for r in range(repeats):
            if n == ns[0] or (n == ns[-1] and r < 2):  # forwards interleaved with the applies
                fwd.append(forward())
            s_runs.append(once(sub, msgs))
            # gaussian alternates with subcge while it fits the budget; one run when a run is long
            if spent + rate * n <= opts.gaussian_budget_s and (r == 0 or rate * n < 2.0):
                g_runs.append(once(gau, msgs))
                spent += g_runs[-1][0]
                rate = g_runs[-1][0] / n
        s_wall, s_cpu, s_merge = (_stats([x[i] for x in s_runs]) for i in range(3))
        g_wall = _stats([x[0] for x in g_runs]) if g_runs else None
        g_cpu = _stats([x[1] for x in g_runs]) if g_runs else None
        e = {
            "n": n,
            "subcge_s": s_wall,
            "subcge_cpu_s": s_cpu,
            "subcge_merge_s": s_merge,
            "gaussian_s": g_wall,
            "gaussian_cpu_s": g_cpu,
            "ratio": _ratio(g_wall, s_wall),
            "ratio_cpu": _ratio(g_cpu, s_cpu),
        }
        per_n.append(e)
    f_wall, f_cpu = _stats([x[0] for x in fwd]), _stats([x[1] for x in fwd])
    for e in per_n:
        e["subcge_of_forward"] = e["subcge_s"]["median"] / f_wall["median"]
        e["subcge_of_forward_cpu"] = e["subcge_cpu_s"]["median"] / f_cpu["median"]
        e["merge_of_forward"] = e["subcge_merge_s"]["median"] / f_wall["median"]
        g = e["gaussian_s"]
        rows.append(
            [
                e["n"],
                _ms(e["subcge_s"]),
                f"{100 * e['subcge_of_forward']:.2f}% / {100 * e['subcge_of_forward_cpu']:.2f}%",
                _fmt_time(e["subcge_merge_s"]["median"]),
                f"{100 * e['merge_of_forward']:.1f}%",
                _ms(g),
                _x(e["ratio"]),
                _x(e["ratio_cpu"]),
                _fmt_time(g["median"] / e["n"]) if g else "skipped",
            ]
        )
    d = sub.numel
    out = {
        "model": opts.model,
        "trainable": d,
        "matrices": len(names),
        "rank": cfg.subspace.rank,
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "forward_s": f_wall,
        "forward_cpu_s": f_cpu,
        "target_of_forward": 0.01,
        "gaussian_budget_s": opts.gaussian_budget_s,
        "gaussian_spent_s": spent,
        "subcge_basis_s": _stats(basis),
        "per_n": per_n,
    }
    table(
        opts.out,
        f"apply: one step of n messages through Applier.apply on {opts.model} "
        f"(d = {d:,} over {len(names)} matrices, rank {cfg.subspace.rank}, {out['threads']} threads); "
        f"plain forward {_ms(f_wall)}",
        [
            "n",
            "subcge apply (wall)",
            "of fwd wall/cpu",
            "merge (own)",
            "merge of fwd",
            "gaussian (wall)",
            "gauss/subcge wall",
            "cpu",
            "gaussian per msg",
        ],
        rows,
        [
            "subcge apply = coordinates + accumulate into S (vectorised); no merge (subspace.merge_every "
            f"{cfg.subspace.merge_every or 'once per epoch'}); target < 1% of one forward. The merge "
            "W ← W + U·S·Vᵀ of that S is timed after it, on its own: a run pays it once per merge period",
            f"subcge basis generation, once per epoch of {cfg.subspace.refresh} steps (not in the rows): "
            f"{_ms(out['subcge_basis_s'])}",
            f"gaussian runs only while its total stays under {opts.gaussian_budget_s:.0f} s (spent {spent:.1f} s); "
            "'skipped' sizes are not extrapolated",
        ],
    )
    return out


# -- 3. step ---------------------------------------------------------------------------------------
def fig_step(opts: Options) -> dict[str, Any]:
    """ZO step efficiency of one client (topology of one node): 2 × plain forward / whole step."""
    from seedflood.comm.memory import InMemoryNetwork
    from seedflood.core import directions
    from seedflood.core.protocol import Protocol
    from seedflood.ml.workload import Workload
    from seedflood.roles.client import Client

    task = (
        ["task.name=synthetic", "task.train_examples=256", "task.dev_examples=0", "task.test_examples=8"]
        if opts.tiny
        else ["task.name=rt", "task.train_examples=1000", "task.dev_examples=0", "task.test_examples=8"]
    )
    rounds = opts.repeats("step")
    base = (
        opts.model_overrides()
        + task
        + [
            "task.batch_size=16",
            "task.max_tokens=64",
            "topology.nodes=1",
            "eval.attach=0",
            f"run.steps={rounds + 1}",
        ]
    )
    cfgs = {
        "subcge": _cfg(base + ["zo.direction=subcge", "zo.lr=10"]),
        "gaussian": _cfg(base + ["zo.direction=gaussian", "zo.lr=1e-6"]),
    }
    w = Workload.build(cfgs["subcge"])
    gcfg = cfgs["gaussian"]
    dirs = {"subcge": w.direction, "gaussian": directions.build(w.model, gcfg.zo, gcfg.subspace, gcfg.run.seed)}
    clients, timers = {}, {}
    with contextlib.ExitStack() as stack:
        for fam, cfg in cfgs.items():
            net = InMemoryNetwork({0: []}, timeout_s=cfg.transport.timeout_s)
            transport = stack.enter_context(net.endpoint(0))
            fwd = _Timed(lambda step: w.loss(0, step))
            c = Client(0, (), Protocol.of(cfg, 0), dirs[fam], fwd, transport)
            c.applier.apply = _Timed(c.applier.apply)  # type: ignore[method-assign]  # apply + merge
            clients[fam], timers[fam] = c, fwd

        def plain(step: int) -> tuple[float, float]:
            w.batch(0, step)  # encoded outside the timing: the forward alone
            with w.direction.current():
                w0, c0 = _now()
                w.loss(0, step)
                w1, c1 = _now()
            return w1 - w0, c1 - c0

        def step(fam: str, t: int) -> dict[str, float]:
            c, fwd = clients[fam], timers[fam]
            w._batch_cache.clear()  # each family pays its batch encoding, as a real step does
            fwd.total, c.applier.apply.total = 0.0, 0.0
            w0, c0 = _now()
            c.step(t)
            w1, c1 = _now()
            return {"step": w1 - w0, "cpu": c1 - c0, "forwards": fwd.total, "apply": c.applier.apply.total}

        plain(0)  # warm-up: the first forwards of a process are several times slower
        for fam in clients:
            step(fam, 0)
        samples: dict[str, list[dict[str, float]]] = {f: [] for f in clients}
        for t in range(1, rounds + 1):  # alternate: plain, subcge step, plain, gaussian step
            for fam in clients:
                fw, fc = plain(t)
                samples[fam].append({"fwd": fw, "fwd_cpu": fc, **step(fam, t)})
    all_fwd = [s for ss in samples.values() for s in ss]
    f, f_cpu = _stats([s["fwd"] for s in all_fwd]), _stats([s["fwd_cpu"] for s in all_fwd])
    rows, fams = [], {}
    for fam, ss in samples.items():
        st, st_cpu = _stats([s["step"] for s in ss]), _stats([s["cpu"] for s in ss])
        pf = _stats([s["forwards"] / 2 for s in ss])
        ap = _stats([s["apply"] for s in ss])
        other = _stats([s["step"] - s["forwards"] - s["apply"] for s in ss])
        paired = _stats([2 * s["fwd"] / s["step"] for s in ss])  # each step against the forward just before it
        e = {
            "step_s": st,
            "step_cpu_s": st_cpu,
            "perturbed_forward_s": pf,
            "apply_s": ap,
            "other_s": other,
            "efficiency": 2 * f["median"] / st["median"],
            "efficiency_cpu": 2 * f_cpu["median"] / st_cpu["median"],
            "efficiency_best": 2 * f["min"] / st["min"],
            "efficiency_paired": paired,
        }
        fams[fam] = e
        rows.append(
            [
                fam,
                _ms(st),
                _ms(pf),
                _ms(ap),
                _ms(other),
                f"{100 * e['efficiency']:.0f}%",
                f"{100 * e['efficiency_cpu']:.0f}%",
                f"{100 * e['efficiency_best']:.0f}%",
                f"{100 * paired['min']:.0f}–{100 * paired['max']:.0f}%",
            ]
        )
    out = {
        "model": opts.model,
        "task": cfgs["subcge"].task.name,
        "batch_size": 16,
        "max_tokens": 64,
        "threads": torch.get_num_threads(),
        "rounds": rounds,
        "forward_s": f,
        "forward_cpu_s": f_cpu,
        **fams,
        "target_subcge": 0.95,
    }
    table(
        opts.out,
        f"step: one client step on {opts.model}, task {out['task']}, batch 16, max_tokens 64, "
        f"{out['threads']} threads; plain forward {_ms(f)}",
        [
            "direction",
            "step (wall)",
            "perturbed fwd (each)",
            "apply",
            "other",
            "2·fwd/step wall",
            "cpu",
            "best",
            "per round",
        ],
        rows,
        [
            "efficiency = 2 × plain forward / step (our target for subcge: >= 95%): ratio of medians on the wall "
            "and CPU clocks, of minima ('best': foreign load only adds time), and the range of per-round ratios "
            "(each step against the forward measured just before it)",
            "other = step − both perturbed forwards − apply: batch encoding, perturbation setup, flood, codec",
        ],
    )
    return out


# -- 4. catchup ------------------------------------------------------------------------------------
def fig_catchup(opts: Options) -> dict[str, Any]:
    """A fresh client catching up on 10⁵ messages (16 clients × 6,250 steps; --quick: 2,000):
    replay base + log with the default merge cadence, vs torch.load of the trainable state, vs
    gaussian regeneration projected from one measured message."""
    from seedflood.core import directions
    from seedflood.core.protocol import Protocol
    from seedflood.core.replay import Applier, state_hash
    from seedflood.ml import model as M
    from seedflood.rundir import checkpoint as ckpt

    steps, clients = (125, 16) if opts.quick else (6250, 16)
    repeats = opts.repeats("catchup")
    common = opts.model_overrides() + [f"topology.nodes={clients}", "zo.lr=1e-3"]
    cfg = _cfg(common)
    loaded = M.load(cfg.model)
    params = dict(loaded.model.named_parameters())
    names = directions.select_trainable(loaded.model, cfg.zo.trainable)
    base = {n: params[n].detach().clone() for n in names}

    def reset() -> None:
        with torch.no_grad():
            for n in names:
                params[n].data.copy_(base[n])

    # The default cadence (docs/design.md §3); `tradeoff` projects the others.
    variants = [cfg.subspace.merge_every]
    rows, results = [], []
    with tempfile.TemporaryDirectory(prefix="seedflood-bench-") as tmp:
        log_path = Path(tmp) / "log.bin"
        writer = ckpt.LogWriter(
            log_path,
            {
                "base_identity": loaded.identity,
                "base_hash": loaded.base_hash,
                "trajectory": {"run.seed": cfg.run.seed},  # a v2 log derives seeds from it
                "config": cfg.to_dict(),
            },
        )
        for s in range(steps):
            writer.append(s, _messages(s, clients, cfg.run.seed, 7))
        writer.close()
        log_bytes = log_path.stat().st_size
        for merge_every in variants:
            vcfg = _cfg(common + [f"subspace.merge_every={merge_every}"])

            def replay() -> tuple[dict[str, float], Any]:
                reset()
                w0, c0 = _now()
                _, records = ckpt.LogReader(log_path).read()
                t1 = time.perf_counter()
                d = directions.build(loaded.model, vcfg.zo, vcfg.subspace, vcfg.run.seed)
                d.basis(0)  # a fresh client generates the epoch's basis: part of catching up
                t2 = time.perf_counter()
                Applier(d, Protocol.of(vcfg, 1)).apply_all(records)
                w3, c3 = _now()
                return {"total": w3 - w0, "cpu": c3 - c0, "read": t1 - w0, "basis": t2 - t1, "apply": w3 - t2}, d

            target = directions.build(loaded.model, vcfg.zo, vcfg.subspace, vcfg.run.seed)
            state_path = Path(tmp) / f"state-{merge_every}.pt"

            def load() -> dict[str, float]:
                reset()
                w0, c0 = _now()
                st = ckpt.load_state(state_path)
                t1 = time.perf_counter()
                with torch.no_grad():
                    for n in names:
                        params[n].data.copy_(st[n])
                target.load_extra_state({k: v for k, v in st.items() if k.startswith("subcge.")})
                w2, c2 = _now()
                return {"total": w2 - w0, "cpu": c2 - c0, "torch_load": t1 - w0, "copy": w2 - t1}

            # The first replay also yields the state file, written as the evaluator writes it.
            rep = [replay()]
            d = rep[0][1]
            want = state_hash(loaded.model, d)
            state = {n: p.detach().cpu() for n, p in zip(d.names, d.params)}
            state.update(d.extra_state())
            ckpt.save_state(state_path, state)
            del state, d
            state_bytes = state_path.stat().st_size
            lod = [load()]  # reads the file just written: both sides read warm files
            for _ in range(repeats - 1):
                rep.append(replay())
                lod.append(load())
            same = state_hash(loaded.model, target) == want
            rs = {k: _stats([x[0][k] for x in rep]) for k in rep[0][0]}
            ls = {k: _stats([x[k] for x in lod]) for k in lod[0]}
            r = {
                "merge_every": merge_every,
                "replay_s": rs,
                "load_s": ls,
                "state_bytes": state_bytes,
                "hash_equal": same,
                "ratio": _ratio(rs["total"], ls["total"]),
                "ratio_cpu": _ratio(rs["cpu"], ls["cpu"]),
            }
            results.append(r)
            rows.append(
                [
                    merge_every,
                    _ms(rs["total"]),
                    _fmt_time(rs["apply"]["median"]),
                    _fmt_time(rs["basis"]["median"]),
                    _ms(ls["total"]),
                    _x(r["ratio"], 1),
                    _x(r["ratio_cpu"], 1),
                    "yes" if same else "NO",
                ]
            )
    # Gaussian catch-up regenerates z over all d scalars per message: one message timed (twice,
    # the faster kept), projected to the log's count (it would take hours on SmolLM2).
    gau = directions.Gaussian(loaded.model, names, cfg.run.seed)
    g_runs = []
    for i in range(2):
        t0 = time.perf_counter()
        gau.accumulate(0, i, 1e-9)
        gau.commit(0)
        g_runs.append(time.perf_counter() - t0)
    reset()
    g_msg = min(g_runs)
    replay_med = results[0]["replay_s"]["total"]["median"]
    out = {
        "model": opts.model,
        "steps": steps,
        "clients": clients,
        "messages": steps * clients,
        "target_s": 10.0,
        "gaussian_per_message_s": g_msg,
        "gaussian_projected_s": g_msg * steps * clients,
        "speedup_vs_gaussian": g_msg * steps * clients / replay_med,
        "repeats": repeats,
        "trainable": sum(b.numel() for b in base.values()),
        "log_bytes": log_bytes,
        "state_bytes": results[0]["state_bytes"],
        "size_ratio": results[0]["state_bytes"] / log_bytes,
        "variants": results,
    }
    table(
        opts.out,
        f"catchup: {steps} steps x {clients} clients = {steps * clients} messages onto a fresh "
        f"{opts.model} (subcge rank {cfg.subspace.rank})",
        [
            "merge_every",
            "replay (wall)",
            "of which apply",
            "of which basis",
            "load state (wall)",
            "replay/load wall",
            "cpu",
            "same hash",
        ],
        rows,
        [
            f"log {log_bytes:,} B vs state file {out['state_bytes']:,} B ({out['size_ratio']:,.0f}x larger)",
            "replay = read log + build direction + basis + Applier.apply_all; load = torch.load + copy_ into the "
            "model (file in the page cache)",
            f"merge_every {cfg.subspace.merge_every} (0 = once per epoch of {cfg.subspace.refresh} steps: "
            f"{-(-steps // cfg.subspace.refresh)} bases and merges); target for 10⁵ messages: "
            f"< {out['target_s']:.0f} s; basis = epoch 0's only (later epochs' are inside apply)",
            f"gaussian replay of the same log, projected from {_fmt_time(g_msg)} per message: "
            f"{out['gaussian_projected_s']:,.0f} s → subcge replay is {out['speedup_vs_gaussian']:,.0f}x faster "
            "(target >= 1,000x)",
        ],
    )
    return out


# -- 5. hop ----------------------------------------------------------------------------------------
def fig_hop(opts: Options) -> dict[str, Any]:
    """Flood latency per hop and per step with the in-memory network, N threads on a ring."""
    from seedflood.comm.memory import InMemoryNetwork
    from seedflood.core import topology as topo
    from seedflood.core.protocol import Protocol
    from seedflood.roles.client import Client

    sizes = (4, 8) if opts.quick else (8, 16, 32)
    steps = 3 if opts.quick else 5
    rows, results = [], []
    for n in sizes:
        cfg = _cfg([f"topology.nodes={n}", "topology.kind=ring", f"run.steps={steps}"])
        top = topo.build(cfg.topology)
        net = InMemoryNetwork({i: top.neighbors(i) for i in top.nodes}, timeout_s=60.0)
        hop_times: dict[int, list[float]] = {i: [] for i in top.nodes}
        step_times: dict[int, list[float]] = {i: [] for i in top.nodes}
        errors: list[BaseException] = []
        barrier = threading.Barrier(n + 1)

        def run(node: int) -> None:
            try:
                with net.endpoint(node) as tr:
                    null = NullDirection()
                    c = Client(
                        node,
                        top.neighbors(node),
                        Protocol.of(cfg, top.diameter),
                        null,  # type: ignore[arg-type]
                        lambda step: 0.0,
                        tr,
                    )
                    inner = c.hop

                    def timed_hop(t: int) -> None:
                        t0 = time.perf_counter()
                        inner(t)
                        hop_times[node].append(time.perf_counter() - t0)

                    c.hop = timed_hop  # type: ignore[method-assign]
                    barrier.wait()
                    for t in range(steps):
                        t0 = time.perf_counter()
                        c.step(t)
                        step_times[node].append(time.perf_counter() - t0)
            except BaseException as e:  # reported below
                errors.append(e)
                barrier.abort()

        threads = [threading.Thread(target=run, args=(i,), name=f"bench-hop-{i}") for i in top.nodes]
        for t in threads:
            t.start()
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        if errors:
            raise errors[0]
        hops = steps * top.diameter
        per_step = [max(step_times[i][s] for i in top.nodes) for s in range(steps)]  # the slowest node
        all_hops = [x for xs in hop_times.values() for x in xs]
        c = net.counter()
        r = {
            "nodes": n,
            "diameter": top.diameter,
            "steps": steps,
            "hops": hops,
            "hop_s": _stats(all_hops),
            "step_s": _stats(per_step),
            "wall_per_hop_s": wall / hops,
            "bytes_per_edge_per_step": c.mean_bytes_per_edge_per_step(),
        }
        results.append(r)
        rows.append(
            [
                n,
                top.diameter,
                _ms(r["hop_s"]),
                _fmt_time(r["wall_per_hop_s"]),
                _ms(r["step_s"]),
                f"{r['bytes_per_edge_per_step']:.0f}",
            ]
        )
    out = {"sizes": results}
    table(
        opts.out,
        f"hop: flooding only (no model) over the in-memory network, ring, {steps} steps, one thread per node",
        ["N", "diameter", "hop (per node call)", "wall/hop", "step (slowest node)", "B/edge/step"],
        rows,
        [
            "hop = encode outbox + exchange (wait for both neighbours) + decode + receive, as Client.hop does",
            "all nodes share one Python interpreter (GIL): this is the simulator's cost, not a network's",
        ],
    )
    return out


# -- 6. tradeoff -----------------------------------------------------------------------------------
def fig_tradeoff(opts: Options) -> dict[str, Any]:
    """Per subspace rank and merge cadence: the live per-step overhead (as a fraction of the two
    forwards of a step) and the catch-up time of 10⁵ messages (16 clients × 6,250 steps), projected
    from measured parts and checked against a measured replay of 100 steps."""
    from seedflood.core.config import SubspaceConfig
    from seedflood.core.directions import SubCGE
    from seedflood.core.protocol import Protocol
    from seedflood.core.replay import Applier
    from seedflood.rundir import checkpoint as ckpt

    ranks = (8, 32) if opts.quick else (8, 16, 32, 64)
    cadences = (1, 10, 100, 1000)
    clients, total, refresh = 16, 100_000, 1000
    steps_total = total // clients  # 6,250
    short = 20  # steps of the measured replay (merge_every 1 merges 20 times)
    w, forward = _forward_workload(opts, ["zo.lr=1e-4", f"topology.nodes={clients}"])
    model, names, seed = w.model, list(w.direction.names), w.cfg.run.seed
    params = dict(model.named_parameters())
    base = {n: params[n].detach().clone() for n in names}

    def reset() -> None:
        with torch.no_grad():
            for n in names:
                params[n].data.copy_(base[n])

    def best(fn: Callable[[], Any], k: int = 2) -> float:
        """Smallest CPU time of k calls (foreign load only adds time; CPU time moves least)."""
        xs = []
        for _ in range(k):
            c0 = time.process_time()
            fn()
            xs.append(time.process_time() - c0)
        return min(xs)

    forward()  # warm-up
    fwd = best(lambda: forward(), 3)
    rows, results = [], []
    with tempfile.TemporaryDirectory(prefix="seedflood-bench-") as tmp:
        log_path = Path(tmp) / "log.bin"
        header = {"base_identity": "bench", "base_hash": "", "trajectory": {"run.seed": seed}, "config": {}}
        writer = ckpt.LogWriter(log_path, header)
        for s in range(short):
            writer.append(s, _messages(s, clients, seed, 11))
        writer.close()
        read = best(lambda: ckpt.LogReader(log_path).read()) / (short * clients)  # per message
        proto = Protocol.of(w.cfg, 1)
        for r in ranks:
            sub = SubCGE(model, names, seed, SubspaceConfig(rank=r, refresh=refresh, merge_every=refresh))
            basis = best(lambda: (sub._bases.clear(), sub.basis(0)), 1)
            n_acc = 1024
            seeds = np.arange(n_acc, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # any distinct seeds
            coefs = _scalars(n_acc, r) * 1e-6
            acc = best(lambda: (sub.S.zero_(), sub._accumulate_many(0, seeds, coefs))) / n_acc

            def merge_after(n: int) -> float:
                """CPU time of one merge of a core that holds n messages (touched rows/cols only)."""
                xs = []
                for _ in range(2):
                    sub.S.zero_()
                    sub._accumulate_many(0, seeds[: min(n, n_acc)], coefs[: min(n, n_acc)])
                    c0 = time.process_time()
                    sub.merge_all()
                    xs.append(time.process_time() - c0)
                    reset()
                return min(xs)

            merges = {m: merge_after(clients * m) for m in cadences}
            # Forwards with a dense pending core (1,024 messages), per forward mode, each paired
            # with a forward on the same weights with nothing pending (the median of the paired
            # differences: forward times scatter by more than the effect on a shared machine).
            sub.S.zero_()
            sub._accumulate_many(0, seeds, coefs)
            w.direction = sub  # forward() runs under w.direction.current()
            pending: dict[str, dict[str, float]] = {}
            for mode in SubCGE.FORWARD_MODES:
                sub.forward = mode

                def build() -> None:
                    sub.invalidate()
                    if mode == "materialize":
                        sub._effective_weights()
                    elif mode == "lowrank":
                        sub._pending_factors()

                b = best(build)
                diffs = []
                for _ in range(3):
                    sub.S_epoch = None  # nothing pending: the plain forward
                    sub.invalidate()
                    c0 = time.process_time()
                    forward()
                    c1 = time.process_time()
                    sub.S_epoch = 0
                    build()  # not timed here: `b`
                    c2 = time.process_time()
                    forward()
                    diffs.append((time.process_time() - c2) - (c1 - c0))
                pending[mode] = {"build_s": b, "forward_extra_s": statistics.median(diffs)}
            sub.merge_all()
            reset()
            live: dict[str, dict[int, float]] = {mode: {} for mode in SubCGE.FORWARD_MODES}
            catch: dict[int, dict[str, float]] = {}
            for m in cadences:
                for mode, p in pending.items():
                    if m == 1:  # forwards never see a pending core: one small merge per step
                        live[mode][m] = merges[1] / (2 * fwd)
                    else:  # two forwards with S pending + the state's build, and a merge per m steps
                        live[mode][m] = (2 * p["forward_extra_s"] + p["build_s"] + merges[m] / m) / (2 * fwd)
                epochs = -(-steps_total // refresh)

                def project(steps: int) -> float:
                    return steps * clients * (read + acc) + (steps // m) * merges[m] + (-(-steps // refresh)) * basis

                rd = SubCGE(model, names, seed, SubspaceConfig(rank=r, refresh=refresh, merge_every=m))
                rd.basis(0)
                c0 = time.process_time()
                recs = ckpt.LogReader(log_path).read()[1]
                Applier(rd, proto).apply_all(recs)
                measured = time.process_time() - c0
                reset()
                catch[m] = {
                    "projected_s": project(steps_total),
                    "projected_short_s": project(short) - basis,  # the measured run had its basis
                    "measured_short_s": measured,
                    "merges": steps_total // m,
                    "epochs": epochs,
                }
                rows.append(
                    [
                        r,
                        m,
                        f"{100 * live['materialize'][m]:.1f}%",
                        f"{100 * live['lowrank'][m]:.1f}%",
                        f"{100 * live['carried'][m]:.1f}%",
                        f"{catch[m]['projected_s']:.1f} s",
                        f"{_fmt_time(catch[m]['measured_short_s'])} / {_fmt_time(catch[m]['projected_short_s'])}",
                    ]
                )
            results.append(
                {
                    "rank": r,
                    "basis_s": basis,
                    "accumulate_per_message_s": acc,
                    "merge_s": {str(m): v for m, v in merges.items()},
                    "pending_forward": pending,
                    "live_overhead": {mode: {str(m): v for m, v in x.items()} for mode, x in live.items()},
                    "catchup": {str(m): v for m, v in catch.items()},
                }
            )
    reset()
    out = {
        "model": opts.model,
        "forward_cpu_s": fwd,
        "read_per_message_s": read,
        "clients": clients,
        "messages": total,
        "steps": steps_total,
        "refresh": refresh,
        "short_steps": short,
        "ranks": results,
    }
    table(
        opts.out,
        f"tradeoff: subspace rank x merge cadence on {opts.model}; CPU times, plain forward {_fmt_time(fwd)}",
        [
            "rank",
            "merge_every",
            "live: materialize",
            "lowrank",
            "carried",
            f"catch-up {total:,} msgs (proj.)",
            f"{short} steps meas./proj.",
        ],
        rows,
        [
            "live = extra CPU per step / two plain forwards: merge_every 1 merges a 16-message core after every "
            "step; above 1 the forwards see W + U·S·Vᵀ (materialize: W_eff rebuilt once per step; lowrank: "
            "(x·V)·(U·S)ᵀ per layer; carried: x·V·Sᵀ·Uᵀ, the old hook) plus one merge per merge_every steps",
            f"catch-up = {total:,} × (read + accumulate) + merges + one basis per epoch of {refresh}; "
            f"read {_fmt_time(read)} and accumulate per message measured here",
        ],
    )
    return out


def fig_hops(opts: Options) -> dict[str, Any]:
    """Real gloo processes, N = 4…32: our flood hop against a bare exchange (bench_hops.py)."""
    from seedflood.bench import hops as bench_hops

    fig = bench_hops.fig_hops(opts.quick)
    bench_hops.print_hops(fig, opts.out)
    return fig


def fig_overlap(opts: Options) -> dict[str, Any]:
    """Real gloo processes with slowed hops: step time with flood.overlap off vs on
    (bench_overlap.py). The hops are slowed by a sleep per exchange equal to two forwards (a
    latency); `python -m seedflood.bench.overlap` also runs it over netns with a tbf cap."""
    from seedflood.bench import overlap as bench_overlap

    fig = bench_overlap.fig_overlap(opts.quick, rate=None)
    bench_overlap.print_overlap(fig, opts.out)
    return fig


def fig_sim(opts: Options) -> dict[str, Any]:
    """Client-steps per second of simulate's estimates, sequential vs batched, beside the floor
    (bench_sim.py)."""
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
}


# -- entry -----------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="seedflood bench", description="Measure the figures of docs/design.md §11.")
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
    if args.repeats < 0 or args.threads < 0 or args.gaussian_budget < 0:
        print("seedflood bench: error: --repeats, --threads and --gaussian-budget must be >= 0", file=sys.stderr)
        return 2
    opts = Options(args)
    names = [n for n in FIGURES if n in (args.only or FIGURES)]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with _keep_threads():
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
    with _quiet():
        for name in names:
            t0 = time.perf_counter()
            with _keep_threads(), torch.no_grad():
                figures[name] = RUNNERS[name](opts)
            figures[name]["wall_s"] = time.perf_counter() - t0
            print(f"   ({name}: {figures[name]['wall_s']:.1f} s)", file=opts.out)
    if json_out:
        path = Path(json_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"meta": meta, "figures": figures}, indent=2, sort_keys=True) + "\n")
        print(f"wrote {path}", file=opts.out)
    return 0
