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
`--stream` prints, without a model, the bytes of one step on the evaluator stream (and in the
log) for 4 to 64 clients, K = 1: unsigned, signed strict (each message's signature) and signed
churn (and the certificate of its commit: a quorum of 72-byte votes); the byte counts are
exact (the real encoders, over signatures of the right size).
Nothing is asserted: these are measurements, printed.

Assumes: run from the repository root (or --config); `cryptography` installed (the trust extra).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from seedflood.comm import identity
from seedflood.core.churn.agreement import GENESIS, Proof, Value, Vote, byzantine_quorum, step_digest
from seedflood.core.churn.certificate import certify
from seedflood.core.config import runconfig as config
from seedflood.core.flood.stepstream import encode_step
from seedflood.core.wire.message import Message
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


def stream_bytes(clients: int) -> tuple[int, int, int]:
    """(unsigned, signed strict, signed churn) bytes of one step of `clients` messages (K = 1, no
    roster change) as the attach node streams it to the evaluator."""
    msgs = [replace(Message.make(o, 7, o, 0.1 * (o + 1)), sig=bytes(64)) for o in range(clients)]
    value = Value(GENESIS, frozenset(range(clients)), (), step_digest(GENESIS, 7, msgs, ()))
    q = byzantine_quorum(clients, 0)
    votes = [replace(Vote(7, 0, o, 0, value).note(clients), signer=o, sig=bytes(64)) for o in range(q)]
    cert = certify(7, votes, value, Proof(0, frozenset(range(clients)), {}), clients)
    assert cert is not None
    unsigned = len(encode_step(msgs))
    return unsigned, len(encode_step(msgs, None, b"")), len(encode_step(msgs, None, cert.to_bytes()))


def print_stream_bytes() -> None:
    print("bytes of one step on the evaluator stream (and in the log), K = 1, no roster change")
    print(f"{'clients':>8}{'unsigned':>10}{'signed strict':>15}{'signed churn':>14}{'certificate votes':>19}")
    for n in (4, 8, 16, 64):
        u, st, ch = stream_bytes(n)
        print(f"{n:>8}{u:>10}{st:>15}{ch:>14}{byzantine_quorum(n, 0):>19}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m seedflood.bench.signing", description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--churn", action="store_true", help="a churn run (churn.settle=1): votes are signed too")
    ap.add_argument("--config", type=Path, default=DEBUG)
    ap.add_argument("--stream", action="store_true", help="only the evaluator stream's bytes per step (no model)")
    a = ap.parse_args(argv)
    if a.stream:
        print_stream_bytes()
        return 0
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
