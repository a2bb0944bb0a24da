"""`seedflood bench --only hop`: flood latency per hop and per step over the in-memory network.

Owns: `fig_hop`, which floods (no model: NullDirection and a zero loss) on rings of N nodes, one
thread per node in this process; the real-process counterpart is `bench.hops`.

Assumes: nothing beyond the in-memory network; all nodes share one interpreter (the GIL), so these
are the simulator's costs, not a network's.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from seedflood.bench.common import NullDirection, Options, fmt_stats, fmt_time, load_cfg, stats, table


def fig_hop(opts: Options) -> dict[str, Any]:
    """Flood latency per hop and per step with the in-memory network, N threads on a ring."""
    from seedflood.comm.memory import InMemoryNetwork
    from seedflood.core.flood.protocol import Protocol
    from seedflood.core.topology import resolve as topo
    from seedflood.roles.client import Client

    sizes = (4, 8) if opts.quick else (8, 16, 32)
    steps = 3 if opts.quick else 5
    rows, results = [], []
    for n in sizes:
        cfg = load_cfg([f"topology.nodes={n}", "topology.kind=ring", f"run.steps={steps}"])
        top = topo.build(cfg.topology)
        net = InMemoryNetwork({i: top.neighbors(i) for i in top.nodes}, timeout_s=60.0)
        hop_times: dict[int, list[float]] = {i: [] for i in top.nodes}
        step_times: dict[int, list[float]] = {i: [] for i in top.nodes}
        errors: list[BaseException] = []
        barrier = threading.Barrier(n + 1)

        def run(node: int) -> None:
            try:
                with net.endpoint(node) as tr:
                    null = NullDirection()
                    c = Client(
                        node,
                        top.neighbors(node),
                        Protocol.of(cfg, top.diameter),
                        null,  # type: ignore[arg-type]
                        lambda step: 0.0,
                        tr,
                    )
                    inner = c.hop

                    def timed_hop(t: int) -> None:
                        t0 = time.perf_counter()
                        inner(t)
                        hop_times[node].append(time.perf_counter() - t0)

                    c.hop = timed_hop  # type: ignore[method-assign]
                    barrier.wait()
                    for t in range(steps):
                        t0 = time.perf_counter()
                        c.step(t)
                        step_times[node].append(time.perf_counter() - t0)
            except BaseException as e:  # reported below
                errors.append(e)
                barrier.abort()

        threads = [threading.Thread(target=run, args=(i,), name=f"bench-hop-{i}") for i in top.nodes]
        for t in threads:
            t.start()
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        if errors:
            raise errors[0]
        hops = steps * top.diameter
        per_step = [max(step_times[i][s] for i in top.nodes) for s in range(steps)]  # the slowest node
        all_hops = [x for xs in hop_times.values() for x in xs]
        c = net.counter()
        r = {
            "nodes": n,
            "diameter": top.diameter,
            "steps": steps,
            "hops": hops,
            "hop_s": stats(all_hops),
            "step_s": stats(per_step),
            "wall_per_hop_s": wall / hops,
            "bytes_per_edge_per_step": c.mean_bytes_per_edge_per_step(),
        }
        results.append(r)
        rows.append(
            [
                n,
                top.diameter,
                fmt_stats(r["hop_s"]),
                fmt_time(r["wall_per_hop_s"]),
                fmt_stats(r["step_s"]),
                f"{r['bytes_per_edge_per_step']:.0f}",
            ]
        )
    out = {"sizes": results}
    table(
        opts.out,
        f"hop: flooding only (no model) over the in-memory network, ring, {steps} steps, one thread per node",
        ["N", "diameter", "hop (per node call)", "wall/hop", "step (slowest node)", "B/edge/step"],
        rows,
        [
            "hop = encode outbox + exchange (wait for both neighbours) + decode + receive, as Client.hop does",
            "all nodes share one Python interpreter (GIL): this is the simulator's cost, not a network's",
        ],
    )
    return out
