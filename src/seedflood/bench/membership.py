"""Open membership benchmark (`python -m seedflood.bench.membership`): what joins and heals cost a running run.

Runs the debug config (launch/configs/debug.yaml: tiny random Llama, synthetic task) as a churn
run (`churn.settle=1`) on a ring of --clients through the in-process runtime
(`roles.inprocess.simulate`: one thread per client, the real client loop, agreement, flood and
in-memory transport), in three figures:

1. join time against log length — one new id joins after L steps (L in --logs). Three moments,
   from the log lines the run writes: the newcomer starts ("waiting for a member to sponsor its
   join"), it has replayed its sponsor's log ("joined by replaying N steps"), and node 0 commits
   the first step that counts its messages (its "membership ... join" line: a join is admitted by
   the step whose value holds the newcomer's messages). The goal it is read against: the replay
   plus two delay windows, a window being (delay + 1) steps at the run's own step time.
2. throughput — --steps steps with no event, with a new id joining every --every steps, and with a
   link of the ring cut and healed --heal-after steps later every --every steps; steps per second
   of the whole run and the ratio to the run without events, taken in turn --repeats times (a
   burst of load hits all of them). A second baseline runs no event on a ring of as many clients
   as the join run ends with (more clients' forwards share the cores: its ratio to the first is
   what the extra clients cost by themselves).
3. growth — a ring of --clients admits a new id every --grow-every steps until it has --grow-to
   members; the seconds per step at each roster size (between consecutive admissions on node 0).

Every run must end with every client on one hash (checked). Nothing here asserts a figure: these
are measurements, printed. In-process threads share this machine's cores: at 32 clients the
forwards of all of them run on those cores, so step time grows with the roster.

    HF_HUB_OFFLINE=1 .venv/bin/python -m seedflood.bench.membership [--clients 8] [--logs 20,80,320]
        [--steps 150] [--every 50] [--heal-after 5] [--repeats 2] [--grow-to 32] [--grow-every 5]
        [--forward-s 0] [--only join,throughput,growth] [--set section.key=value ...] [--out f.json]

--forward-s S makes every client sleep S before each forward (an emulated device, as
`bench.speeds` does): in-process clients share this machine's cores, so without it a run with
more clients is slower per step because its forwards share the cores, not because of the protocol.

Assumes: run from the repository root (or --config); torch on CPU with one intra-op thread.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from seedflood.bench.common import add_run_args, figure_process, table, write_json
from seedflood.core.config import runconfig as config
from seedflood.core.config.runconfig import Config
from seedflood.core.flood.protocol import Protocol
from seedflood.core.topology import resolve as topo
from seedflood.roles.inprocess import Event, SimResult, simulate

DEBUG = Path("launch/configs/debug.yaml")  # --config, relative to the working directory
FIGURES = ("join", "throughput", "growth")
_WAITING = re.compile(r"node (\d+): a new node id: waiting for a member to sponsor its join")
_REPLAYED = re.compile(r"node (\d+): joined by replaying (\d+) steps")
_ADMITTED = re.compile(r"node 0: membership step (\d+): .*join ([\d, ()a-z]+)")


class Lines(logging.Handler):
    """The churn log lines of one run with the time each was written (perf_counter seconds)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.perf_counter(), record.getMessage()))

    def first(self, pattern: re.Pattern[str], want: str | None = None) -> tuple[float, re.Match[str]] | None:
        """The first line matching `pattern` (whose group 1 is `want`, if given) and its time."""
        for t, line in self.lines:
            if (m := pattern.search(line)) and (want is None or m.group(1) == want):
                return t, m
        return None

    def admissions(self) -> list[tuple[float, int, list[int]]]:
        """(time, step, new ids) of every join node 0 committed, in order."""
        out = []
        for t, line in self.lines:
            if m := _ADMITTED.search(line):
                ids = [int(x) for x in re.findall(r"(\d+) \(incarnation", m.group(2))]
                out.append((t, int(m.group(1)), ids))
        return out


@contextmanager
def captured() -> Iterator[Lines]:
    """Collect the roles' log lines, kept off the screen (the logger's level and propagation
    restored on the way out)."""
    handler = Lines()
    logger = logging.getLogger("seedflood.roles")
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def timed_run(
    cfg: Config, events: Sequence[Event], forward_s: float = 0.0, supervise: bool = False
) -> tuple[SimResult, float, Lines]:
    """One simulate run: its result, wall seconds and log lines; every client on one hash.
    `forward_s`: every client (new ids too) sleeps that long before each forward, its emulated
    device, so the figure measures the protocol rather than threads sharing this machine's cores.
    `supervise`: a client the churn rules stop is restarted (simulate's `supervise`)."""
    pace = {i: forward_s for i in range(max(cfg.churn.max_nodes, cfg.topology.nodes))} if forward_s else None
    with captured() as lines:
        t0 = time.perf_counter()
        r = simulate(cfg, hash_every_step=False, events=events, pace=pace, supervise=supervise)
        wall = time.perf_counter() - t0
    if r.exits or len(set(r.hashes.values())) != 1:
        raise RuntimeError(f"the run did not end on one hash: exits {r.exits}, {len(set(r.hashes.values()))} hashes")
    lines.lines = [(t - t0, line) for t, line in lines.lines]  # seconds from the run's start
    return r, wall, lines


def join_time(args: argparse.Namespace, base: list[str]) -> list[dict[str, Any]]:
    """Figure 1: one new id joins after L steps, for each L in --logs."""
    rows = []
    new = args.clients
    opened = [*base, f"churn.max_nodes={new + 1}"]
    probe = config.load(args.config, opened)
    delay = Protocol.of(probe, topo.build(probe.topology).diameter).delay
    for log_len in args.logs:
        steps = log_len + 4 * (delay + 1)  # admitted delay + 1 steps after its sponsor's step, then counted
        cfg = config.load(args.config, [*opened, f"run.steps={steps}"])
        r, wall, lines = timed_run(cfg, [Event(log_len, new, "join")], args.forward_s)
        start, replayed = lines.first(_WAITING, str(new)), lines.first(_REPLAYED, str(new))
        admitted = [a for a in lines.admissions() if new in a[2]]
        if start is None or replayed is None or not admitted:
            raise RuntimeError(f"join after {log_len} steps: the log lines of its join are missing")
        step_s = wall / steps
        window = (delay + 1) * step_s
        rows.append(
            {
                "log_steps": log_len,
                "replayed_steps": int(replayed[1].group(2)),
                "start_to_replayed_s": replayed[0] - start[0],
                "start_to_first_counted_s": admitted[0][0] - start[0],
                "first_counted_step": admitted[0][1],
                "step_s": step_s,
                "delay_window_s": window,
                "goal_s": (replayed[0] - start[0]) + 2 * window,
            }
        )
        print(f"  join after {log_len} steps: {wall:.1f} s", flush=True)
    return rows


def throughput(args: argparse.Namespace, base: list[str]) -> list[dict[str, Any]]:
    """Figure 2: no event, a join every --every steps, a cut and its heal every --every steps."""
    n, every = args.clients, args.every
    probe = config.load(args.config, base)
    delay = Protocol.of(probe, topo.build(probe.topology).diameter).delay
    # an event every `every` steps that leaves its join time (a few delay windows) before the end
    marks = list(range(every, args.steps - 4 * (delay + 1) + 1, every))
    joins = [Event(s, n + i, "join") for i, s in enumerate(marks)]
    heals = [
        e
        for i, s in enumerate(marks)
        for a in [(2 * i) % n]  # a different link of the ring each time
        for e in (Event(s, a, "cut", (a + 1) % n), Event(s + args.heal_after, a, "heal", (a + 1) % n))
    ]
    cfg = config.load(args.config, [*base, f"run.steps={args.steps}", f"churn.max_nodes={n + len(joins)}"])
    # the second baseline: as many clients from the start as the join run ends with (their
    # forwards share this machine's cores, so more clients are slower per step without any event)
    wide = config.load(
        args.config,
        [*base, f"topology.nodes={n + len(joins)}", f"run.steps={args.steps}", f"churn.max_nodes={n + len(joins)}"],
    )
    kinds = {
        "none": [],
        f"none, {n + len(joins)} clients": [],
        f"join every {every}": joins,
        f"cut + heal every {every}": heals,
    }
    walls: dict[str, list[float]] = {k: [] for k in kinds}
    for rep in range(args.repeats):
        for name, events in kinds.items():
            walls[name].append(timed_run(wide if name.endswith("clients") else cfg, events, args.forward_s)[1])
            print(f"  {name} (repeat {rep + 1}): {walls[name][-1]:.1f} s", flush=True)
    rate = {k: args.steps / statistics.median(w) for k, w in walls.items()}
    return [
        {
            "run": k,
            "events": len(kinds[k]) // (2 if k.startswith("cut") else 1),
            "wall_s": walls[k],
            "steps_per_s": rate[k],
            "of_none": rate[k] / rate["none"],
        }
        for k in kinds
    ]


def growth(args: argparse.Namespace, base: list[str]) -> list[dict[str, Any]]:
    """Figure 3: a new id every --grow-every steps until --grow-to members; s/step per roster size."""
    n, k = args.clients, args.grow_every
    news = list(range(n, args.grow_to))
    events = [Event(k * (i + 1), j, "join") for i, j in enumerate(news)]
    opened = [*base, f"churn.max_nodes={args.grow_to}"]
    probe = config.load(args.config, opened)
    delay = Protocol.of(probe, topo.build(probe.topology).diameter).delay
    steps = k * len(news) + 4 * (delay + 1)  # the last one admitted, then some steps at full size
    cfg = config.load(args.config, [*opened, f"run.steps={steps}"])
    r, wall, lines = timed_run(cfg, events, args.forward_s)
    if sorted(r.hashes) != list(range(args.grow_to)):
        raise RuntimeError(f"growth: {len(r.hashes)} clients finished, not {args.grow_to}")
    marks = [(0.0, 0, n)]  # (time, step, members from that step)
    for t, step, ids in lines.admissions():
        marks.append((t, step, marks[-1][2] + len(ids)))
    marks.append((wall, steps, marks[-1][2]))  # the end (its drain included)
    rows = [
        {"members": m0, "from_step": s0, "to_step": s1, "s_per_step": (t1 - t0) / (s1 - s0)}
        for (t0, s0, m0), (t1, s1, _) in zip(marks, marks[1:], strict=False)
        if s1 > s0
    ]
    print(f"  growth {n} -> {args.grow_to}: {wall:.1f} s, {steps} steps", flush=True)
    return rows


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--clients", type=int, default=8, help="clients on the debug ring at the start (default 8)")
    ap.add_argument("--logs", default="20,80,320", help="steps before the join, figure 1 (default 20,80,320)")
    ap.add_argument("--steps", type=int, default=150, help="steps of each throughput run (default 150)")
    ap.add_argument("--every", type=int, default=50, help="steps between events, figure 2 (default 50)")
    ap.add_argument("--heal-after", type=int, default=5, help="steps a cut link stays cut (default 5)")
    ap.add_argument("--repeats", type=int, default=2, help="throughput runs of each kind (default 2)")
    ap.add_argument("--grow-to", type=int, default=32, help="members at the end of figure 3 (default 32)")
    ap.add_argument("--grow-every", type=int, default=5, help="steps between admissions, figure 3 (default 5)")
    ap.add_argument(
        "--forward-s", type=float, default=0.0, help="each client's emulated forward, a sleep (default 0: none)"
    )
    ap.add_argument("--only", default=",".join(FIGURES), help=f"figures to run (default {','.join(FIGURES)})")
    add_run_args(ap, DEBUG)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        args.logs = sorted({int(x) for x in args.logs.split(",") if x})
    except ValueError:
        ap.error(f"--logs takes step counts separated by commas, not {args.logs!r}")
    figures = [x for x in args.only.split(",") if x]
    if unknown := sorted(set(figures) - set(FIGURES)):
        ap.error(f"--only: unknown {', '.join(unknown)} (choose from {', '.join(FIGURES)})")
    if args.clients < 3 or not args.logs or min(args.logs) < 1 or args.repeats < 1:
        ap.error("need --clients >= 3, --logs of steps >= 1 and --repeats >= 1")
    if args.every < 2 or args.steps <= args.every or not 1 <= args.heal_after < args.every:
        ap.error("need --every >= 2, --steps > --every and 1 <= --heal-after < --every")
    if not (math.isfinite(args.forward_s) and args.forward_s >= 0):
        ap.error("need a finite --forward-s >= 0")
    if args.grow_to <= args.clients or args.grow_every < 2:
        ap.error("need --grow-to > --clients and --grow-every >= 2")
    with figure_process(ap, args.config):
        return _measure(args, figures)


def _measure(args: argparse.Namespace, figures: list[str]) -> int:
    base = [
        f"topology.nodes={args.clients}",
        "topology.kind=ring",
        "churn.settle=1",
        "transport.timeout_s=1",
        "run.threads=1",
        *args.set,
    ]
    print(f"seedflood.bench.membership: {args.config} with {' '.join(base)}")
    simulate(config.load(args.config, [*base, "run.steps=2"]), hash_every_step=False)  # warm-up, not timed
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    if "join" in figures:
        out["join"] = join_time(args, base)
        show("join time against log length", out["join"], JOIN_KEYS)
    if "throughput" in figures:
        out["throughput"] = throughput(args, base)
        show("throughput against none", out["throughput"], ["run", "events", "steps_per_s", "of_none"])
    if "growth" in figures:
        out["growth"] = growth(args, base)
        show(
            "growth: seconds per step by roster size", out["growth"], ["members", "from_step", "to_step", "s_per_step"]
        )
    if args.out:
        write_json(args.out, out)
        print(f"wrote {args.out}")
    return 0


JOIN_KEYS = ["log_steps", "replayed_steps", "start_to_replayed_s", "start_to_first_counted_s", "goal_s"]


def show(title: str, rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> None:
    """`keys` of each row as a plain-text table (floats to 4 significant digits)."""
    table(sys.stdout, title, keys, [[f"{r[k]:.4g}" if isinstance(r[k], float) else r[k] for k in keys] for r in rows])


if __name__ == "__main__":
    raise SystemExit(main())
