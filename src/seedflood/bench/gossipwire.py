"""Gossip wire benchmark (`python -m seedflood.bench.gossipwire`): one dense mixing round of the
dsgd and dzsgd baselines with `algorithm.wire: frames` against `counted`, side by side.

Each of --clients vectors of --scalars fp32 (one per client, on --device) is mixed once over a
ring (x_i ← Σ_j W_ij x_j, Metropolis–Hastings), by the baselines' own `Gossip.mix`: `frames`
encodes every vector as a DENSE tensor frame, sends it through the in-process transport and
mixes the frames' views on the CPU; `counted` mixes the vectors where they lie and counts each
directed edge the same frame's bytes. Prints the seconds of the fastest of --repeats rounds of
each, their ratio, whether the two give the same bits (on the CPU they must) and the bytes each
counted (they must be equal). 135M-model scale: --scalars 106000000 (SmolLM2-135M's trainable
matrices). Nothing here asserts a figure: these are measurements, printed.

    .venv/bin/python -m seedflood.bench.gossipwire [--clients 8] [--scalars 10000000] [--device cpu]
        [--repeats 2]

Assumes: the vectors fit on the device twice over (counted holds the old and the new ones) and
the frames in host memory (frames holds one per client).
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from seedflood.comm.memory import InMemoryNetwork
from seedflood.core.config import runconfig
from seedflood.core.topology import builders
from seedflood.experiments.baselines_core import Ctx, Gossip


@dataclass(frozen=True)
class _Device:
    """What a mixing round reads of the model's flat view: where the vectors live."""

    device: torch.device


def one_round(wire: str, xs: list[torch.Tensor]) -> tuple[float, list[torch.Tensor], int]:
    """Seconds of one `Gossip.mix` of `xs` over a ring with `wire`, the mixed vectors, the bytes
    its counters hold."""
    n = len(xs)
    cfg = runconfig.load(None, ["algorithm.name=dsgd", f"algorithm.wire={wire}", f"topology.nodes={n}"])
    top = builders.ring(n)
    network = InMemoryNetwork({i: top.neighbors(i) for i in top.nodes}, timeout_s=600)
    flat: Any = _Device(xs[0].device)  # the one field of a Flat a round reads
    ctx = Ctx(cfg, "dsgd", None, flat, None, top, 0.0)  # type: ignore[arg-type]  # no model: mixing only
    ctx.endpoints = [network.endpoint(i) for i in top.nodes]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="hop") as ctx.pool:
        g = Gossip(ctx, xs[0])
        g.xs = [x.clone() for x in xs]
        if xs[0].is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        g.mix(0)
        if xs[0].is_cuda:
            torch.cuda.synchronize()
        took = time.perf_counter() - start
    return took, g.xs, ctx.counter().total()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m seedflood.bench.gossipwire", description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--scalars", type=int, default=10_000_000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    if args.clients < 3 or args.scalars < 1 or args.repeats < 1:
        ap.error("--clients >= 3 (a ring), --scalars >= 1, --repeats >= 1")
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(args.scalars, generator=gen).to(args.device) for _ in range(args.clients)]
    best: dict[str, tuple[float, list[torch.Tensor], int]] = {}
    for _ in range(args.repeats):
        for wire in ("frames", "counted"):  # interleaved: the machine's load falls on both alike
            took, mixed, sent = one_round(wire, xs)
            if wire not in best or took < best[wire][0]:
                best[wire] = (took, mixed, sent)
    (f, fx, fb), (c, cx, cb) = best["frames"], best["counted"]
    same = all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(fx, cx, strict=True))
    print(
        f"ring of {args.clients}, {args.scalars:,} fp32 a vector on {args.device}: one mixing round "
        f"frames {f:.3f} s, counted {c:.3f} s ({f / c:.1f}x); same bits: {'yes' if same else 'no'}; "
        f"bytes counted {fb:,} / {cb:,}"
    )
    return 0 if fb == cb else 1


if __name__ == "__main__":
    raise SystemExit(main())
