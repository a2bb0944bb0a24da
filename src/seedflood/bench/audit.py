"""What verification by recomputation catches and costs (`python -m seedflood.bench.audit`).

Runs the debug config (tiny random Llama, synthetic task) on a ring of --clients under churn
(churn.settle=1, so a caught liar is excluded by a committed step) through the real client loop
in process (`roles.inprocess.simulate`), for each audit rate in --rates:
- honest: nobody lies; the recomputation's cost per client per step — forwards (2 per scalar
  recomputed) and the wall time spent in them (one thread per client);
- every step: origin --liar sends 10 × its scalar at every step;
- 10 % of steps: the same lie on a deterministic 10 % of its steps.
For each liar run: the first step it lied at; the detection latency in steps from that lie to the
first evidence any honest client took (its own recomputation, or a re-checked RECOMPUTE note, at
that client's local step); the first step committed without the liar, relative to its first lie
(0 or less: not even that lie was applied — the vote on a step comes after the evidence about its
scalars); and how many of its lies were applied. "-": not caught within the run. One run per cell and seed: the latencies are draws (the sample is a
hash of each step's messages), --seeds averages over run seeds.

    HF_HUB_OFFLINE=1 .venv/bin/python -m seedflood.bench.audit [--clients 8] [--steps 30]
        [--rates 1,0.5,0.25,0.1] [--seeds 1] [--liar 1] [--config launch/configs/debug.yaml]

Nothing is asserted: these are measurements, printed. What a run mixing kinds of CPU needs for
`trust.audit_tolerance` is measured by `python -m seedflood.bench.auditkinds`.

Assumes: run from the repository root (or --config).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from seedflood.core.config import runconfig as config
from seedflood.roles.inprocess import SimResult, simulate
from seedflood.roles.lying import Lie

DEBUG = Path("launch/configs/debug.yaml")
PATTERNS = {"every step": Lie("scale", 10.0), "10 % of steps": Lie("scale", 10.0, rate=0.1)}


def caught(r: SimResult, liar: int, lie: Lie, steps: int) -> tuple[int | None, int | None, int | None, int]:
    """(first lie step, steps to the first evidence, steps to the exclusion, lies applied)."""
    lied = [s for s in range(steps) if lie.lies_at(liar, s)]
    first = lied[0] if lied else None
    found = [a.found[liar][1] for n, a in r.audits.items() if n != liar and liar in a.found]
    out = [s for s, c in sorted(r.changes.items()) if liar in c.audit]
    applied = sum(1 for s, msgs in r.records if s in lied and any(m.origin == liar for m in msgs))
    if first is None:
        return None, None, None, applied
    return (
        first,
        min(found) - first if found else None,
        out[0] - first if out else None,
        applied,
    )


def _mean(xs: list[int | None]) -> str:
    got = [x for x in xs if x is not None]
    if not got:
        return "-"
    caught_in = f"{statistics.mean(got):.1f}"
    return caught_in if len(got) == len(xs) else f"{caught_in} ({len(got)}/{len(xs)})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m seedflood.bench.audit", description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rates", default="1,0.5,0.25,0.1")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--liar", type=int, default=1)
    ap.add_argument("--config", type=Path, default=DEBUG)
    a = ap.parse_args(argv)
    if not a.config.exists():
        print(f"seedflood.bench.audit: error: no config at {a.config} (run from the repository root or pass --config)")
        return 2
    try:
        rates = [float(x) for x in a.rates.split(",")]
    except ValueError:
        rates = []
    if a.clients < 3 or a.steps < 4 or not 0 <= a.liar < a.clients or a.seeds < 1 or not rates:
        print(
            "seedflood.bench.audit: error: --clients >= 3, --steps >= 4, --liar in 0..clients-1, --seeds >= 1, "
            "--rates a comma-separated list of rates in (0, 1]"
        )
        return 2
    if not all(0 < x <= 1 for x in rates):
        print("seedflood.bench.audit: error: --rates must lie in (0, 1]")
        return 2
    torch.set_num_threads(1)
    base = [
        f"run.steps={a.steps}",
        "topology.kind=ring",
        f"topology.nodes={a.clients}",
        "churn.settle=1",
        "transport.timeout_s=5",
        "run.threads=1",
    ]
    k = config.load(a.config, base).zo.perturbations
    print(
        f"seedflood.bench.audit: {a.config}, ring of {a.clients}, churn (settle 1), {a.steps} steps, "
        f"K = {k}, liar node {a.liar} (10 × its scalar), {a.seeds} seed(s)"
    )
    rows = []
    for rate in rates:
        cost: list[tuple[float, float]] = []
        found: dict[str, list[list[int | None]]] = {p: [] for p in PATTERNS}
        t0 = time.perf_counter()
        for seed in range(a.seeds):
            sets = [*base, f"run.seed={seed}", f"trust.audit={rate}"]
            honest = simulate(config.load(a.config, sets), hash_every_step=False)
            cost += [(s.forwards / a.steps, s.seconds / a.steps) for s in honest.audits.values()]
            for name, lie in PATTERNS.items():
                r = simulate(config.load(a.config, sets), hash_every_step=False, lies={a.liar: lie})
                found[name].append(list(caught(r, a.liar, lie, a.steps)))
        print(f"  rate {rate:g}: {time.perf_counter() - t0:.1f} s")
        fwd = statistics.mean(c[0] for c in cost)
        ms = statistics.mean(c[1] for c in cost) * 1000
        row = [f"{rate:g}", f"{rate * (a.clients - 1) * k * 2:.1f}", f"{fwd:.1f}", f"{fwd / (2 * k):.1f}", f"{ms:.0f}"]
        for name in PATTERNS:
            cells = found[name]
            row += [
                _mean([c[0] for c in cells]),
                _mean([c[1] for c in cells]),
                _mean([c[2] for c in cells]),
                _mean([c[3] for c in cells]),
            ]
        rows.append(row)
    head = ["rate", "fwd/step (expected)", "fwd/step", "× own", "ms/step"]
    for name in PATTERNS:
        head += [f"{name}: first lie", "evidence +", "excluded +", "lies applied"]
    print()
    print("extra forwards and wall time per client per step (honest run), and detection latency in steps:")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
