"""Scalar clip benchmark (`python -m seedflood.bench.clip`): what zo.clip costs an honest run, and what it saves against a lying peer.

Runs the debug config (launch/configs/debug.yaml: tiny random Llama, synthetic task) through the
shared-model simulation (`roles.sharedmodel.SharedModel`: every client's estimates on one model,
the real flood, one `Applier` apply per step, as `seedflood simulate` does) in six runs:

1. honest              — no lie, zo.clip = 0;
2. honest + clip       — no lie, zo.clip = --clip (what the clip costs when nobody lies);
3. ×F liar             — origin --liar sends F × its honest scalar (F = --factor), no clip;
4. ×F liar + clip      — the same lie, clipped;
5. random liar         — origin --liar replaces its scalar by a uniform draw in ±--random-scale
                         (seeded per step and k), no clip;
6. random liar + clip  — the same lie, clipped.

The lie is injected here only: a `SharedModel` subclass rewrites the liar's messages after the
honest estimates (its seeds and ids stay valid, the scalar stays under flood.max_scalar), so every
other client floods, checks and applies them as it would a peer's. After each run the model is
scored on the test split (`Workload.scores`: accuracy, loss, AUC) and on the whole train split
(mean loss); beside them, how many scalars the clip clamped (the liar's and honest ones) and the
run's wall time. Nothing here asserts a figure: these are measurements, printed.

    HF_HUB_OFFLINE=1 .venv/bin/python -m seedflood.bench.clip [--steps 60] [--clients 8] [--clip 5]
        [--factor 10] [--random-scale 100] [--liar 0] [--lies scaled,random] [--set section.key=value ...]
        [--out f.json]

--lies picks the liar pairs (rows 3-4 `scaled`, 5-6 `random`; `none` = the honest pair alone).
--out is written again after every run, so a run cut short keeps what it measured.

Assumes: run from the repository root (or --config); torch on CPU with one intra-op thread.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from seedflood.bench.common import add_run_args, figure_process, train_loss, write_json
from seedflood.core.config import runconfig as config
from seedflood.core.config.runconfig import Config
from seedflood.core.flood.protocol import Protocol
from seedflood.core.topology import resolve as topo
from seedflood.core.wire.message import Message
from seedflood.ml.workload import Workload
from seedflood.roles.sharedmodel import SharedModel

DEBUG = Path("launch/configs/debug.yaml")  # --config, relative to the working directory
Lie = Callable[[Message], float]  # the scalar the liar sends instead of its honest one


class LyingSharedModel(SharedModel):
    """A shared-model run in which origin `liar` sends `lie(m)` in place of each honest scalar."""

    def __init__(self, cfg: Config, protocol: Protocol, workload: Workload, liar: int, lie: Lie | None) -> None:
        super().__init__(cfg, topo.build(cfg.topology), protocol, workload)
        self.liar, self.lie = liar, lie

    def estimate(self, t: int) -> dict[int, list[Message]]:
        out = super().estimate(t)
        if self.lie is not None:
            out[self.liar] = [Message.make(m.origin, m.step, m.seed, self.lie(m), m.k) for m in out[self.liar]]
        return out


def scaled(factor: float) -> Lie:
    return lambda m: m.scalar * factor


def uniform(scale: float, seed: int) -> Lie:
    """A draw in [−scale, scale] per (step, k), reproducible from `seed`."""
    return lambda m: random.Random(f"{seed}/{m.step}/{m.k}").uniform(-scale, scale)


def one_run(cfg: Config, liar: int, lie: Lie | None) -> dict[str, Any]:
    """Train `cfg` with the given lie (None: honest) and score the result."""
    start = time.perf_counter()
    top = topo.build(cfg.topology)
    protocol = Protocol.of(cfg, top.diameter)
    w = Workload.build(cfg)
    sim = LyingSharedModel(cfg, protocol, w, liar, lie)
    clamped = {"liar": 0, "honest": 0}
    largest = [0.0]  # the largest |scalar| applied (after the clip), over the run

    def count(step: int, msgs: list[Message]) -> None:
        bound = protocol.clip_bound(msgs)
        for m in msgs:
            if abs(m.scalar) > bound:
                clamped["liar" if m.origin == liar and lie is not None else "honest"] += 1
            largest[0] = max(largest[0], min(abs(m.scalar), bound))

    sim.listeners.append(count)
    with torch.no_grad():
        sim.run()
        scores = w.scores()
    return {
        "test_accuracy": scores["accuracy"],
        "test_loss": scores["loss"],
        "test_auc": scores["auc"],
        "train_loss": train_loss(w),
        "clamped_liar": clamped["liar"],
        "clamped_honest": clamped["honest"],
        "messages": protocol.steps * protocol.per_step,
        "largest_applied_scalar": largest[0],
        "wall_s": time.perf_counter() - start,
    }


def zero_shot(cfg: Config) -> dict[str, Any]:
    w = Workload.build(cfg)
    with torch.no_grad():
        scores = w.scores()
    return {"test_accuracy": scores["accuracy"], "test_loss": scores["loss"], "train_loss": train_loss(w)}


def fmt(x: Any) -> str:
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.4g}"
    return str(x)


def table(rows: Sequence[tuple[str, dict[str, Any]]], keys: Sequence[str]) -> None:
    cells = [["run", *keys]] + [[name, *(fmt(r.get(k, "-")) for k in keys)] for name, r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    for i, r in enumerate(cells):
        print("  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    sys.stdout.flush()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--steps", type=int, default=60, help="steps of each run (default 60)")
    ap.add_argument("--clients", type=int, default=8, help="clients on the debug ring (default 8)")
    ap.add_argument("--clip", type=float, default=5.0, help="zo.clip of the clipped runs (default 5)")
    ap.add_argument("--factor", type=float, default=10.0, help="the ×F liar's factor (default 10)")
    ap.add_argument(
        "--random-scale", type=float, default=100.0, help="the random liar's scalars: uniform in ± this (default 100)"
    )
    ap.add_argument("--liar", type=int, default=0, help="the lying origin (default 0)")
    ap.add_argument(
        "--lies", default="scaled,random", help="the liar pairs to run: scaled, random, both (default) or none"
    )
    add_run_args(ap, DEBUG)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.steps < 1 or args.clients < 3 or not 0 <= args.liar < args.clients or args.clip < 1:
        ap.error("need --steps >= 1, --clients >= 3, 0 <= --liar < --clients and --clip >= 1")
    lies = [x for x in args.lies.split(",") if x and x != "none"]
    if unknown := sorted(set(lies) - {"scaled", "random"}):
        ap.error(f"--lies: unknown {', '.join(unknown)} (choose from scaled, random, none)")
    with figure_process(ap, args.config):  # hides the liar's warnings, hundreds of them
        return _measure(ap, args)


def _measure(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The runs (an honest and a liar pair per --lies) and the zero-shot row of `main`, printed (and written to --out)."""
    base = [f"run.steps={args.steps}", f"topology.nodes={args.clients}", "run.threads=1", *args.set]
    plain = config.load(args.config, base)
    clipped = config.load(args.config, [*base, f"zo.clip={args.clip}"])
    limit = plain.flood.max_scalar
    if args.random_scale >= limit:
        ap.error(f"--random-scale must stay under flood.max_scalar={limit:g} (a larger scalar is refused on the wire)")
    times, drawn = scaled(args.factor), uniform(args.random_scale, plain.run.seed)
    c = f" + clip {args.clip:g}"
    pairs: dict[str, tuple[str, Lie | None]] = {
        "honest": ("honest", None),
        "scaled": (f"x{args.factor:g} liar", times),
        "random": (f"random ±{args.random_scale:g} liar", drawn),
    }
    runs: list[tuple[str, Config, Lie | None]] = []
    for k in ["honest", *(k for k in ("scaled", "random") if k in args.lies.split(","))]:
        name, lie = pairs[k]
        runs += [(name, plain, lie), (name + c, clipped, lie)]
    print(
        f"seedflood.bench.clip: {args.config} with {' '.join(base)}; {plain.topology.kind} of {args.clients}, "
        f"zo.lr {plain.zo.lr:g}, {plain.zo.aggregate}, K = {plain.zo.perturbations}; liar: origin {args.liar}"
    )
    t0 = time.perf_counter()
    figures: list[tuple[str, dict[str, Any]]] = [("zero-shot (base model)", zero_shot(plain))]
    write(args, figures)
    for name, cfg, lie in runs:
        figures.append((name, one_run(cfg, args.liar, lie)))
        print(f"  {name}: {figures[-1][1]['wall_s']:.1f} s", flush=True)
        write(args, figures)
    print()
    table(
        figures,
        [
            "test_accuracy",
            "test_loss",
            "train_loss",
            "clamped_liar",
            "clamped_honest",
            "messages",
            "largest_applied_scalar",
        ],
    )
    print(f"\n({time.perf_counter() - t0:.0f} s in all)")
    if args.out:
        print(f"wrote {args.out}")
    return 0


def write(args: argparse.Namespace, figures: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """--out (if given) with the figures so far, replaced whole (a cut run keeps what it measured)."""
    if args.out:
        out = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": [{"run": n, **f} for n, f in figures]}
        write_json(args.out, out)


if __name__ == "__main__":
    raise SystemExit(main())
