"""Benchmark: what each process of a launched run costs the machine (`python -m seedflood.bench.procs`).

Owns the figure `procs`: one real launched run (--launcher torchrun: `launch/torchrun.sh`, fresh
interpreters; fork: `seedflood launch`, every rank forked from one interpreter that imported torch)
of the evaluator and --clients clients on --topology, the tiny model of launch/configs/debug.yaml
unless --config/--set say otherwise), whose every process's PSS (/proc/PID/smaps_rollup: each
page divided by the processes mapping it, so the sum over processes is what the run costs) and
thread count are sampled every --every seconds while the run lasts. It prints, per role
(launcher, evaluator, client), the mean over processes of each one's mean and peak PSS, the
largest peak, the PSS each process reported of itself at its end (summary.json `memory`: the
steady state, past the loading peaks), the peak of the sum over all processes (the number to compare with the machine's
memory), the wall time from launch to exit, the load average before and after, and whether
every client ended on the evaluator's hash. Nothing asserts a figure.

Assumes: Linux /proc; run from a checkout (launch/torchrun.sh); HF_HUB_OFFLINE=1 for a hub model.
Reading 129 processes' smaps_rollup takes CPU too (page-table walks): --every 1 keeps it small.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MIB = 2**20
REPO = Path(__file__).resolve().parents[3]
TOPOLOGIES = {
    "torus": ["topology.kind=torus"],  # (almost) square: 8×8 for 64 clients, 8×16 for 128 (diameter 12)
    "ring": ["topology.kind=ring"],
}
TINY = "model.tiny={hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1}"


def pss(pid: int) -> int | None:
    """PSS of process `pid` in bytes, None once it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def threads(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    except (OSError, StopIteration, ValueError):
        return 0


def descendants(root: int) -> list[int]:
    """`root` and every process below it (from each /proc/PID/stat's parent id)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])  # the name may hold spaces
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def role(pid: int) -> str | None:
    """evaluator (RANK 0), client (RANK > 0), launcher (a python without RANK: torchrun's agent,
    or `seedflood launch` and its fork server), None for anything else (the bash of
    launch/torchrun.sh). A rank `seedflood launch` forked is named seedflood-rR (its environ in
    /proc is the fork server's)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
        if comm.startswith("seedflood-r"):
            return "evaluator" if comm == "seedflood-r0" else "client"
    except OSError:
        return None
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return None
    if b"RANK" in env and b"python" in cmd:
        return "evaluator" if env[b"RANK"] == b"0" else "client"
    if b"multiprocessing.forkserver" in cmd and _forkserver(_parent(pid)):
        return None  # a rank just forked, not yet named: seen again at the next sample
    launchers = (b"torch.distributed.run", b"multiprocessing.forkserver", b"\0launch\0")
    return "launcher" if any(x in cmd for x in launchers) else None


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _forkserver(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"multiprocessing.forkserver" in f.read()
    except OSError:
        return False


def sample(argv: Sequence[str], every_s: float, timeout_s: float, log: Path) -> dict[str, Any]:
    """Run `argv`, sampling its processes until it exits; per pid its role and PSS samples."""
    seen: dict[int, dict[str, Any]] = {}
    sums: list[int] = []
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            if time.monotonic() - t0 > timeout_s:
                proc.kill()
                raise RuntimeError(f"still running after {timeout_s:g} s (log: {log})")
            total = 0
            for pid in descendants(proc.pid):
                if pid not in seen:
                    r = role(pid)
                    if r is None:
                        continue
                    seen[pid] = {"role": r, "pss": [], "threads": 0}
                p = pss(pid)
                if p is not None:
                    seen[pid]["pss"].append(p)
                    seen[pid]["threads"] = max(seen[pid]["threads"], threads(pid))
                    total += p
            sums.append(total)
            time.sleep(every_s)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"exit status {proc.returncode} (log: {log})")
    return {"procs": [v for v in seen.values() if v["pss"]], "sum_peak": max(sums, default=0), "wall_s": wall}


def per_role(procs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per role: processes, mean of their mean PSS, mean and max of their peak PSS (MiB), max threads."""
    out = {}
    for r in ("launcher", "evaluator", "client"):
        mine = [p for p in procs if p["role"] == r]
        if mine:
            peaks = [max(p["pss"]) / MIB for p in mine]
            out[r] = {
                "n": len(mine),
                "mean": statistics.mean(statistics.mean(p["pss"]) / MIB for p in mine),
                "peak_mean": statistics.mean(peaks),
                "peak_max": max(peaks),
                "threads": max(p["threads"] for p in mine),
            }
    return out


def end_pss(memory: dict[str, Any]) -> dict[str, float]:
    """PSS (MiB) each process reported of itself at the end of its run (summary.json `memory`):
    the evaluator's, and the mean and max over the clients'."""
    out = {}
    if memory.get("evaluator"):
        out["evaluator"] = memory["evaluator"]["pss"] / MIB
    clients = [m["pss"] / MIB for m in memory.get("clients") or [] if m]
    if clients:
        out["client_mean"], out["client_max"] = statistics.mean(clients), max(clients)
    return out


def launch(
    config: str | None, sets: Sequence[str], launcher: str = "fork", every_s: float = 1.0, timeout_s: float = 1800.0
) -> dict[str, Any]:
    """One launched run (`launcher`: fork, `seedflood launch`; torchrun, launch/torchrun.sh, which
    needs a `config`) of `config` (relative to the checkout; None: the defaults) with `sets`, in a
    temporary run directory, its processes sampled (`sample`); with its summary.json and the load
    average before and after. The one place the benchmarks launch a run (procs, scaling)."""
    with tempfile.TemporaryDirectory(prefix="bench-procs-") as tmp:
        out = Path(tmp) / "run"
        if launcher == "fork":
            head = [sys.executable, "-m", "seedflood", "launch", *(["--config", config] if config else [])]
        else:
            head = ["bash", "launch/torchrun.sh", str(config)]
        argv = [*head, *(x for s in [*sets, f"run.out_dir={out}"] for x in ("--set", s))]
        load0 = os.getloadavg()
        got = sample(argv, every_s, timeout_s, Path(tmp) / "run.log")
        summary = json.loads((out / "summary.json").read_text())
    return {**got, "summary": summary, "load_before": load0, "load_after": os.getloadavg()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    sets = [
        *TOPOLOGIES[args.topology],
        f"topology.nodes={args.clients}",
        f"run.steps={args.steps}",
        "run.threads=0",  # the machine's cores split over the local processes
        "eval.every=0",
        "checkpoint.every=0",
        "transport.timeout_s=600",  # 129 interpreters importing torch on 2 cores reach the rendezvous late
        *([TINY, f"task.train_examples={8 * args.clients}"] if args.config == "launch/configs/debug.yaml" else []),
        *args.set,
    ]
    got = launch(args.config, sets, args.launcher, args.every, args.timeout)
    summary = got["summary"]
    return {
        "config": args.config,
        "sets": sets,
        "clients": args.clients,
        "topology": args.topology,
        "launcher": args.launcher,
        "roles": per_role(got["procs"]),
        "sum_peak_mib": got["sum_peak"] / MIB,
        "wall_s": got["wall_s"],
        "load_before": got["load_before"],
        "load_after": got["load_after"],
        "end_pss_mib": end_pss(summary.get("memory") or {}),
        "consensus": summary.get("consensus"),
        "hash": summary.get("param_hash"),
    }


def report(r: dict[str, Any]) -> str:
    lines = [
        f"procs: {r['clients']} clients on {r['topology']} + evaluator, launched by {r['launcher']} ({r['config']})"
    ]
    for name, f in r["roles"].items():
        lines.append(
            f"  {name:<9} ×{f['n']:<3} PSS MiB: mean {f['mean']:.0f}, peak {f['peak_mean']:.0f} (max {f['peak_max']:.0f}),"
            f" threads ≤ {f['threads']}"
        )
    load = lambda v: " ".join(f"{x:.2f}" for x in v)  # noqa: E731
    end = r["end_pss_mib"]
    if end:
        lines.append(
            "  at the run's end, as each process reported it: "
            + ", ".join(f"{k.replace('_', ' ')} {v:.0f}" for k, v in end.items())
            + " MiB PSS"
        )
    lines.append(f"  summed peak PSS {r['sum_peak_mib']:.0f} MiB; wall {r['wall_s']:.0f} s")
    lines.append(f"  load {load(r['load_before'])} before, {load(r['load_after'])} after")
    lines.append(f"  consensus {r['consensus']} (hash {r['hash']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m seedflood.bench.procs", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--topology", choices=sorted(TOPOLOGIES), default="torus")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument(
        "--launcher",
        choices=["torchrun", "fork"],
        default="fork",
        help="fork: `seedflood launch`; torchrun: launch/torchrun.sh (fresh interpreters)",
    )
    p.add_argument("--config", default="launch/configs/debug.yaml", help="relative to the checkout")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="after the bench's own")
    p.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before the run is killed")
    p.add_argument("--json", metavar="OUT", help="write the figures here too")
    args = p.parse_args(argv)
    r = run(args)
    print(report(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
