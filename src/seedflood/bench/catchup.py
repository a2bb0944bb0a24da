"""`seedflood bench --only catchup`: a fresh client catching up on 10⁵ messages.

Owns: `fig_catchup`: replaying base + log at the default merge cadence vs loading a full state
file (both must give the same state hash), and gaussian regeneration projected from one message.

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


def fig_catchup(opts: Options) -> dict[str, Any]:
    """A fresh client catching up on 10⁵ messages (16 clients × 6,250 steps; --quick: 2,000):
    replay base + log with the default merge cadence, vs torch.load of the trainable state, vs
    gaussian regeneration projected from one measured message."""
    from seedflood.core.flood.protocol import Protocol
    from seedflood.core.zo import directions, family
    from seedflood.core.zo.replay import Applier, state_hash
    from seedflood.ml import model as M
    from seedflood.rundir import checkpoints as ckpt
    from seedflood.rundir.logfile import LogReader, LogWriter

    steps, clients = (125, 16) if opts.quick else (6250, 16)
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

            def replay() -> tuple[dict[str, float], Any]:
                reset()
                w0, c0 = now()
                _, records = LogReader(log_path).read()
                t1 = time.perf_counter()
                d = family.build(loaded.model, vcfg.zo, vcfg.subspace, vcfg.run.seed)
                d.basis(0)  # a fresh client generates the epoch's basis: part of catching up
                t2 = time.perf_counter()
                Applier(d, Protocol.of(vcfg, 1)).apply_all(records)
                w3, c3 = now()
                return {"total": w3 - w0, "cpu": c3 - c0, "read": t1 - w0, "basis": t2 - t1, "apply": w3 - t2}, d

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
            rs = {k: stats([x[0][k] for x in rep]) for k in rep[0][0]}
            ls = {k: stats([x[k] for x in lod]) for k in lod[0]}
            r = {
                "merge_every": merge_every,
                "replay_s": rs,
                "load_s": ls,
                "state_bytes": state_bytes,
                "hash_equal": same,
                "ratio": ratio(rs["total"], ls["total"]),
                "ratio_cpu": ratio(rs["cpu"], ls["cpu"]),
            }
            results.append(r)
            rows.append(
                [
                    merge_every,
                    fmt_stats(rs["total"]),
                    fmt_time(rs["apply"]["median"]),
                    fmt_time(rs["basis"]["median"]),
                    fmt_stats(ls["total"]),
                    fmt_ratio(r["ratio"], 1),
                    fmt_ratio(r["ratio_cpu"], 1),
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
            f"gaussian replay of the same log, projected from {fmt_time(g_msg)} per message: "
            f"{out['gaussian_projected_s']:,.0f} s → subcge replay is {out['speedup_vs_gaussian']:,.0f}x faster "
            "(target >= 1,000x)",
        ],
    )
    return out
