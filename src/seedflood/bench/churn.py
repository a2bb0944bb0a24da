"""Churn benchmark (`python -m seedflood.bench.churn`): what surviving a failure in process costs, and what it saves.

Measures side by side, in one run, on the debug model (launch/configs/debug.yaml: tiny random
Llama, synthetic task) with 16 clients on a 4×4 torus, full flooding, through the real client loop
over the in-memory network (`roles.inprocess.simulate`: one thread and one model per client):

1. strict   — no failures, `churn.settle=0` (the protocol without churn);
2. churn    — no failures, `churn.settle=1` (the cost of settle: one more step of delay, notes,
              flooding to every neighbour instead of shortest-path routes);
3. churn+kill — settle 1, one client killed every `--every` steps (victims rotate with stride 5,
              so two consecutive victims are never neighbours) and restarted 2 steps later: it
              rebuilds its model from the base weights and rejoins by replaying its sponsor's log.
              Every client must end bit-identical (asserted, as are the per-step hashes);
3b. churn+cut — settle 1, one link cut for good at step 1 (the graph stays connected; on a ring
              with one hop per step its diameter grows from N/2 to N − 1, longer than the vote lag,
              so proposals differ for a while and ballots settle them);
4. group restart — the answer to a failure without churn: a strict run stopped at each step where run 3
              kills a client (every `--every` steps) and resumed from its records
              (`simulate(stop=k)`, then `simulate(resume=records)`), which rebuilds every client's
              model as a relaunch does. torchrun's process start-up is NOT included (one process's
              imports are measured and printed beside it). Its final hash must equal run 1's
              (asserted: a restart costs time, not bits);
5. rejoin   — `Churn.rejoin` of a fresh client handed a sponsor's catch-up payload of H steps ×
              16 origins (H = 100, 1000, 10000; built by a real sponsor `Churn.catch_up` from
              synthesised messages: the protocol's seeds, random scalars), for two model sizes
              (`model.tiny` overrides), with the payload's bytes, the part spent in
              `Applier.apply_all`, and the rejoined hash checked against a plain replay.

Runs 1-4 alternate within each repeat, so a burst of foreign load hits all of them; medians of
`--repeats`. Timings use `time.perf_counter` (wall) and `time.process_time` (this process's CPU,
all threads). Nothing here asserts a timing; the asserts check results (hashes).

    HF_HUB_OFFLINE=1 .venv/bin/python -m seedflood.bench.churn [--quick] [--out out/churn.json]

Assumes: run from anywhere inside the checkout (the debug config is found relative to this file);
torch on CPU with one intra-op thread (set here, and by the debug config's run.threads).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seedflood.bench.common import figure_process, write_json
from seedflood.core.churn.history import History
from seedflood.core.config import rng
from seedflood.core.config import runconfig as config
from seedflood.core.config.runconfig import Config
from seedflood.core.flood.protocol import Protocol
from seedflood.core.topology import resolve as topo
from seedflood.core.wire.message import Message
from seedflood.core.zo.replay import Applier, state_hash
from seedflood.ml.workload import Workload
from seedflood.roles.churnstart import ChurnStrategy
from seedflood.roles.client import Client
from seedflood.roles.inprocess import Event, SimResult, simulate

DEBUG = Path("launch/configs/debug.yaml")  # the debug model and task; --config, relative to the working directory
TIMEOUT_S = 30.0  # transport.timeout_s: kills are detected at once; this only bounds a hang
DOWN = 2  # steps a killed client stays down before its restart
STRIDE = 5  # victim c is node (5·c) mod N: on a 4×4 torus consecutive victims are never neighbours
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}  # the debug model
LARGE = {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 4}
MODES = ("strict", "churn", "churn+kill", "churn+cut", "group restart")
GRAPHS = {
    "torus": ("topology.kind=torus", "topology.rows=0"),  # as square as possible, full flooding
    "ring1hop": ("topology.kind=ring", "flood.hops_per_step=1"),  # one hop per step: delayed flooding
}
GRAPH = "torus"  # set by --graph
CAVEAT = (
    "caveat: measured on a VM with 2 CPU cores shared with other engineers' jobs; the client threads "
    "share one interpreter (GIL), so absolute rates are the simulator's, not a cluster's. Read ratios "
    "taken in one run, and the CPU column when the wall column is inflated by foreign load."
)


# -- small helpers ---------------------------------------------------------------------------------
def stats(xs: Sequence[float]) -> dict[str, float]:
    """median, min, max and count of a list of numbers."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def span(s: dict[str, float], fmt: str = "{:.2f}") -> str:
    """'1.23 (1.10–1.40, ×3)'."""
    return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}–{fmt.format(s['max'])}, ×{s['n']})"


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]], notes: Sequence[str] = ()) -> None:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    print(f"\n== {title}")
    for i, r in enumerate(cells):
        print("  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for n in notes:
        print(f"   {n}")
    sys.stdout.flush()


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(fn(), wall seconds, this process's CPU seconds over all threads)."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def process_start() -> dict[str, float]:
    """Wall and CPU seconds of one Python process importing what a client process imports: part
    of what each process of a relaunch pays and run 4 leaves out (no gloo rendezvous either)."""
    code = "import torch, torch.distributed, transformers, seedflood.roles.train, seedflood.comm.runtime, seedflood.comm.gloo"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    wall = time.perf_counter() - w
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu}


# -- configs and the failure schedule ---------------------------------------------------------------
def cfg_for(steps: int, clients: int, settle: int, *extra: str) -> Config:
    """The debug config on `GRAPH` with `clients` nodes (a torus as square as possible with full
    flooding, or a ring with one hop per step)."""
    return config.load(
        DEBUG,
        [
            f"run.steps={steps}",
            f"transport.timeout_s={TIMEOUT_S}",
            f"topology.nodes={clients}",
            *GRAPHS[GRAPH],
            f"churn.settle={settle}",
            *extra,
        ],
    )


def kill_schedule(steps: int, every: int, clients: int) -> list[Event]:
    """A kill at steps 1, 1 + every, ... of victims 0, 5, 10, ... (mod N), each restarted DOWN steps
    later; a pair whose restart would come within `every` steps of the end is left out, so every
    restarted client has rejoined before the run ends."""
    events: list[Event] = []
    for c, k in enumerate(range(1, steps, every)):
        if k + DOWN + every > steps:
            break
        victim = (STRIDE * c) % clients
        events += [Event(k, victim, "kill"), Event(k + DOWN, victim, "restart")]
    return events


# -- runs 1-4 --------------------------------------------------------------------------------------
def check_agreement(r: SimResult, clients: int, restarts: int) -> dict[str, Any]:
    """Every client finished and holds the same bits after every step it computed (a restarted one
    has None for the steps it caught up on by replay). Returns figures about the churn."""
    assert r.exits == {} and sorted(r.hashes) == list(range(clients)), f"clients stopped: {r.exits}"
    assert len(set(r.hashes.values())) == 1, "final hashes differ"
    ref = next(h for h in r.step_hashes.values() if None not in h)  # a client never restarted
    for n, mine in r.step_hashes.items():
        assert len(mine) == len(ref), f"node {n}: {len(mine)} step hashes, want {len(ref)}"
        assert all(h is None or h == want for h, want in zip(mine, ref)), f"node {n} diverged"
    joins = sum(len(c.join) for c in r.changes.values())
    leaves = sum(len(c.leave) for c in r.changes.values())
    assert joins == restarts and leaves == restarts, (joins, leaves, restarts)
    replayed = [h.count(None) for h in r.step_hashes.values() if None in h]
    missing = sum(clients - len({m.origin for m in msgs}) for _, msgs in r.records)
    return {
        "leaves": leaves,
        "joins": joins,
        "steps_replayed_per_rejoin": stats(replayed) if replayed else None,
        "member_steps_missing": missing,
    }


def run_mode(mode: str, steps: int, clients: int, every: int) -> tuple[SimResult, int]:
    """One run of `mode`; returns (its final result, the number of failures / relaunches)."""
    if mode == "strict":
        return simulate(cfg_for(steps, clients, 0)), 0
    if mode == "churn":
        return simulate(cfg_for(steps, clients, 1)), 0
    if mode == "churn+kill":
        events = kill_schedule(steps, every, clients)
        return simulate(cfg_for(steps, clients, 1), events=events), len(events) // 2
    if mode == "churn+cut":
        cfg = cfg_for(steps, clients, 1)
        peer = topo.build(cfg.topology).neighbors(0)[0]
        r = simulate(cfg, events=[Event(1, 0, "cut", peer)])
        assert r.exits == {} and len(set(r.hashes.values())) == 1 and len(r.hashes) == clients, r.exits
        return r, 1
    # group restart: the whole group stops where churn+kill loses a client and resumes from its log
    cfg = cfg_for(steps, clients, 0)
    stops = [e.step for e in kill_schedule(steps, every, clients) if e.action == "kill"]
    records: list = []
    delay = Protocol.of(cfg, topo.build(cfg.topology).diameter).delay
    for s in stops:  # a relaunch resumes from the complete steps: with delayed flooding s − delay
        records = simulate(cfg, stop=s, resume=records).records
        assert len(records) == max(len(records), s - delay) and len(records) <= s, (len(records), s)
    return simulate(cfg, resume=records), len(stops)


def bench_runs(args: argparse.Namespace) -> dict[str, Any]:
    steps, clients, every = args.steps, args.clients, args.every
    top = topo.build(cfg_for(steps, clients, 1).topology)
    p_strict = Protocol.of(cfg_for(steps, clients, 0), top.diameter)
    p_churn = Protocol.of(cfg_for(steps, clients, 1), top.diameter)
    print(
        f"\n{clients} clients, {GRAPH} (diameter {top.diameter}, degree {top.degree(0)}), {p_strict.hops} hops "
        f"per step; delay strict {p_strict.delay}, churn {p_churn.delay}; {steps} steps, a failure every "
        f"{every} steps; repeats {args.repeats}"
    )
    wall: dict[str, list[float]] = {m: [] for m in ("setup", *MODES)}
    cpu: dict[str, list[float]] = {m: [] for m in ("setup", *MODES)}
    failures: dict[str, int] = {}
    churn_facts: dict[str, Any] = {}
    for rep in range(args.repeats):
        # a launch that does no step: 16 model builds, threads, endpoints (the per-launch cost)
        _, w, c = timed(lambda: simulate(cfg_for(steps, clients, 0), stop=0))
        wall["setup"].append(w)
        cpu["setup"].append(c)
        results: dict[str, SimResult] = {}
        for mode in MODES:
            (r, n), w, c = timed(lambda: run_mode(mode, steps, clients, every))
            results[mode], failures[mode] = r, n
            wall[mode].append(w)
            cpu[mode].append(c)
            print(f"   repeat {rep + 1}/{args.repeats} {mode:<13} {w:6.1f} s wall {c:6.1f} s CPU  (load {load()})")
        # results, not timings: what each mode must produce
        strict, restart = results["strict"], results["group restart"]
        assert len(set(strict.hashes.values())) == 1, "strict run: clients differ"
        assert restart.hashes == strict.hashes, "group restart changed the bits of the strict run"
        assert len(set(results["churn"].hashes.values())) == 1, "churn run: clients differ"
        churn_facts = check_agreement(results["churn+kill"], clients, failures["churn+kill"])
    setup = statistics.median(wall["setup"])
    out: dict[str, Any] = {"setup": {"wall_s": stats(wall["setup"]), "cpu_s": stats(cpu["setup"])}}
    rows = []
    base = steps / statistics.median(wall["strict"]) * 60
    for mode in MODES:
        med = statistics.median(wall[mode])
        rate = steps / med * 60
        steady = steps / max(med - setup, 1e-9) * 60  # the first launch's builds taken out
        cpu_rate = steps / statistics.median(cpu[mode]) * 60
        out[mode] = {
            "failures": failures[mode],
            "wall_s": stats(wall[mode]),
            "cpu_s": stats(cpu[mode]),
            "steps_per_min": rate,
            "steps_per_min_after_first_launch": steady,
            "steps_per_min_cpu": cpu_rate,
            "vs_strict": rate / base,
        }
        rows.append(
            [
                mode,
                failures[mode],
                span(stats(wall[mode]), "{:.1f}"),
                f"{statistics.median(cpu[mode]):.1f}",
                f"{rate:.0f}",
                f"{steady:.0f}",
                f"{cpu_rate:.0f}",
                f"{rate / base:.2f}",
            ]
        )
    out["churn+kill"].update(churn_facts)
    start = process_start()
    out["process_start"] = start
    relaunch = (clients + 1) * start["cpu_s"] / (os.cpu_count() or 1)  # N clients + the evaluator
    replayed = churn_facts["steps_replayed_per_rejoin"]
    table(
        f"steps per minute, {clients} clients, {steps} steps (median of {args.repeats})",
        ["mode", "failures", "wall s (min–max)", "CPU s", "steps/min", "after 1st launch", "per CPU-min", "× strict"],
        rows,
        [
            f"one launch without steps (16 model builds, threads): {span(stats(wall['setup']), '{:.2f}')} s wall; "
            "'after 1st launch' takes one of those out of every mode",
            f"churn+kill: {churn_facts['leaves']} kills, {churn_facts['joins']} rejoins by replay "
            f"(each replayed {span(replayed, '{:.0f}') if replayed else '-'} steps); all {clients} clients "
            f"bit-identical after every step; {churn_facts['member_steps_missing']} client-steps of messages "
            "missing from the log (steps decided without a dead client)",
            f"group restart: {failures['group restart']} relaunches at the steps churn+kill kills; final hash "
            "equal to strict's. torchrun's process start-up is NOT included: importing a client's modules "
            f"alone took {start['wall_s']:.1f} s wall / {start['cpu_s']:.1f} s CPU here, i.e. >= "
            f"{relaunch:.0f} s per relaunch of {clients + 1} processes on {os.cpu_count()} cores (not measured "
            "in the table: gloo rendezvous and the evaluator's own catch-up come on top)",
        ],
    )
    return out


# -- 5. rejoin time against messages replayed -------------------------------------------------------
class _NoTransport:
    """What `Churn.rejoin` needs of a transport: `connect` (nothing is exchanged here)."""

    peers: tuple[int, ...] = ()

    def connect(self, peers: list[int], timeout_s: float | None = None) -> list[int]:
        self.peers = (*self.peers, *peers)
        return list(peers)


def synth_history(p: Protocol, steps: int, seed: int) -> list[tuple[int, list[Message]]]:
    """`steps` complete steps of every origin: the protocol's seeds, random N(0, 0.01) scalars."""
    xs = np.random.default_rng(seed).standard_normal((steps, p.n_origins, p.perturbations)) * 0.01
    return [
        (
            s,
            [
                Message.make(o, s, p.seed(o, s, k), float(xs[s, o, k]), k)
                for o in range(p.n_origins)
                for k in range(p.perturbations)
            ],
        )
        for s in range(steps)
    ]


def client_of(p: Protocol, w: Workload, node: int) -> Client:
    """A churn client with no network: it rejoins from a payload or sponsors from its history."""
    transport = _NoTransport()
    strategy = ChurnStrategy(transport)  # type: ignore[arg-type]
    return Client(node, (), p, w.direction, lambda _s: 0.0, transport, strategy=strategy)  # type: ignore[arg-type]


def bench_rejoin(args: argparse.Namespace) -> list[dict[str, Any]]:
    sizes = {"small": SMALL, "large": LARGE}
    histories = [int(h) for h in args.histories.split(",")]
    out = []
    rows = []
    for name, tiny in sizes.items():
        spec = "{" + ", ".join(f"{k}: {v}" for k, v in tiny.items()) + "}"
        cfg = cfg_for(max(histories) + 8, args.clients, 1, f"model.tiny={spec}")
        p = Protocol.of(cfg, topo.build(cfg.topology).diameter)
        params = sum(t.numel() for t in Workload.build(cfg).model.parameters())
        for h in histories:
            history = synth_history(p, h, seed=h)
            sponsor = client_of(p, Workload.build(cfg), 1)  # only its history is read
            sponsor.churn.member.history = History(p.seed, history)
            t = h + p.delay  # the sponsor's boundary: steps < t − delay are decided
            blob = sponsor.churn.catch_up(t, t + p.delay + 1, 1)
            walls, cpus, applies, hashes = [], [], [], set()
            for _ in range(args.rejoin_repeats):
                w = Workload.build(cfg)  # a restarted process: base weights only (not timed)
                joiner = client_of(p, w, 5)
                rng.derive.cache_clear()  # a restarted process starts with no seed derived
                _, wall_s, cpu_s = timed(lambda: joiner.churn.rejoin(blob))
                assert joiner.logged == h and joiner.next_step == t
                hashes.add(state_hash(w.model, w.direction))
                ref = Workload.build(cfg)  # the apply part alone: a plain replay of the same steps
                _, apply_s, _ = timed(lambda: Applier(ref.direction, p).apply_all(history))
                hashes.add(state_hash(ref.model, ref.direction))
                walls.append(wall_s)
                cpus.append(cpu_s)
                applies.append(apply_s)
            assert len(hashes) == 1, "rejoin and replay disagree"
            msgs = h * p.per_step
            merges = h // cfg.subspace.refresh  # each completed epoch: one basis + one merge
            med = statistics.median(walls)
            out.append(
                {
                    "model": name,
                    "tiny": tiny,
                    "params": params,
                    "steps": h,
                    "messages": msgs,
                    "payload_bytes": len(blob),
                    "rejoin_s": stats(walls),
                    "rejoin_cpu_s": stats(cpus),
                    "apply_all_s": stats(applies),
                    "us_per_message": med / msgs * 1e6,
                    "merges": merges,
                }
            )
            rows.append(
                [
                    f"{name} ({params / 1e6:.2f} M)",
                    f"{h:,}",
                    f"{msgs:,}",
                    f"{len(blob):,}",
                    f"{len(blob) / msgs:.1f}",
                    span(stats(walls), "{:.3f}"),
                    f"{statistics.median(cpus):.3f}",
                    f"{statistics.median(applies):.3f}",
                    f"{med / msgs * 1e6:.1f}",
                    merges,
                ]
            )
            print(f"   rejoin {name} {h} steps: {med:.3f} s (load {load()})")
    table(
        f"Churn.rejoin against messages replayed ({args.clients} origins, K = 1, subcge, rank "
        f"{cfg.subspace.rank}, refresh {cfg.subspace.refresh})",
        [
            "model (params)",
            "steps",
            "messages",
            "payload B",
            "B/msg",
            "rejoin s (min–max)",
            "CPU s",
            "apply_all s",
            "µs/msg",
            "merges",
        ],
        rows,
        [
            "rejoin = check the payload's CRC + decode each step's frame (seeds derived) + check_step + apply_all, "
            "from an empty seed cache (a restarted process's); "
            "apply_all alone is timed on a fresh model; both give the same state hash (asserted)",
            "the model enters only through one basis + one merge per completed epoch of "
            "`subspace.refresh` steps ('merges'); everything else is per message",
        ],
    )
    return out


# -- main ------------------------------------------------------------------------------------------
DEFAULTS = {"steps": 60, "every": 10, "repeats": 3, "rejoin_repeats": 3, "histories": "100,1000,10000"}
QUICK = {"steps": 20, "every": 6, "repeats": 1, "rejoin_repeats": 2, "histories": "10,100,1000"}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--steps", type=int, help="steps of runs 1-4 (default 60; --quick 20)")
    ap.add_argument("--clients", type=int, default=16, help="clients on the graph (default 16: a 4×4 torus)")
    ap.add_argument("--graph", choices=sorted(GRAPHS), default="torus", help="torus (full flooding) or ring1hop")
    ap.add_argument("--every", type=int, help="a failure every this many steps (default 10; --quick 6)")
    ap.add_argument("--repeats", type=int, help="repeats of runs 1-4 (default 3; --quick 1)")
    ap.add_argument("--rejoin-repeats", type=int, help="repeats of each rejoin (default 3; --quick 2)")
    ap.add_argument("--histories", help="steps in the catch-up payloads (default 100,1000,10000; --quick 10,100,1000)")
    ap.add_argument("--only", choices=("runs", "rejoin"), help="only runs 1-4, or only the rejoin figure")
    ap.add_argument("--quick", action="store_true", help="small sizes, one repeat: under 2 minutes")
    ap.add_argument("--out", help="write every figure as JSON here")
    ap.add_argument(
        "--config", type=Path, default=DEBUG, help=f"the debug config (default {DEBUG}, from the repository root)"
    )
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():  # only what was not given
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.every < 6 or args.steps < 2 * args.every or args.clients < 5 or min(args.repeats, args.rejoin_repeats) < 1:
        ap.error(
            "need --every >= 6 (a rejoin must finish before the next kill), --steps >= 2 × --every, "
            "--clients >= 5 and repeats >= 1"
        )
    global DEBUG, GRAPH
    with figure_process(ap, args.config):  # hides the membership warnings: one per client per change
        DEBUG, GRAPH = args.config, args.graph  # only once the config is known to be there
        return _measure(args)


def _measure(args: argparse.Namespace) -> int:
    """The runs and rejoin figures of `main`, printed (and written to --out)."""
    meta = {
        "args": vars(args),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "load_before": os.getloadavg(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    print(f"seedflood.bench.churn: torch {torch.__version__}, 1 thread, {os.cpu_count()} CPUs, load {load()}")
    print(CAVEAT)
    t0 = time.perf_counter()
    figures: dict[str, Any] = {}
    with torch.no_grad():
        if args.only in (None, "runs"):
            figures["runs"] = bench_runs(args)
        if args.only in (None, "rejoin"):
            figures["rejoin"] = bench_rejoin(args)
    meta["load_after"] = os.getloadavg()
    meta["wall_s"] = time.perf_counter() - t0
    print(f"\n({meta['wall_s']:.0f} s in all; load {load()})")
    print(CAVEAT)
    if args.out:
        write_json(args.out, {"meta": meta, "figures": figures})
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
