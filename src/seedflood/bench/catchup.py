"""`seedflood bench --only catchup`: a fresh client catching up on 10⁵ messages (10⁶ with
`--model tiny`).

Owns: `fig_catchup`: replaying base + log at the default merge cadence, split into read, check,
accumulate and merge, against its floor (reading the log plus the same merges, measured alone)
and against loading a full state file (both must give the same state hash), and gaussian
regeneration projected from one message.

Assumes: the model of `opts.model` loads offline; a temporary directory for the log and state.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from seedflood.bench.common import (
    Options,
    fmt_ratio,
    fmt_stats,
    fmt_time,
    load_cfg,
    now,
    ratio,
    stats,
    step_messages,
    table,
)


def timed_merges(d: Any) -> list[float]:
    """Wrap `d.merge_all` on this instance: the returned [wall s, CPU s, count] grows with each
    merge that merges something."""
    acc = [0.0, 0.0, 0.0]
    inner = d.merge_all

    def merge_all() -> None:
        w0, c0 = now()
        pending = getattr(d, "S_epoch", None) is not None
        inner()
        w1, c1 = now()
        acc[0] += w1 - w0
        acc[1] += c1 - c0
        acc[2] += pending

    d.merge_all = merge_all
    return acc


def fig_catchup(opts: Options) -> dict[str, Any]:
    """A fresh client catching up on 10⁵ messages (16 clients × 6,250 steps; tiny model: 10⁶,
    62,500 steps; --quick: 2,000): replay base + log with the default merge cadence (read as
    arrays, checked, accumulated, merged), vs its floor (read + the merges alone), vs torch.load
    of the trainable state, vs gaussian regeneration projected from one measured message."""
    from seedflood.core.flood.protocol import Protocol
    from seedflood.core.zo import directions, family
    from seedflood.core.zo.replay import Applier, state_hash
    from seedflood.ml import model as M
    from seedflood.rundir import checkpoints as ckpt
    from seedflood.rundir.logfile import LogReader, LogWriter

    steps, clients = (125, 16) if opts.quick else (62_500 if opts.tiny else 6250, 16)
    repeats = opts.repeats("catchup")
    common = opts.model_overrides() + [f"topology.nodes={clients}", "zo.lr=1e-3"]
    cfg = load_cfg(common)
    loaded = M.load(cfg.model)
    params = dict(loaded.model.named_parameters())
    names = directions.select_trainable(loaded.model, cfg.zo.trainable)
    base = {n: params[n].detach().clone() for n in names}

    def reset() -> None:
        with torch.no_grad():
            for n in names:
                params[n].data.copy_(base[n])

    # The default cadence (docs/design.md, Directions and exactness); `tradeoff` projects the others.
    variants = [cfg.subspace.merge_every]
    rows, results = [], []
    with tempfile.TemporaryDirectory(prefix="seedflood-bench-") as tmp:
        log_path = Path(tmp) / "log.bin"
        writer = LogWriter(
            log_path,
            {
                "base_identity": loaded.identity,
                "base_hash": loaded.base_hash,
                "trajectory": {"run.seed": cfg.run.seed},  # a v2 log derives seeds from it
                "config": cfg.to_dict(),
            },
        )
        for s in range(steps):
            writer.append(s, step_messages(s, clients, cfg.run.seed, 7))
        writer.close()
        log_bytes = log_path.stat().st_size
        for merge_every in variants:
            vcfg = load_cfg(common + [f"subspace.merge_every={merge_every}"])

            protocol = Protocol.of(vcfg, 1)

            def replay() -> tuple[dict[str, float], Any]:
                """One catch-up; each phase on the wall clock and (`*_cpu`) this process's CPU."""
                reset()
                t0 = now()
                _, cols = LogReader(log_path).read_columns()
                t1 = now()
                if protocol.first_bad(cols, [None] * len(cols)) is not None:  # what read_columns(check=protocol) runs
                    raise AssertionError("the bench's log failed its check")
                t2 = now()
                d = family.build(loaded.model, vcfg.zo, vcfg.subspace, vcfg.run.seed)
                merge = timed_merges(d)
                Applier(d, protocol).apply_all(cols)
                t3 = now()
                out = {"merges": merge[2]}
                for c, clock in ((0, ""), (1, "_cpu")):
                    out |= {
                        "total" + clock: t3[c] - t0[c],
                        "read" + clock: t1[c] - t0[c],
                        "check" + clock: t2[c] - t1[c],
                        "accumulate" + clock: t3[c] - t2[c] - merge[c],
                        "merge" + clock: merge[c],
                    }
                out["cpu"] = out["total_cpu"]
                return out, d

            def merges_alone(count: int) -> tuple[float, float]:
                """`count` merges of a dense core (bases drawn as a fresh client draws them): (wall, CPU)."""
                d = family.build(loaded.model, vcfg.zo, vcfg.subspace, vcfg.run.seed)
                g = torch.Generator().manual_seed(0)
                w0, c0 = now()
                for e in range(count):
                    d.S.copy_(torch.randn(d.S.shape, generator=g) * 1e-6)  # type: ignore[attr-defined]
                    d.S_epoch = e  # type: ignore[attr-defined]
                    d.merge_all()
                w1, c1 = now()
                reset()
                return w1 - w0, c1 - c0

            target = family.build(loaded.model, vcfg.zo, vcfg.subspace, vcfg.run.seed)
            state_path = Path(tmp) / f"state-{merge_every}.pt"

            def load() -> dict[str, float]:
                reset()
                w0, c0 = now()
                st = ckpt.load_state(state_path)
                t1 = time.perf_counter()
                with torch.no_grad():
                    for n in names:
                        params[n].data.copy_(st[n])
                target.load_extra_state({k: v for k, v in st.items() if k.startswith("subcge.")})
                w2, c2 = now()
                return {"total": w2 - w0, "cpu": c2 - c0, "torch_load": t1 - w0, "copy": w2 - t1}

            # The first replay also yields the state file, written as the evaluator writes it.
            rep = [replay()]
            d = rep[0][1]
            want = state_hash(loaded.model, d)
            n_merges = int(rep[0][0]["merges"])
            state = {n: p.detach().cpu() for n, p in zip(d.names, d.params)}
            state.update(d.extra_state())
            ckpt.save_state(state_path, state)
            del state, d
            state_bytes = state_path.stat().st_size
            floor = [merges_alone(n_merges)]
            lod = [load()]  # reads the file just written: both sides read warm files
            for _ in range(repeats - 1):
                rep.append(replay())
                floor.append(merges_alone(n_merges))
                lod.append(load())  # last: the model holds the loaded state when its hash is taken
            same = state_hash(loaded.model, target) == want
            rs = {k: stats([x[0][k] for x in rep]) for k in rep[0][0]}
            ls = {k: stats([x[k] for x in lod]) for k in lod[0]}
            ms = stats([w for w, _ in floor])
            ms_cpu = stats([c for _, c in floor])
            floor_s = rs["read"]["median"] + ms["median"]
            floor_cpu = rs["read_cpu"]["median"] + ms_cpu["median"]
            r = {
                "merge_every": merge_every,
                "replay_s": rs,
                "load_s": ls,
                "state_bytes": state_bytes,
                "hash_equal": same,
                "merges_alone_s": ms,
                "merges_alone_cpu_s": ms_cpu,
                "floor_s": floor_s,
                "floor_cpu_s": floor_cpu,
                "ratio_to_floor": rs["total"]["median"] / floor_s,
                "ratio_to_floor_cpu": rs["total_cpu"]["median"] / floor_cpu,
                "ratio": ratio(rs["total"], ls["total"]),
                "ratio_cpu": ratio(rs["cpu"], ls["cpu"]),
            }
            results.append(r)

            def both(k: str) -> str:
                return f"{fmt_time(rs[k]['median'])} / {fmt_time(rs[k + '_cpu']['median'])}"

            rows.append(
                [
                    merge_every,
                    fmt_stats(rs["total"]),
                    *(both(k) for k in ("total", "read", "check", "accumulate", "merge")),
                    f"{fmt_time(floor_s)} / {fmt_time(floor_cpu)}",
                    f"{r['ratio_to_floor']:.2f}x / {r['ratio_to_floor_cpu']:.2f}x",
                    fmt_stats(ls["total"]),
                    fmt_ratio(r["ratio"], 1),
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
        "target_s": 2.0 if opts.tiny and not opts.quick else 10.0,  # 10⁶ messages onto tiny: < 2 s
        "target_ratio_to_floor": 1.5,
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
            "replay (wall / cpu)",
            "read",
            "check",
            "accumulate",
            "merge",
            "floor: read + merges",
            "replay/floor (wall / cpu)",
            "load state (wall)",
            "replay/load",
            "same hash",
        ],
        rows,
        [
            f"log {log_bytes:,} B vs state file {out['state_bytes']:,} B ({out['size_ratio']:,.0f}x larger)",
            "replay = read the log as arrays + check every step (Protocol.first_bad) + build the direction + "
            "Applier.apply_all (accumulate = apply less its merges; merge = W += U·S·Vᵀ with each epoch's basis "
            f"drawn, {results[0]['replay_s']['merges']['median']:.0f} merges); floor = the read + as many merges "
            "of a dense core alone (wall / CPU medians: the CPU clock hardly moves with foreign load); load = torch.load + copy_ into the model (file in the page cache)",
            f"merge_every {cfg.subspace.merge_every} (0 = once per epoch of {cfg.subspace.refresh} steps: "
            f"{-(-steps // cfg.subspace.refresh)} bases and merges); goals: 10⁵ messages onto SmolLM2 < 10 s and "
            f"within {out['target_ratio_to_floor']}x the floor, 10⁶ onto tiny < 2 s",
            f"gaussian replay of the same log, projected from {fmt_time(g_msg)} per message: "
            f"{out['gaussian_projected_s']:,.0f} s → subcge replay is {out['speedup_vs_gaussian']:,.0f}x faster "
            "(target >= 1,000x)",
        ],
    )
    return out
