"""`seedflood bench --only tradeoff`: subcge rank x merge cadence, live overhead vs catch-up.

Owns: `fig_tradeoff`: per rank and merge cadence, the live per-step overhead (as a fraction of a
step's two forwards, per forward mode) and the catch-up time of 10⁵ messages, projected from
measured parts and checked against a measured replay of a few steps. It reaches into SubCGE's
internals (`_accumulate_many`, `_bases`, ...) to time each part on its own.

Assumes: the model of `opts.model` loads offline; a temporary directory for the log.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seedflood.bench.common import Options, fmt_time, forward_workload, scalars, step_messages, table


def fig_tradeoff(opts: Options) -> dict[str, Any]:
    """Per subspace rank and merge cadence: the live per-step overhead (as a fraction of the two
    forwards of a step) and the catch-up time of 10⁵ messages (16 clients × 6,250 steps), projected
    from measured parts and checked against a measured replay of 100 steps."""
    from seedflood.core.config.trainsections import SubspaceConfig
    from seedflood.core.flood.protocol import Protocol
    from seedflood.core.zo.replay import Applier
    from seedflood.core.zo.subcge import SubCGE
    from seedflood.rundir.logfile import LogReader, LogWriter

    ranks = (8, 32) if opts.quick else (8, 16, 32, 64)
    cadences = (1, 10, 100, 1000)
    clients, total, refresh = 16, 100_000, 1000
    steps_total = total // clients  # 6,250
    short = 20  # steps of the measured replay (merge_every 1 merges 20 times)
    cfg, w, forward = forward_workload(opts, ["zo.lr=1e-4", f"topology.nodes={clients}"])
    model, names, seed = w.model, list(w.direction.names), cfg.run.seed
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
        writer = LogWriter(log_path, header)
        for s in range(short):
            writer.append(s, step_messages(s, clients, seed, 11))
        writer.close()
        read = best(lambda: LogReader(log_path).read()) / (short * clients)  # per message
        proto = Protocol.of(cfg, 1)
        for r in ranks:
            sub = SubCGE(model, names, seed, SubspaceConfig(rank=r, refresh=refresh, merge_every=refresh))
            basis = best(lambda: (sub._bases.clear(), sub.basis(0)), 1)
            n_acc = 1024
            seeds = np.arange(n_acc, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # any distinct seeds
            coefs = scalars(n_acc, r) * 1e-6
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
                recs = LogReader(log_path).read()[1]
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
                        f"{fmt_time(catch[m]['measured_short_s'])} / {fmt_time(catch[m]['projected_short_s'])}",
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
        f"tradeoff: subspace rank x merge cadence on {opts.model}; CPU times, plain forward {fmt_time(fwd)}",
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
            f"read {fmt_time(read)} and accumulate per message measured here",
        ],
    )
    return out
