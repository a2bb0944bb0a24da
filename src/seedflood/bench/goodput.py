"""Goodput under failure (`seedflood bench --only goodput`): steps/s under a failure schedule over
steps/s of the same run with none, measured side by side.

Fixed set-up (issue 41): the debug config (launch/configs/debug.yaml: tiny random Llama, synthetic
task) as a churn run (`churn.settle=1`, `transport.timeout_s=1`, one torch thread) on a ring of 8
and on a 4×4 torus, in process (`roles.inprocess.simulate`: one thread per client, the real client
loop, agreement and in-memory transport), every client sleeping FORWARD_S before each forward (its
emulated device, as `bench.membership --forward-s` does), with `supervise` on (a client the churn
rules stop is restarted, as its launcher would). Schedules (builders below, pure functions):

  none   no event: the denominator of every ratio
  cut    a link cut and healed HEAL_AFTER steps later, every EVERY steps
  join   a brand-new id joins every EVERY steps; its denominator is a run of the same member
         count over time: the no-event runs of N, N + 1, ... members (founders plus new ids linked
         as the join rule links them) weighted by the steps the join run spent at each count
  kill   a client killed every EVERY steps and restarted by its supervisor (the `restart` event at
         the kill's step: it comes back once the others have applied that step)
  mixed  per PERIOD steps: a client stalled STALL_S (at +10), one killed and restarted (at +40),
         a link cut and healed HEAL_AFTER steps later (at +70)

An event is scheduled only while MARGIN_WINDOWS delay windows of steps are left after it, so a
rejoin or an admission completes inside the run. Every repeat runs every schedule of a graph in
turn (a burst of foreign load hits all of them), after a run that does no step (`stop=0`: the
model builds and threads), whose wall time is taken out of each run of that repeat. Goodput of a
repeat = (none's wall − set-up) / (the schedule's wall − set-up); the figure is the median of the
repeats with their min–max. Each run must end with every client on one hash (checked); a run that
does not is reported as failed and left out. Nothing here asserts a timing.

Assumes: run from the repository root (the debug config's path is relative to it); torch on CPU
with one intra-op thread (`seedflood bench` sets it).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from seedflood.bench.common import table
from seedflood.bench.membership import timed_run
from seedflood.core.config import runconfig as config
from seedflood.core.config.runconfig import Config
from seedflood.core.flood.protocol import Protocol
from seedflood.core.membership.growth import Growth
from seedflood.core.topology import resolve as topo
from seedflood.core.topology.graph import Topology
from seedflood.roles.inprocess import Event, simulate

DEBUG = Path("launch/configs/debug.yaml")
FORWARD_S = 0.1  # each client's emulated forward (s)
TIMEOUT_S = 1.0  # transport.timeout_s
EVERY = 50  # steps between events of the cut, join and kill schedules
PERIOD = 100  # the mixed schedule's period (steps)
HEAL_AFTER = 5  # steps a cut link stays cut
STALL_S = 0.3  # seconds a stalled client sleeps (SIGSTOP)
STRIDE = 5  # event i hits node (5·i) mod N: consecutive victims are never neighbours here
MARGIN_WINDOWS = 4  # delay windows of (delay + 1) steps left after the last event
GRAPHS: dict[str, tuple[str, ...]] = {
    "ring8": ("topology.kind=ring", "topology.nodes=8"),
    "torus4x4": ("topology.kind=torus", "topology.nodes=16", "topology.rows=4"),
}
SCHEDULES = ("none", "cut", "join", "kill", "mixed")
FAILURES = ("cut", "join", "kill", "stall")  # the actions counted as one failure each
GOALS = {"cut": 0.95, "join": 0.95, "kill": 0.90, "mixed": 0.90}
STEPS = 150  # steps per run, as issue 41's measurements
QUICK = {"steps": 30, "every": 8, "period": 20}  # --quick: a smoke run (every event kind), not a figure


# -- schedules (pure) -------------------------------------------------------------------------------
def marks(steps: int, every: int, last: int, offset: int = 0) -> list[int]:
    """Steps offset + every, offset + 2·every, ... up to `last` (inclusive)."""
    return list(range(offset + every, last + 1, every))


def cut_schedule(top: Topology, steps: int, every: int, last: int, heal_after: int = HEAL_AFTER) -> list[Event]:
    """Every `every` steps, the link of node a = STRIDE·i mod N to its first neighbour is cut, and
    healed `heal_after` steps later."""
    out: list[Event] = []
    for i, s in enumerate(marks(steps, every, last)):
        a = (STRIDE * i) % top.n
        b = top.neighbors(a)[0]
        out += [Event(s, a, "cut", b), Event(s + heal_after, a, "heal", b)]
    return out


def join_schedule(n: int, steps: int, every: int, last: int) -> list[Event]:
    """Every `every` steps a brand-new id (n, n + 1, ...) joins."""
    return [Event(s, n + i, "join") for i, s in enumerate(marks(steps, every, last))]


def kill_schedule(n: int, steps: int, every: int, last: int) -> list[Event]:
    """Every `every` steps node STRIDE·i mod n is killed and restarted by its supervisor (the
    restart event at the kill's step: it runs once the others have applied that step)."""
    out: list[Event] = []
    for i, s in enumerate(marks(steps, every, last)):
        victim = (STRIDE * i) % n
        out += [Event(s, victim, "kill"), Event(s, victim, "restart")]
    return out


def mixed_schedule(top: Topology, steps: int, last: int, period: int = PERIOD) -> list[Event]:
    """Per `period` steps from p = period·w: node (STRIDE·w + N/2) mod N stalls STALL_S at
    p + period/10, node (STRIDE·w + 1) mod N is killed and restarted at p + 4·period/10, the link
    of node STRIDE·w mod N to its first neighbour is cut at p + 7·period/10 and healed HEAL_AFTER
    steps later; an event past `last` is left out (a heal with its cut)."""
    out: list[Event] = []
    n = top.n
    for w, p in enumerate(range(0, steps, period)):
        stalled, victim, a = (STRIDE * w + n // 2) % n, (STRIDE * w + 1) % n, (STRIDE * w) % n
        b = top.neighbors(a)[0]
        s1, s4, s7 = (p + k * period // 10 for k in (1, 4, 7))
        for e in (
            [Event(s1, stalled, "stall", STALL_S)],
            [Event(s4, victim, "kill"), Event(s4, victim, "restart")],
            [Event(s7, a, "cut", b), Event(s7 + HEAL_AFTER, a, "heal", b)],
        ):
            if e[0].step <= last:
                out += e
    return sorted(out, key=lambda e: e.step)


def last_event_step(steps: int, delay: int) -> int:
    """The last step an event may come at: MARGIN_WINDOWS windows of delay + 1 steps before the end."""
    return steps - MARGIN_WINDOWS * (delay + 1)


def grown(top: Topology, links_delay: int, members: int) -> Topology:
    """The founders' graph with new ids top.n .. members - 1 linked one after the other as the join
    rule links them (`Growth.attach`: founders with the fewest links first)."""
    growth = Growth.of({i: top.neighbors(i) for i in top.nodes}, links_delay)
    adj = {i: set(top.neighbors(i)) for i in top.nodes}
    for j in range(top.n, members):
        frozen = {k: frozenset(v) for k, v in adj.items()}
        adj[j] = set(growth.attach(frozen, list(adj), j))
        for q in adj[j]:
            adj[q].add(j)
    edges = tuple(sorted({(min(a, b), max(a, b)) for a, ps in adj.items() for b in ps}))
    return Topology(f"{top.name}+{members - top.n}", members, edges)


# -- arithmetic (pure) ------------------------------------------------------------------------------
def member_steps(founders: int, joins: Mapping[int, int], steps: int) -> dict[int, int]:
    """Steps spent at each member count: `joins` is committed step -> ids it admits (a join counts
    from the step that admits it)."""
    out: dict[int, int] = {}
    members = founders
    for s in range(steps):
        members += joins.get(s, 0)
        out[members] = out.get(members, 0) + 1
    return out


def equivalent_wall(spent: Mapping[int, int], walls: Mapping[int, float]) -> float:
    """The wall time of a no-event run with the same member count over time: each count's
    no-event wall weighted by the share of steps spent at it."""
    total = sum(spent.values())
    return sum(k / total * walls[m] for m, k in spent.items())


def ratio(base_wall: float, wall: float, setup: float) -> float:
    """Goodput: steps/s of the run over steps/s of its base, the set-up taken out of both."""
    return (base_wall - setup) / (wall - setup)


def spread(xs: Sequence[float]) -> dict[str, float]:
    """Median, min, max and count."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


# -- the runs -------------------------------------------------------------------------------------
@dataclass
class Graph:
    """One graph's runs: its configs (one per member count for the join's base) and schedules."""

    name: str
    cfg: Config
    top: Topology
    delay: int
    schedules: dict[str, list[Event]]
    bases: dict[int, tuple[Config, Topology]]  # member count -> a no-event run of that many

    @classmethod
    def of(cls, name: str, steps: int, every: int = EVERY, period: int = PERIOD, config_path: Path = DEBUG) -> Graph:
        base = [*GRAPHS[name], "churn.settle=1", f"transport.timeout_s={TIMEOUT_S}", "run.threads=1"]
        probe = config.load(config_path, [*base, f"run.steps={steps}"])
        top = topo.build(probe.topology)
        delay = Protocol.of(probe, top.diameter).delay
        last = last_event_step(steps, delay)
        joins = join_schedule(top.n, steps, every, last)
        # every run of the graph takes the same max_nodes: the join run's
        cfg = config.load(config_path, [*base, f"run.steps={steps}", f"churn.max_nodes={top.n + len(joins)}"])
        schedules = {
            "none": [],
            "cut": cut_schedule(top, steps, every, last),
            "join": joins,
            "kill": kill_schedule(top.n, steps, every, last),
            "mixed": mixed_schedule(top, steps, last, period),
        }
        bases = {}
        for m in range(top.n + 1, top.n + len(joins) + 1):
            wide = config.load(
                config_path,
                ["topology.kind=ring", f"topology.nodes={m}", *base[2:], f"run.steps={steps}"]
                + [f"churn.max_nodes={top.n + len(joins)}"],
            )
            bases[m] = (wide, grown(top, delay, m))
        return cls(name, cfg, top, delay, schedules, bases)


def one_run(cfg: Config, events: Sequence[Event], top: Topology | None = None) -> dict[str, Any]:
    """One timed run: wall seconds, the joins its lowest finished node committed (step -> count),
    and how often the churn rules stopped a client that its launcher then restarted; or `failed`.
    `top`: a no-event run on this graph instead of the config's."""
    stops = 0
    try:
        if top is None:
            r, wall, lines = timed_run(cfg, events, FORWARD_S, supervise=True)
            stops = sum("its launcher restarts it" in x or "restarting it again" in x for _, x in lines.lines)
        else:
            t0 = time.perf_counter()
            r = simulate(cfg, top=top, hash_every_step=False, pace=dict.fromkeys(range(top.n), FORWARD_S))
            wall = time.perf_counter() - t0
            if r.exits or len(set(r.hashes.values())) != 1:
                raise RuntimeError(f"the run did not end on one hash: exits {r.exits}")
    except Exception as e:  # a liveness or agreement failure: reported, left out of the medians
        return {"failed": f"{type(e).__name__}: {e}"}
    joins = {s: len(c.join) for s, c in r.changes.items() if c.join}
    return {"wall_s": wall, "joins": joins, "rule_stops": stops}


def measure(graph: Graph, steps: int, repeats: int, out: TextIO) -> dict[str, Any]:
    """Every schedule of `graph` (and the join's bases) in turn, `repeats` times; goodput per
    schedule (median, min–max over the repeats) and the raw runs."""
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in ("setup", *SCHEDULES, *map(str, graph.bases))}
    for rep in range(repeats):
        t0 = time.perf_counter()
        simulate(graph.cfg, hash_every_step=False, stop=0)
        runs["setup"].append({"wall_s": time.perf_counter() - t0})
        for name in SCHEDULES:
            runs[name].append(one_run(graph.cfg, graph.schedules[name]))
        for m, (cfg, top) in graph.bases.items():
            runs[str(m)].append(one_run(cfg, [], top))
        walls = {k: _cell(v[-1]) for k, v in runs.items()}
        print(
            f"   goodput {graph.name} repeat {rep + 1}/{repeats}: " + ", ".join(f"{k} {w}" for k, w in walls.items()),
            file=out,
            flush=True,
        )
    return {"runs": runs, "goodput": goodput(graph, runs, steps), "delay": graph.delay, "steps": steps}


def _cell(run: Mapping[str, Any]) -> str:
    """A run's wall seconds, its clients stopped by the churn rules and restarted, or FAILED."""
    if "wall_s" not in run:
        return "FAILED"
    stops = run.get("rule_stops", 0)
    return f"{run['wall_s']:.1f}" + (f" ({stops} restarted by the rules)" if stops else "")


def goodput(graph: Graph, runs: Mapping[str, Sequence[Mapping[str, Any]]], steps: int) -> dict[str, dict[str, Any]]:
    """Per schedule: the goodput of every repeat whose runs all finished, and their spread; and
    what one failure cost, in seconds and in steps of its base (its extra stepping time over the
    failures: a cut and its heal, a join, a kill and its restart, a stall are one each)."""
    out: dict[str, dict[str, Any]] = {}
    for name in SCHEDULES[1:]:
        failures = sum(e.action in FAILURES for e in graph.schedules[name])
        ratios, costs, costs_in_steps = [], [], []
        for rep, run in enumerate(runs[name]):
            setup, none = runs["setup"][rep]["wall_s"], runs["none"][rep]
            if "wall_s" not in run or "wall_s" not in none:
                continue
            base = none["wall_s"]
            if name == "join":
                bases = [runs[str(m)][rep] for m in graph.bases]
                if any("wall_s" not in b for b in bases):
                    continue
                walls = {graph.top.n: base, **{m: b["wall_s"] for m, b in zip(graph.bases, bases, strict=True)}}
                base = equivalent_wall(member_steps(graph.top.n, run["joins"], steps), walls)
            ratios.append(ratio(base, run["wall_s"], setup))
            costs.append((run["wall_s"] - base) / max(failures, 1))
            costs_in_steps.append(costs[-1] / ((base - setup) / steps))
        out[name] = {
            "failures": failures,
            "ratios": ratios,
            "goodput": spread(ratios) if ratios else None,
            "cost_s": spread(costs) if costs else None,
            "cost_steps": spread(costs_in_steps) if costs else None,
            "failed": sum("failed" in r for r in runs[name]),
            "goal": GOALS[name],
        }
    return out


# -- the figure -----------------------------------------------------------------------------------
def fig_goodput(
    steps: int,
    repeats: int,
    graphs: Sequence[str] = tuple(GRAPHS),
    out: TextIO | None = None,
    every: int = EVERY,
    period: int = PERIOD,
) -> dict[str, Any]:
    """Every graph's goodput table (printed to `out`) and runs, JSON-friendly. `every` and
    `period` other than EVERY and PERIOD only for --quick (a smoke run, not the figure)."""
    out = out or sys.stdout
    fig: dict[str, Any] = {"steps": steps, "repeats": repeats, "forward_s": FORWARD_S, "timeout_s": TIMEOUT_S}
    fig |= {"every": every, "period": period}
    for name in graphs:
        graph = Graph.of(name, steps, every, period)
        fig[name] = measure(graph, steps, repeats, out)
    print_goodput(fig, graphs, out)
    return fig


def print_goodput(fig: Mapping[str, Any], graphs: Sequence[str], out: TextIO) -> None:
    rows = []
    for name in graphs:
        for sched, g in fig[name]["goodput"].items():
            s = g["goodput"]
            cell = "-" if s is None else f"{s['median']:.3f} ({s['min']:.3f}–{s['max']:.3f}, ×{s['n']})"
            cost = "-" if s is None else f"{g['cost_s']['median']:.2f} s = {g['cost_steps']['median']:.1f} steps"
            stops = sum(r.get("rule_stops", 0) for r in fig[name]["runs"][sched])
            rows.append([name, sched, g["failures"], cell, f">= {g['goal']:.2f}", cost, g["failed"], stops])
    table(
        out,
        f"goodput: steps/s under a schedule / steps/s with none ({fig['steps']} steps, forward "
        f"{fig['forward_s']} s, timeout {fig['timeout_s']} s; median (min–max) of the repeats)",
        ["graph", "schedule", "failures", "goodput", "goal", "per failure", "failed runs", "rule stops"],
        rows,
    )
