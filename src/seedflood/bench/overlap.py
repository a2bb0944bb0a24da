"""Figure: communication hidden behind compute (`flood.overlap`), with real processes over gloo.

Owns one benchmark: 4 client processes on a ring (`hops_per_step: 1`, so delay 1 without
overlap, 2 with it) run the same steps with overlap off, then on, over gloo, and report the
median step time, the median exchange (hop) time and the ZO step efficiency 2·T_fwd / T_step
(K = 1: a step's floor is its two forwards), plus whether every client's final bits equal the
in-memory reference (a plain client with the same delay). Loopback hops take microseconds, so
they are slowed one of two ways, and the output says which:
- `rate="64kbit"` (default where root and iproute2 allow network namespaces): every process in
  its own namespace behind a tc tbf bandwidth cap per link and direction (launch/netns.sh, as
  tests/e2e/test_netns.py), no sleep. Frames are tens of bytes, so only a very low rate and a
  small bucket slow them at all; the hop time is then set by the cap and TCP, not chosen;
- otherwise a fixed sleep before every real gloo exchange on 127.0.0.1 (`Delayed`): `latency_s`,
  or `ratio` × the measured time of two forwards (ratio 1: the ideal gain of overlap is 2×).

Owns the launcher: `fig_overlap(quick) -> dict` brings up the namespaces (or not), starts the
processes (bench/overlap_worker.py: what each measures) and compares their bits with the
in-memory reference; `print_overlap(result)` prints a table; `python -m seedflood.bench.overlap
[--quick]` does both.

Assumes: a POSIX machine with free local ports; the figures are wall-clock times on whatever
else the machine runs, so they vary between runs (benchmarks print figures, tests never assert
them). The clients only (no evaluator): ranks 0..3 are nodes 0..3.
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
from typing import Any, TextIO

from seedflood.bench import common
from seedflood.bench.overlap_worker import NODES, overrides, steps_of

AUTO_RATE = "64kbit"  # frames of tens of bytes: ~30 ms per hop on this ring (burst 2kb)
REPO = Path(__file__).resolve().parents[3]
NETNS_SH = REPO / "launch" / "netns.sh"
NETNS_SUBNET = "10.77.0"  # netns.sh's default: host i is .(10 + i)


def _launch(opts: dict[str, Any], timeout_s: float, netns: str | None = None) -> list[dict[str, Any]]:
    """Start NODES workers with the torchrun variables set (rank r in namespace NETNS-h{r} when
    `netns` is a prefix of namespaces that netns.sh brought up); their JSON reports in rank order."""
    from seedflood.comm.runtime import free_port

    src = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "MASTER_ADDR": f"{NETNS_SUBNET}.10" if netns else "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(NODES),
        "LOCAL_WORLD_SIZE": str(NODES),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, "-m", "seedflood.bench.overlap_worker", json.dumps(opts)]

    def wrap(rank: int) -> list[str]:
        if netns is None:
            return argv
        return ["ip", "netns", "exec", f"{netns}-h{rank}", "env", "GLOO_SOCKET_IFNAME=eth0", *argv]

    with tempfile.TemporaryDirectory(prefix="seedflood-overlap-") as tmp:
        procs = []
        for rank in range(NODES):
            out = open(Path(tmp) / f"{rank}.out", "w+")  # files, not pipes: nothing can fill up
            p = subprocess.Popen(
                wrap(rank),
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            procs.append((p, out))
        deadline = time.monotonic() + timeout_s
        try:
            for p, _ in procs:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        finally:
            for p, _ in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)  # the session started for this worker
                    p.wait()
        reports = []
        for rank, (p, out) in enumerate(procs):
            out.seek(0)
            text = out.read()
            out.close()
            if p.returncode != 0:
                raise RuntimeError(f"overlap benchmark: rank {rank} exited {p.returncode}:\n{text[-3000:]}")
            reports.append(json.loads(text.strip().splitlines()[-1]))
    return reports


def netns_unavailable() -> str | None:
    """Why the tbf-in-namespaces variant cannot run here (None: it can)."""
    if not NETNS_SH.exists():
        return f"{NETNS_SH} is missing (not a checkout)"
    return common.netns_unavailable(("ip", "tc"), "iproute2")


def _netns(rate: str, burst: str, prefix: str, cmd: str) -> None:
    """netns.sh up NODES / down with a tbf cap (raises with its output on failure)."""
    if cmd == "up" and (why := netns_unavailable()):
        raise RuntimeError(f"overlap benchmark: rate={rate}: {why}")
    env = {**os.environ, "NETNS_PREFIX": prefix, "NETNS_SUBNET": NETNS_SUBNET, "RATE": rate, "BURST": burst}
    args = [str(NETNS_SH), cmd] + ([str(NODES)] if cmd == "up" else [])
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"overlap benchmark: netns.sh {cmd} failed: {r.stderr.strip()[-2000:]}")


def _reference_hashes(quick: bool) -> dict[str, str]:
    """Final hashes of the in-memory reference (simulation.simulate, threads of this process):
    off = the plain client; on = a plain client whose protocol has the overlapped delay D + 1."""
    import dataclasses

    from seedflood.core.config import runconfig as config
    from seedflood.core.flood.protocol import Protocol
    from seedflood.core.topology import resolve as topo
    from seedflood.roles.inprocess import simulate

    out = {}
    for mode in ("off", "on"):
        cfg = config.load(None, [*overrides(quick), f"flood.overlap={'true' if mode == 'on' else 'false'}"])
        plain = dataclasses.replace(Protocol.of(cfg, topo.build(cfg.topology).diameter), overlap=False)
        out[mode] = next(iter(simulate(cfg, hash_every_step=False, protocol=plain).hashes.values()))
    return out


def fig_overlap(
    quick: bool,
    *,
    ratio: float = 1.0,
    latency_s: float | None = None,
    rate: str | None = "auto",
    burst: str = "2kb",
) -> dict[str, Any]:
    """Step time and 2·T_fwd/T_step, overlap off vs on, one launch of 4 gloo processes.

    Hops slowed by a tc tbf cap (`rate`, `burst`) in network namespaces, or by a sleep per
    exchange (`latency_s`, or `ratio` × two forwards as measured by rank 0). rate "auto": the
    cap at AUTO_RATE where namespaces are available and no latency_s was given, else the sleep."""
    if rate == "auto":
        rate = AUTO_RATE if latency_s is None and netns_unavailable() is None else None
    opts = {"quick": quick, "ratio": ratio, "latency_s": 0.0 if rate else latency_s}
    t0 = time.monotonic()
    if rate:
        prefix = f"sfov{os.getpid() % 100000}"
        _netns(rate, burst, prefix, "up")
        try:
            reports = _launch(opts, timeout_s=300, netns=prefix)
        finally:
            _netns(rate, burst, prefix, "down")
    else:
        reports = _launch(opts, timeout_s=300)
    modes: dict[str, Any] = {}
    for mode in ("off", "on"):
        rows = [r["modes"][mode] for r in reports]
        step = statistics.median(r["step_s"] for r in rows)
        fwd = statistics.median(r["fwd_s"] for r in rows)
        hop = statistics.median(r["hop_s"] for r in rows)
        modes[mode] = {
            "delay": rows[0]["delay"],
            "step_s": step,
            "fwd_s": fwd,
            "hop_s": hop,
            "cores": sum(r["cores"] for r in rows),  # CPU the 4 clients used, in cores
            "efficiency": 2 * fwd / step,
            "consensus": len({r["hash"] for r in rows}) == 1,
        }
    for mode, ref in _reference_hashes(quick).items():
        modes[mode]["reference"] = all(r["modes"][mode]["hash"] == ref for r in reports)
    latency = reports[0]["latency_s"]
    slowed = (
        f"gloo between network namespaces, tc tbf {rate} (burst {burst}) per link and direction, no sleep"
        if rate
        else f"gloo on 127.0.0.1 + a fixed {latency * 1e3:.1f} ms sleep per exchange (simulated link latency)"
    )
    return {
        "clients": NODES,
        "topology": "ring",
        "hops_per_step": 1,
        "steps": steps_of(quick),
        "transport": slowed,
        "rate": rate,
        "cpus": os.cpu_count(),
        "latency_s": latency,
        "modes": modes,
        "speedup": modes["off"]["step_s"] / modes["on"]["step_s"],
        "wall_s": time.monotonic() - t0,
    }


def print_overlap(result: dict[str, Any], out: TextIO = sys.stdout) -> None:
    print(
        f"\n== overlap: {result['clients']} clients, {result['topology']}, "
        f"{result['hops_per_step']} hop/step, {result['steps']} steps (median per client, then over clients)",
        file=out,
    )
    print(f"   transport: {result['transport']}", file=out)
    print("   overlap  delay  T_fwd      T_hop      T_step     2·T_fwd/T_step  consensus  = reference", file=out)
    for mode, m in result["modes"].items():
        print(
            f"   {mode:<7}  {m['delay']:>5}  {m['fwd_s'] * 1e3:6.1f} ms  {m['hop_s'] * 1e3:6.1f} ms  "
            f"{m['step_s'] * 1e3:6.1f} ms  "
            f"{m['efficiency']:>14.2f}  {'yes' if m['consensus'] else 'NO':>9}  "
            f"{'yes' if m['reference'] else 'NO':>11}",
            file=out,
        )
    print(
        "   reference: the in-memory simulation of a plain client with the same delay (bits equal)",
        file=out,
    )
    print(
        "   T_hop: one exchange as a client waits for it (including for peers still computing)",
        file=out,
    )
    busy = result["modes"]["on"]["cores"]
    print(
        f"   cores busy with the clients (overlap on): {busy:.1f} of {result['cpus']} on this machine"
        + (" - CPU-bound: the gain is capped by the CPU, not the schedule" if busy > 0.8 * result["cpus"] else ""),
        file=out,
    )
    print(
        f"   step time off/on: {result['speedup']:.2f}x (ideal when T_hop = two forwards: 2x); "
        f"wall {result['wall_s']:.0f} s; shared machine: figures vary between runs",
        file=out,
    )
    out.flush()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m seedflood.bench.overlap", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer steps (seconds)")
    p.add_argument("--ratio", type=float, default=1.0, help="latency per exchange / two forwards (default 1)")
    p.add_argument("--latency-ms", type=float, default=None, help="fixed latency per exchange instead of --ratio")
    p.add_argument(
        "--rate",
        default="auto",
        help="tc tbf cap per link in network namespaces (root), e.g. 64kbit; 'none' = a sleep per exchange; "
        "default auto: the cap where namespaces work, else the sleep",
    )
    p.add_argument("--burst", default="2kb", help="tbf burst with --rate (default 2kb)")
    p.add_argument("--json", help="also write the result here")
    args = p.parse_args(argv)
    latency = args.latency_ms / 1e3 if args.latency_ms is not None else None
    rate = None if args.rate == "none" else args.rate
    result = fig_overlap(args.quick, ratio=args.ratio, latency_s=latency, rate=rate, burst=args.burst)
    print_overlap(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
