"""`seedflood bench --only step`: ZO step efficiency = 2 × plain forward / client step time.

Owns: `fig_step`, which runs one client (a topology of one node) with subcge and with gaussian,
alternating with plain forwards, and splits each step into its forwards, apply and the rest.

Assumes: the model of `opts.model` and task rt (synthetic on the tiny model) load offline.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch

from seedflood.bench.common import Options, fmt_stats, load_cfg, now, stats, table


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


def fig_step(opts: Options) -> dict[str, Any]:
    """ZO step efficiency of one client (topology of one node): 2 × plain forward / whole step."""
    from seedflood.comm.memory import InMemoryNetwork
    from seedflood.core.flood.protocol import Protocol
    from seedflood.core.zo import family
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
        "subcge": load_cfg(base + ["zo.direction=subcge", "zo.lr=10"]),
        "gaussian": load_cfg(base + ["zo.direction=gaussian", "zo.lr=1e-6"]),
    }
    w = Workload.build(cfgs["subcge"])
    gcfg = cfgs["gaussian"]
    dirs = {"subcge": w.direction, "gaussian": family.build(w.model, gcfg.zo, gcfg.subspace, gcfg.run.seed)}
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
                w0, c0 = now()
                w.loss(0, step)
                w1, c1 = now()
            return w1 - w0, c1 - c0

        def step(fam: str, t: int) -> dict[str, float]:
            c, fwd = clients[fam], timers[fam]
            w.forget_batch()  # each family pays its batch's collation, as a real step does
            fwd.total, c.applier.apply.total = 0.0, 0.0
            w0, c0 = now()
            c.step(t)
            w1, c1 = now()
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
    f, f_cpu = stats([s["fwd"] for s in all_fwd]), stats([s["fwd_cpu"] for s in all_fwd])
    rows, fams = [], {}
    for fam, ss in samples.items():
        st, st_cpu = stats([s["step"] for s in ss]), stats([s["cpu"] for s in ss])
        pf = stats([s["forwards"] / 2 for s in ss])
        ap = stats([s["apply"] for s in ss])
        other = stats([s["step"] - s["forwards"] - s["apply"] for s in ss])
        paired = stats([2 * s["fwd"] / s["step"] for s in ss])  # each step against the forward just before it
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
                fmt_stats(st),
                fmt_stats(pf),
                fmt_stats(ap),
                fmt_stats(other),
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
        f"{out['threads']} threads; plain forward {fmt_stats(f)}",
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
