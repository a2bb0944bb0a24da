"""What signing costs (`python -m seedflood.bench.signing`): bytes on every edge, CPU per step.

Runs the debug config (tiny random Llama, synthetic task) on a ring of --clients with one hop per
step through the real client loop in process (`roles.inprocess.simulate`: the flood, the codec,
the in-memory transport's byte counter, which counts exactly what gloo would be handed), twice:
unsigned, and with `trust.sign` (keys written to a temporary directory). Printed, per directed
edge: the bytes of one step in the steady middle of the run and the mean over the run (start-up
and drain included), and that both runs end on one hash. Then Ed25519's cost on this machine
(sign and verify, µs per call, timed over --ops calls) and what it comes to per client per step
(its K signatures, one verification per item received), from the signed run's flood counters.

    HF_HUB_OFFLINE=1 .venv/bin/python -m seedflood.bench.signing [--clients 16] [--steps 24]
        [--churn] [--ops 2000] [--config launch/configs/debug.yaml]

`--churn` measures a churn run (churn.settle=1) instead: votes flood as signed notes too.
Nothing is asserted: these are measurements, printed.

Assumes: run from the repository root (or --config); `cryptography` installed (the trust extra).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from seedflood.comm import identity
from seedflood.core.config import runconfig as config
from seedflood.roles.inprocess import SimResult, simulate

DEBUG = Path("launch/configs/debug.yaml")


def per_edge(r: SimResult, steps: int) -> tuple[float, float]:
    """(bytes of a middle step, mean bytes per step) per directed client edge."""
    n = len(r.counter.per_edge_total())  # every directed edge between clients carried bytes
    per_step = r.counter.per_step_total(include_evaluator=False)
    middle = [per_step.get(s, 0) for s in range(steps // 3, 2 * steps // 3)]
    return statistics.median(middle) / n, sum(per_step.values()) / n / steps


def time_ops(ops: int) -> tuple[float, float]:
    """(sign µs, verify µs) per call, Ed25519 over a 40-byte payload (a message's)."""
    with tempfile.TemporaryDirectory() as d:
        identity.write_keys(Path(d), 1)
        roster = identity.load_roster(Path(d))
        me = identity.load_identity(Path(d), 0, roster)
    payload = bytes(range(40))
    t0 = time.perf_counter()
    for _ in range(ops):
        sig = me.sign(payload)
    t1 = time.perf_counter()
    for _ in range(ops):
        roster.verify(0, payload, sig)
    t2 = time.perf_counter()
    return (t1 - t0) / ops * 1e6, (t2 - t1) / ops * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m seedflood.bench.signing", description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--churn", action="store_true", help="a churn run (churn.settle=1): votes are signed too")
    ap.add_argument("--config", type=Path, default=DEBUG)
    a = ap.parse_args(argv)
    if not a.config.exists():
        print(
            f"seedflood.bench.signing: error: no config at {a.config} (run from the repository root or pass --config)"
        )
        return 2
    if a.clients < 3 or a.steps < 6:
        print("seedflood.bench.signing: error: --clients >= 3 and --steps >= 6 (a ring, and a middle to measure)")
        return 2
    torch.set_num_threads(1)
    sets = [
        f"run.steps={a.steps}",
        "topology.kind=ring",
        f"topology.nodes={a.clients}",
        "flood.hops_per_step=1",
        "run.threads=1",
        *(["churn.settle=1", "transport.timeout_s=5"] if a.churn else []),
    ]
    mode = "churn (settle 1)" if a.churn else "strict"
    print(f"seedflood.bench.signing: {a.config}, ring of {a.clients}, 1 hop per step, {a.steps} steps, {mode}")
    with tempfile.TemporaryDirectory() as keys:
        identity.write_keys(Path(keys), a.clients)
        runs = {}
        for name, extra in (("unsigned", []), ("signed", ["trust.sign=true", f"trust.keys={keys}"])):
            t0 = time.perf_counter()
            runs[name] = simulate(config.load(a.config, [*sets, *extra]), hash_every_step=False)
            print(f"  {name}: {time.perf_counter() - t0:.1f} s")
    same = set(runs["signed"].hashes.values()) == set(runs["unsigned"].hashes.values())
    print()
    print(f"{'run':<10}{'B/edge/step (middle)':>22}{'B/edge/step (mean)':>21}{'forged':>8}")
    for name, r in runs.items():
        mid, mean = per_edge(r, a.steps)
        print(f"{name:<10}{mid:>22.1f}{mean:>21.1f}{sum(s.forged for s in r.flood.values()):>8}")
    print(f"one hash for both runs: {same}")
    sign_us, verify_us = time_ops(a.ops)
    stats = runs["signed"].flood.values()
    signs = statistics.mean(s.originated for s in stats) / a.steps
    verifies = statistics.mean(s.received for s in stats) / a.steps
    print(f"Ed25519 (cryptography): sign {sign_us:.1f} µs, verify {verify_us:.1f} µs per call ({a.ops} calls each)")
    print(
        f"per client per step: {signs:.1f} messages signed + {verifies:.1f} items verified = "
        f"{(signs * sign_us + verifies * verify_us) / 1000:.2f} ms CPU (notes it signs, votes included, come on top)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
