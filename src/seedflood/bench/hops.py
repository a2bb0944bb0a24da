"""Benchmark: flood hops between real processes against the wire's floor, as N grows.

Owns the figure `hops`: for each graph (ring, 2-D torus, complete) and N (4, 8, 16, 32; quick:
ring, 4 and 8) it starts N real processes (gloo over loopback on a free port, no evaluator, no
model: bench.NullDirection and a zero loss) and, in the SAME processes, alternating step by
step, times
  ours: `Client.step` of a flood step: diameter × `Client.hop` (encode the outbox per neighbour,
        `GlooTransport.exchange`, decode against the wire limits, `Flood.receive`), each hop
        timed, its `exchange` part timed separately;
  bare: the same number of hops of plain torch.distributed: irecv + isend of one uint8 tensor of
        BARE_BYTES to / from each neighbour, wait for all; the floor any transport over gloo pays.
Per configuration it prints the median (min–max) hop time of both over every (process, hop),
their ratio (target ≤ 1.5), the flood step (slowest process) against 1.5 × diameter × bare hop,
and the wall time per step (first process in to last process out, over the processes' shared
monotonic clock). The timed steps run as `repeats` consecutive blocks of `steps` (default 5 × 5)
in the same processes; the CPU ratio (ours / bare, goal ≤ 1.2) and the hop wall ratio (goal
≤ 1.1) are each computed per block and printed as the median (min–max) over the blocks.

Rules: nothing here asserts a timing; `fig_hops` returns JSON-friendly figures and
`print_hops` prints them (`seedflood bench` registers both). Alternating puts a burst of foreign
load on both sides. On a machine with fewer cores than processes every hop also waits for the
scheduler; the ratio stays meaningful, the absolute times do not.

Assumes: POSIX, loopback TCP, `python -m seedflood.bench.hops --worker ...` importable from the
parent's sys.path (PYTHONPATH is passed on). Workers use one intra-op thread.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from seedflood.core.flood.transport import HEADER

BARE_BYTES = HEADER + 13 + 5
"""Bare message size: length header + a one-record v2 frame (13-byte header, origin byte + f32
scalar): what a ring hop carries; a flood's frames are this size or a few records more, where
loopback latency dominates anyway."""
KINDS = ("ring", "torus", "complete")
SIZES = (4, 8, 16, 32)
QUICK_SIZES = (4, 8)
TAG_BARE = 0x5EED_0100  # away from gloo.py's hop and evaluator tags
WORKER_TIMEOUT_S = 300.0


def _stats(xs: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


# -- the worker: one process of a configuration ----------------------------------------------------
def _worker(kind: str, n: int, steps: int, warmup: int, rank: int, port: int) -> dict[str, Any]:
    """Run `warmup` + `steps` (every repeat's) alternating (ours, bare) steps as node `rank`; return its timings."""
    import torch
    import torch.distributed as dist

    from seedflood.bench.common import NullDirection
    from seedflood.comm import runtime
    from seedflood.comm.gloo import GlooTransport
    from seedflood.core.config import runconfig as config
    from seedflood.core.config.systemsections import TransportConfig
    from seedflood.core.flood.protocol import Protocol
    from seedflood.core.topology import resolve as topo
    from seedflood.roles.client import Client

    torch.set_num_threads(1)
    cfg = config.load(None, [f"topology.kind={kind}", f"topology.nodes={n}", f"run.steps={warmup + steps}"])
    top = topo.build(cfg.topology)
    peers = top.neighbors(rank)
    world = runtime.World(rank, n, 0, "127.0.0.1", port, "env", local_world_size=n)
    out: dict[str, Any] = {"rank": rank, "peers": len(peers), "diameter": top.diameter}
    perf, cpu = time.perf_counter, time.process_time
    with runtime.process_group(world, TransportConfig(timeout_s=WORKER_TIMEOUT_S)):
        with GlooTransport(rank, peers, rank_of=lambda v: v) as tr:  # no evaluator: node = rank
            c = Client(
                rank,
                peers,
                Protocol.of(cfg, top.diameter),
                NullDirection(),
                lambda t: 0.0,
                tr,
                routes=top.routes(rank),
            )  # type: ignore[arg-type]
            hop, exchange = c.hop, tr.exchange
            rec: dict[str, list[float]] = {"hop": [], "hop_cpu": [], "exchange": []}

            def timed_exchange(frames: Any, t: int) -> dict[int, bytes]:
                t0 = perf()
                got = exchange(frames, t)
                rec["exchange"].append(perf() - t0)
                return got

            def timed_hop(t: int) -> None:
                t0, c0 = perf(), cpu()
                hop(t)
                rec["hop"].append(perf() - t0)
                rec["hop_cpu"].append(cpu() - c0)

            tr.exchange = timed_exchange  # type: ignore[method-assign]
            c.hop = timed_hop  # type: ignore[method-assign]
            send = {p: torch.zeros(BARE_BYTES, dtype=torch.uint8) for p in peers}
            recv = {p: torch.empty(BARE_BYTES, dtype=torch.uint8) for p in peers}

            def bare_hop() -> None:
                works = [dist.irecv(recv[p], p, tag=TAG_BARE) for p in peers]
                works += [dist.isend(send[p], p, tag=TAG_BARE) for p in peers]
                for w in works:
                    w.wait()

            bare: dict[str, list[float]] = {"hop": [], "hop_cpu": []}
            steps_ours: list[tuple[float, float]] = []  # (start, end) on the shared monotonic clock
            steps_bare: list[tuple[float, float]] = []
            for t in range(warmup + steps):
                if t == warmup:  # the warm-up (connections, first-use costs) is not reported
                    rec = {k: [] for k in rec}
                    bare = {k: [] for k in bare}
                    steps_ours.clear()
                    steps_bare.clear()
                t0 = perf()
                c.step(t)
                steps_ours.append((t0, perf()))
                t0 = perf()
                for _ in range(c.protocol.hops):
                    h0, c0 = perf(), cpu()
                    bare_hop()
                    bare["hop"].append(perf() - h0)
                    bare["hop_cpu"].append(cpu() - c0)
                steps_bare.append((t0, perf()))
            c.drain()
            counter = tr.counter
    hops = len(rec["hop"])
    out.update(
        ours=rec,
        bare=bare,
        steps_ours=steps_ours,
        steps_bare=steps_bare,
        hops_per_step=c.protocol.hops,
        # bytes this process handed to gloo per neighbour per timed hop (header + frame)
        bytes_per_edge_hop=sum(b for s, _, _, b in counter.rows() if s >= warmup) / max(1, hops * len(peers)),
    )
    return out


def _worker_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m seedflood.bench.hops --worker")
    p.add_argument("--worker", action="store_true")
    p.add_argument("kind", choices=KINDS)
    p.add_argument("n", type=int)
    p.add_argument("steps", type=int)
    p.add_argument("warmup", type=int)
    a = p.parse_args(argv)
    rank, port = int(os.environ["RANK"]), int(os.environ["MASTER_PORT"])
    print(json.dumps(_worker(a.kind, a.n, a.steps, a.warmup, rank, port)), flush=True)
    return 0


# -- the parent: start N workers per configuration, gather, reduce ----------------------------------
def _run_config(kind: str, n: int, steps: int, warmup: int, timeout_s: float) -> list[dict[str, Any]]:
    """Start the N workers of one configuration on a free port; their JSON reports in rank order."""
    from seedflood.comm.runtime import free_port

    src = str(Path(__file__).resolve().parents[2])
    env_base = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(n),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, "-m", "seedflood.bench.hops", "--worker", kind, str(n), str(steps), str(warmup)]
    with tempfile.TemporaryDirectory(prefix="seedflood-hops-") as tmp:
        files: list[tuple[IO[str], IO[str]]] = []
        procs: list[subprocess.Popen] = []
        try:
            for rank in range(n):
                o, e = (open(Path(tmp) / f"{rank}.{s}", "w+") for s in ("out", "err"))
                files.append((o, e))
                env = {**env_base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
                procs.append(subprocess.Popen(argv, env=env, stdout=o, stderr=e, start_new_session=True))
            deadline = time.monotonic() + timeout_s
            for p in procs:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"hops {kind} N={n}: workers did not finish within {timeout_s:g} s") from None
        finally:
            for p in procs:  # the sessions this function started, by id
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        reports = []
        for rank, (p, (o, e)) in enumerate(zip(procs, files)):
            o.seek(0)
            e.seek(0)
            text, err = o.read(), e.read()
            o.close()
            e.close()
            if p.returncode != 0 or not text.strip():
                raise RuntimeError(f"hops {kind} N={n}: worker {rank} exited {p.returncode}: {err[-1500:]}")
            reports.append(json.loads(text.strip().splitlines()[-1]))
    return reports


def _reduce(kind: str, n: int, reports: list[dict[str, Any]], repeats: int = 1) -> dict[str, Any]:
    diameter, steps = reports[0]["diameter"], len(reports[0]["steps_ours"])
    per_block = len(reports[0]["ours"]["hop"]) // max(1, repeats)  # hops of one repeat, per process

    def block(side: str, key: str, b: int) -> list[float]:
        return [x for r in reports for x in r[side][key][b * per_block : (b + 1) * per_block]]

    cpu_blocks = [_ratio(block("ours", "hop_cpu", b), block("bare", "hop_cpu", b)) for b in range(repeats)]
    wall_blocks = [_ratio(block("ours", "hop", b), block("bare", "hop", b)) for b in range(repeats)]
    cpu_known = [x for x in cpu_blocks if x is not None]
    wall_known = [x for x in wall_blocks if x is not None]

    def every(side: str, key: str) -> list[float]:
        return [x for r in reports for x in r[side][key]]

    def per_step(key: str) -> list[float]:  # the slowest process of each step
        return [max(r[key][s][1] - r[key][s][0] for r in reports) for s in range(steps)]

    def wall(key: str) -> list[float]:  # first process in to last process out
        return [max(r[key][s][1] for r in reports) - min(r[key][s][0] for r in reports) for s in range(steps)]

    ours, bare = _stats(every("ours", "hop")), _stats(every("bare", "hop"))
    ours_step, bare_step = _stats(per_step("steps_ours")), _stats(per_step("steps_bare"))
    hops = reports[0]["hops_per_step"]
    return {
        "kind": kind,
        "nodes": n,
        "diameter": diameter,
        "hops_per_step": hops,
        "steps": steps,
        "ours_hop_s": ours,
        "bare_hop_s": bare,
        "ours_exchange_s": _stats(every("ours", "exchange")),
        "ours_hop_cpu_s": _stats(every("ours", "hop_cpu")),
        "bare_hop_cpu_s": _stats(every("bare", "hop_cpu")),
        "hop_ratio": ours["median"] / bare["median"],
        # CPU time this process spent in a hop: what the code costs, whatever the scheduler does;
        # the median over the repeats of each repeat's ratio (medians over its processes and hops)
        "repeats": repeats,
        "cpu_ratio_repeats": cpu_blocks,
        "wall_ratio_repeats": wall_blocks,
        "hop_cpu_ratio": statistics.median(cpu_known) if cpu_known else None,
        "hop_wall_ratio": statistics.median(wall_known) if wall_known else None,
        "ours_step_s": ours_step,
        "bare_step_s": bare_step,
        "step_vs_hops": ours_step["median"] / (hops * ours["median"]),
        "step_floor_ratio": ours_step["median"] / (hops * bare["median"]),
        "wall_step_s": _stats(wall("steps_ours")),
        "bytes_per_edge_hop": statistics.mean(r["bytes_per_edge_hop"] for r in reports),
    }


def _ratio(a: Sequence[float], b: Sequence[float]) -> float | None:
    mb = statistics.median(b)
    return statistics.median(a) / mb if mb > 0 else None


def fig_hops(
    quick: bool,
    steps: int = 0,
    timeout_s: float = 600.0,
    repeats: int = 0,
    kinds: Sequence[str] = (),
    sizes: Sequence[int] = (),
) -> dict[str, Any]:
    """The figure: one row per (graph, N). quick: ring, N = 4 and 8, 1 repeat of 3 timed steps;
    else every graph and N = 4…32, 5 repeats of 5 timed steps (`steps`, `repeats`, `kinds`,
    `sizes` override). One warm-up step is not reported."""
    from seedflood.core.topology import resolve as topo
    from seedflood.core.topology.graph import TopologyError

    kinds, sizes = tuple(kinds) or (("ring",) if quick else KINDS), tuple(sizes) or (QUICK_SIZES if quick else SIZES)
    steps = steps or (3 if quick else 5)
    repeats = repeats or (1 if quick else 5)
    rows = []
    for kind in kinds:
        for n in sizes:
            try:  # a torus needs a factorable N (4 = 2×2 folds onto a ring; still a valid graph)
                topo.build(_topology_cfg(kind, n))
            except TopologyError as e:
                rows.append({"kind": kind, "nodes": n, "skipped": str(e)})
                continue
            rows.append(_reduce(kind, n, _run_config(kind, n, steps * repeats, 1, timeout_s), repeats))
    return {"quick": quick, "bare_bytes": BARE_BYTES, "repeats": repeats, "steps": steps, "rows": rows}


def _topology_cfg(kind: str, n: int):
    from seedflood.core.config.systemsections import TopologyConfig

    return TopologyConfig(kind=kind, nodes=n)


def _fmt(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def _spread(mid: float | None, xs: Sequence[float | None]) -> str:
    known = [x for x in xs if x is not None]
    if mid is None:
        return "–"
    return f"{mid:.2f}" + (f" ({min(known):.2f}–{max(known):.2f})" if len(known) > 1 else "")


def _ms(s: dict[str, float]) -> str:
    return f"{_fmt(s['median'])} ({_fmt(s['min'])}–{_fmt(s['max'])})"


def print_hops(fig: dict[str, Any], out: IO[str] | None = None) -> None:
    """One table: hop ours vs bare, their ratio, the flood step against its floor, wall/step."""
    out = out or sys.stdout
    head = [
        "graph",
        "N",
        "D",
        "hop ours",
        "hop bare",
        "ratio",
        "exchange",
        "cpu ratio",
        "wall ratio",
        "step ours",
        "1.5×D×bare",
        "step/(D×bare)",
        "wall/step",
        "B/edge/hop",
    ]
    cells = [head]
    for r in fig["rows"]:
        if "skipped" in r:
            cells.append([r["kind"], str(r["nodes"]), "", r["skipped"]] + [""] * (len(head) - 4))
            continue
        d = r["hops_per_step"]
        cells.append(
            [
                r["kind"],
                str(r["nodes"]),
                str(r["diameter"]),
                _ms(r["ours_hop_s"]),
                _ms(r["bare_hop_s"]),
                f"{r['hop_ratio']:.2f}{'' if r['hop_ratio'] <= 1.5 else ' !'}",
                _fmt(r["ours_exchange_s"]["median"]),
                _spread(r["hop_cpu_ratio"], r.get("cpu_ratio_repeats", [])),
                _spread(r.get("hop_wall_ratio"), r.get("wall_ratio_repeats", [])),
                _ms(r["ours_step_s"]),
                _fmt(1.5 * d * r["bare_hop_s"]["median"]),
                f"{r['step_floor_ratio']:.2f}",
                _fmt(r["wall_step_s"]["median"]),
                f"{r['bytes_per_edge_hop']:.0f}",
            ]
        )
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    print("\n== hops: our flood hop vs a bare gloo exchange, same processes, alternating", file=out)
    for i, row in enumerate(cells):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))), file=out)
        if i == 0:
            print("  ".join("-" * w for w in widths), file=out)
    for note in (
        "hop = median (min–max) over every process and timed hop; ratio = ours / bare (target ≤ 1.5; ! above)",
        "exchange = GlooTransport.exchange inside our hop (the rest: encode, decode, Flood bookkeeping)",
        "cpu ratio = median process CPU time of our hop / of the bare hop (insensitive to the scheduler; goal ≤ 1.2)",
        f"cpu, wall ratio: median (min–max) over {fig.get('repeats', 1)} repeats of {fig.get('steps', '?')} steps,"
        " each repeat's ratio of medians over every process and hop (wall goal ≤ 1.1)",
        f"bare = irecv + isend of {fig['bare_bytes']} B to / from each neighbour, wait all",
        "step ours = Client.step (diameter hops, no model), slowest process; target ≤ 1.5 × D × bare hop",
        "wall/step = first process in to last out; with more processes than cores every hop waits on the scheduler",
    ):
        print(f"   {note}", file=out)
    out.flush()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return _worker_main(argv)
    p = argparse.ArgumentParser(prog="python -m seedflood.bench.hops", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="ring only, N = 4 and 8")
    p.add_argument("--steps", type=int, default=0, help="timed steps per repeat")
    p.add_argument("--repeats", type=int, default=0, help="repeats per configuration (default 5; 1 with --quick)")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=(), help="graphs (default: all)")
    p.add_argument("--sizes", nargs="+", type=int, default=(), help="N (default 4 8 16 32)")
    p.add_argument("--json", metavar="OUT", help="also write the figure as JSON")
    a = p.parse_args(argv)
    fig = fig_hops(a.quick, a.steps, repeats=a.repeats, kinds=a.kinds, sizes=a.sizes)
    print_hops(fig)
    if a.json:
        Path(a.json).write_text(json.dumps(fig, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
