"""`seedflood bench --only apply`: time to apply one step of n messages, subcge vs gaussian.

Owns: `fig_apply`, which times Applier.apply on n = 16…1024 messages (subcge: accumulate into S,
the merge timed on its own; gaussian: while its budget lasts), each as a fraction of one plain
forward measured in the same run.

Assumes: the model of `opts.model` loads offline.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from seedflood.bench.common import (
    Options,
    fmt_ratio,
    fmt_stats,
    fmt_time,
    forward_workload,
    load_cfg,
    now,
    ratio,
    stats,
    step_messages,
    table,
)


def fig_apply(opts: Options) -> dict[str, Any]:
    """Applier.apply on one step of n messages, subcge (accumulate; merge timed on its own) vs
    gaussian, each against one plain forward measured in the same run."""
    from seedflood.core.flood.protocol import Protocol
    from seedflood.core.zo import directions
    from seedflood.core.zo.replay import Applier
    from seedflood.core.zo.subcge import SubCGE

    ns = [16, 64, 256, 1024]
    repeats = opts.repeats("apply")
    cfg, w, forward = forward_workload(opts, ["zo.lr=1e-4"])
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
        applier = Applier(direction, Protocol.of(load_cfg([f"topology.nodes={len(msgs)}"]), 1))
        w0, c0 = now()
        applier.apply(0, msgs)
        w1, c1 = now()
        direction.merge_all()
        return w1 - w0, c1 - c0, time.perf_counter() - w1

    # Warm-up (first allocations, first matmuls, first forward) for everything, not timed.
    forward()
    once(sub, step_messages(0, 16, cfg.run.seed, 0))
    rate = once(gau, step_messages(0, 1, cfg.run.seed, 0))[0]  # s per gaussian message, refined below
    spent, planned = 0.0, 0.0  # gaussian seconds spent; the most a started run was expected to bring it to
    fwd: list[tuple[float, float]] = []
    rows, per_n = [], []
    for n in ns:
        msgs = step_messages(0, n, cfg.run.seed, n)
        s_runs, g_runs = [], []
        for r in range(repeats):
            if n == ns[0] or (n == ns[-1] and r < 2):  # forwards interleaved with the applies
                fwd.append(forward())
            s_runs.append(once(sub, msgs))
            # gaussian alternates with subcge while it fits the budget; one run when a run is long
            if spent + rate * n <= opts.gaussian_budget_s and (r == 0 or rate * n < 2.0):
                planned = max(planned, spent + rate * n)  # a run may take longer than expected (a loaded machine)
                g_runs.append(once(gau, msgs))
                spent += g_runs[-1][0]
                rate = g_runs[-1][0] / n
        s_wall, s_cpu, s_merge = (stats([x[i] for x in s_runs]) for i in range(3))
        g_wall = stats([x[0] for x in g_runs]) if g_runs else None
        g_cpu = stats([x[1] for x in g_runs]) if g_runs else None
        e = {
            "n": n,
            "subcge_s": s_wall,
            "subcge_cpu_s": s_cpu,
            "subcge_merge_s": s_merge,
            "gaussian_s": g_wall,
            "gaussian_cpu_s": g_cpu,
            "ratio": ratio(g_wall, s_wall),
            "ratio_cpu": ratio(g_cpu, s_cpu),
        }
        per_n.append(e)
    f_wall, f_cpu = stats([x[0] for x in fwd]), stats([x[1] for x in fwd])
    for e in per_n:
        e["subcge_of_forward"] = e["subcge_s"]["median"] / f_wall["median"]
        e["subcge_of_forward_cpu"] = e["subcge_cpu_s"]["median"] / f_cpu["median"]
        e["merge_of_forward"] = e["subcge_merge_s"]["median"] / f_wall["median"]
        g = e["gaussian_s"]
        rows.append(
            [
                e["n"],
                fmt_stats(e["subcge_s"]),
                f"{100 * e['subcge_of_forward']:.2f}% / {100 * e['subcge_of_forward_cpu']:.2f}%",
                fmt_time(e["subcge_merge_s"]["median"]),
                f"{100 * e['merge_of_forward']:.1f}%",
                fmt_stats(g),
                fmt_ratio(e["ratio"]),
                fmt_ratio(e["ratio_cpu"]),
                fmt_time(g["median"] / e["n"]) if g else "skipped",
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
        "gaussian_planned_s": planned,
        "subcge_basis_s": stats(basis),
        "per_n": per_n,
    }
    table(
        opts.out,
        f"apply: one step of n messages through Applier.apply on {opts.model} "
        f"(d = {d:,} over {len(names)} matrices, rank {cfg.subspace.rank}, {out['threads']} threads); "
        f"plain forward {fmt_stats(f_wall)}",
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
            f"{fmt_stats(out['subcge_basis_s'])}",
            f"a gaussian run starts only while the total it is expected to bring stays under {opts.gaussian_budget_s:.0f} s "
            f"(spent {spent:.1f} s); "
            "'skipped' sizes are not extrapolated",
        ],
    )
    return out
