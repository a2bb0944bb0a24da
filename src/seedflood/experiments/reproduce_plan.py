"""The planning half of `seedflood reproduce`: the paper's grid, the step-cost model and its
calibration, and the planner that fits the grid to a time budget.

Owns: the grid (`grid`), the cost model (`Costs`, `step_seconds`,
`run_seconds`, `memory_bytes`), its calibration on this machine (`calibrate`), the planner
(`plan_grid`) and the plan file DIR/plan.json (`save_plan`, `load_plan`). Running a plan and the command are reproduce.py's; the report reproduce_report.py's.

The grid, on the base config (default launch/configs/rt-smollm2-16.yaml), in priority tiers:
  tier 1  ring16: seedflood, dsgd (the normaliser), dzsgd, choco-lora    (answers item 1's ordering)
  tier 2  seedflood at 128 clients and with 4 hops per step (the other two questions), then at 32,
          64 clients and 1, 2 hops; ring16: dsgd-lora, dzsgd-lora, choco, diloco
  tier 3  torus16 (4×4): the eight algorithms; dsgd, dzsgd, choco at 32, 64, 128 clients
  tier 4  SubCGE rank 8, 16, 64 and refresh 10, 100 (seedflood, ring16)
The ring16 run of seedflood is also the 16-client point of the scaling rows, the diameter row of
the hops table (ring16's diameter is 8) and the base point (the config's rank and refresh) of the
SubCGE table.

Planning: every run of a plan takes the same S steps. A tier joins the plan once S reaches its
MIN_STEPS (extra questions are asked only once the core one has steps to answer it). Plans form
a chain ordered by cost: (S, every run admitted at S) for S = 1, 2, ..., and where a tier joins
at S + 1, the links (S + 1, the runs so far plus the joining tier's first k runs) in between.
The planner takes the last link that fits the budget (largest S by bisection, then the joining
tier one run at a time), so a larger budget never gives fewer steps or fewer runs. Runs whose
client vectors do not fit the device's free memory are left out (and listed).

Cost model (seconds; `calibrate` measures the four primitives on this machine with the base
config's model, batch and eval batch): a ZO forward f (one loss forward of a client's batch), a
first-order step 3f (backward ≈ 2 forwards: stated, not measured), a scored example e, and a
dense frame g (tensorwire encode + decode of the full trainable vector; LoRA frames scale by
the adapter fraction, choco's top-k frame costs one g for the selection). Per step: seedflood
2N·f (on CUDA with sim.batched: 2N·f / BATCHED_GAIN, the goal, not yet measured);
dzsgd 2N·f + N·deg·g; dsgd, choco 3N·f + N·deg·g; diloco 3N·f + N·g; a -lora variant the same
with its frame fraction. Per run: model load, (S / eval.every + 1) scorings of the test and dev
sets, and for gossip algorithms every client scored on test at the end (baselines.py).

Assumes: a Workload can be built from the base config here (calibrate loads its model and data).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from seedflood.core.config import runconfig as config_mod
from seedflood.core.config.runconfig import ConfigError
from seedflood.rundir.atomic import atomic_write_text

PLAN = "plan.json"
"""The stored plan in DIR (save_plan, load_plan)."""
GROUPS = ("ring16", "torus16", "scale", "hops", "subcge")
ALGS16 = ("seedflood", "dsgd", "dzsgd", "choco-lora", "choco", "diloco", "dsgd-lora", "dzsgd-lora")
SCALE_N = (32, 64, 128)
HOPS = (1, 2, 4, 8)
RANKS, REFRESHES = (8, 16, 64), (10, 100)
MIN_STEPS = {1: 1, 2: 10, 3: 50, 4: 100}
"""A tier joins the plan once the steps reach this."""
BATCHED_GAIN = 5.0
"""CUDA, sim.batched: a 16-client step ≈ 3 × one client's two forwards (the batched goal) ≈ 2N·f / 5."""
FIRST_ORDER = 3.0
"""A forward + backward in forwards (stated)."""
MEMORY_USE = 0.8
"""Fraction of the free device memory a run may plan to use."""
LORA = ("dsgd-lora", "choco-lora", "dzsgd-lora")
GOSSIP = ("dzsgd", "dsgd", "choco", *LORA)


class ReproduceError(ConfigError):
    """A bad `seedflood reproduce` invocation or directory; one line, exit status 2."""


@dataclass(frozen=True)
class Base:
    """The config every run starts from: a YAML path (None: the defaults) and --set values."""

    config: str | None
    sets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Spec:
    """One run of the grid: DIR/name/algorithm, the base config plus `overrides`."""

    name: str
    algorithm: str
    tier: int
    clients: int
    degree: int
    overrides: tuple[str, ...]
    groups: tuple[str, ...]


@dataclass
class Costs:
    """Measured primitives (seconds) and sizes the cost model uses (see the module doc)."""

    device: str
    forward: float
    """f: one loss forward of a client's batch."""
    example: float
    """e: one scored example (eval batch / its size)."""
    frame: float
    """g: encode + decode one dense frame of the full trainable vector."""
    setup: float
    """Model and data load of one run."""
    trainable: int
    """Full-parameter trainable scalars."""
    lora: int
    """Adapter scalars of a -lora run."""
    scored: int
    """Test + dev examples of one scoring."""
    test: int
    memory: float
    """Free device memory, bytes."""


def _topology(kind: str, n: int) -> tuple[str, ...]:
    rows = "topology.rows=4" if kind == "torus" else "topology.rows=0"
    return (f"topology.kind={kind}", f"topology.nodes={n}", rows, "topology.file=")


def grid(groups: Sequence[str] = GROUPS, algorithms: Sequence[str] = ALGS16) -> list[Spec]:
    """Every run of the chosen groups and algorithms, deduplicated, in tier then table order."""
    ring16 = _topology("ring", 16)
    specs: dict[str, Spec] = {}

    def add(name: str, alg: str, tier: int, n: int, deg: int, extra: tuple[str, ...], group: str) -> None:
        if alg not in algorithms:
            return
        old = specs.get(name)
        if old is not None:
            groups_ = old.groups if group in old.groups else (*old.groups, group)
            specs[name] = Spec(name, alg, min(old.tier, tier), n, deg, old.overrides, groups_)
        else:
            specs[name] = Spec(name, alg, tier, n, deg, extra, (group,))

    def tier(alg: str) -> int:
        return 1 if alg in ALGS16[:4] else 2

    for alg in ALGS16:
        if "ring16" in groups:
            add(f"ring16-{alg}", alg, tier(alg), 16, 2, ring16, "ring16")
        if "torus16" in groups:
            add(f"torus16-{alg}", alg, 3, 16, 4, _topology("torus", 16), "torus16")
    if "scale" in groups:
        for alg in ("seedflood", "dsgd", "dzsgd", "choco"):
            add(f"ring16-{alg}", alg, tier(alg), 16, 2, ring16, "scale")  # the 16-client point
            for n in SCALE_N:
                add(f"ring{n}-{alg}", alg, 2 if alg == "seedflood" else 3, n, 2, _topology("ring", n), "scale")
    if "hops" in groups:
        add("ring16-seedflood", "seedflood", 1, 16, 2, ring16, "hops")  # the diameter row
        for h in HOPS:
            if h < 8:  # ring16's diameter is 8: hops >= 8 is the diameter run itself
                add(f"hops{h}-seedflood", "seedflood", 2, 16, 2, (*ring16, f"flood.hops_per_step={h}"), "hops")
    if "subcge" in groups:
        add("ring16-seedflood", "seedflood", 1, 16, 2, ring16, "subcge")  # the config's rank and refresh
        for r in RANKS:
            add(f"rank{r}-seedflood", "seedflood", 4, 16, 2, (*ring16, f"subspace.rank={r}"), "subcge")
        for p in REFRESHES:
            add(f"refresh{p}-seedflood", "seedflood", 4, 16, 2, (*ring16, f"subspace.refresh={p}"), "subcge")
    return sorted(specs.values(), key=_priority)


FIRST = ("ring128-seedflood", "hops4-seedflood")
"""Within tier 2, the runs the paper's ordering questions need (128 ≥ 16; 4 hops ≈ diameter)."""


def _priority(s: Spec) -> tuple[int, int, int]:
    """Tier; then (tiers ≥ 2) FIRST, SeedFlood, LoRA, full-parameter: a joining tier's cheap runs,
    which answer the questions, come before its costly ones (sorting is stable: table order next)."""
    if s.tier == 1:
        return (1, 0, 0)
    kind = 0 if s.algorithm == "seedflood" else 1 if s.algorithm in LORA else 2
    return (s.tier, 0 if s.name in FIRST else 1, kind)


def eval_every(steps: int) -> int:
    """Scoring at 0 and the end (and every fifth of the run from 20 steps on)."""
    return steps if steps < 20 else math.ceil(steps / 5)


def step_seconds(spec: Spec, c: Costs) -> float:
    """The model's seconds of one step of `spec` (module doc)."""
    n, a = spec.clients, spec.algorithm
    frac = c.lora / c.trainable if a in LORA else 1.0
    base = a.removesuffix("-lora")
    if a == "seedflood":
        return 2 * n * c.forward / (BATCHED_GAIN if c.device == "cuda" else 1.0)
    if a == "mezo":
        return 2 * c.forward
    fwd = 2.0 if base == "dzsgd" else FIRST_ORDER
    frames = 1 if base == "diloco" else spec.degree
    return n * (fwd * c.forward + frames * frac * c.frame)


def run_seconds(spec: Spec, steps: int, c: Costs) -> float:
    """The model's seconds of the whole run of `spec` at `steps`."""
    scorings = steps // eval_every(steps) + 1 + (steps % eval_every(steps) != 0)
    finals = spec.clients * c.test if spec.algorithm in GOSSIP else 0
    return c.setup + steps * step_seconds(spec, c) + (scorings * c.scored + finals) * c.example


def memory_bytes(spec: Spec, c: Costs) -> float:
    """Client vectors a run holds: x_i, a frame in flight and a mixing buffer per client (choco,
    diloco: one more); seedflood holds one model for all."""
    if spec.algorithm in ("seedflood", "mezo"):
        return 0.0
    numel = c.lora if spec.algorithm in LORA else c.trainable
    copies = 4 if spec.algorithm.removesuffix("-lora") in ("choco", "diloco") else 3
    return 4.0 * numel * copies * spec.clients


@dataclass
class Plan:
    steps: int
    runs: list[Spec]
    seconds: list[float]
    left_out: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(self.seconds)


def plan_grid(specs: Sequence[Spec], costs: Costs, budget_s: float, max_steps: int = 5000) -> Plan:
    """The largest step count (and the tiers it admits) whose runs fit `budget_s` (module doc)."""
    if budget_s <= 0:
        raise ReproduceError(f"--budget must be > 0 minutes, got {budget_s / 60:g}")
    fits = [s for s in specs if memory_bytes(s, costs) <= MEMORY_USE * costs.memory]
    left = [f"{s.name}: needs {memory_bytes(s, costs) / 2**30:.1f} GiB" for s in specs if s not in fits]

    def runs_at(steps: int) -> list[Spec]:
        return [s for s in fits if MIN_STEPS[s.tier] <= steps]

    if not fits:
        raise ReproduceError("no run of the grid fits this device's memory: " + "; ".join(left))

    def cost_of(runs: Sequence[Spec], steps: int) -> float:
        return sum(run_seconds(s, steps, costs) for s in runs)

    best = 0  # the largest S whose whole admitted grid fits (0: not even tier 1 at one step)
    if cost_of(runs_at(1), 1) <= budget_s:
        lo, hi = 1, max_steps
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if cost_of(runs_at(mid), mid) <= budget_s else (lo, mid - 1)
        best = lo
    steps, runs = best, runs_at(best) if best else []
    if best < max_steps:  # the chain's next links: S + 1 steps, the tier joining there one run at a time
        new = [s for s in fits if MIN_STEPS[s.tier] == best + 1]
        if new and cost_of(runs, best + 1) <= budget_s:
            steps = best + 1
            for s in new:
                if cost_of([*runs, s], steps) > budget_s:
                    break
                runs = [*runs, s]
            if runs_at(steps) != runs:
                left.append(f"over the budget at {steps} steps: " + ", ".join(s.name for s in new if s not in runs))
    if not runs:
        need = run_seconds(runs_at(1)[0], 1, costs) / 60
        raise ReproduceError(
            f"--budget: {budget_s / 60:.1f} min left after calibrating is below the smallest plan "
            f"({runs_at(1)[0].name}, 1 step: {need:.1f} min)"
        )
    for tier in sorted({s.tier for s in fits if MIN_STEPS[s.tier] > steps}):
        names = ", ".join(s.name for s in fits if s.tier == tier)
        left.append(f"tier {tier} (joins at {MIN_STEPS[tier]}+ steps): {names}")
    return Plan(steps, runs, [run_seconds(s, steps, costs) for s in runs], left)


def calibrate(base: Base, device: str, echo: Callable[[str], None] = print) -> Costs:
    """Measure f, e, g and the load time on this machine with the base config's model and task."""
    import torch

    from seedflood.core.zo.directions import select_trainable
    from seedflood.experiments import tensorwire
    from seedflood.ml import modelcheck, objective
    from seedflood.ml.workload import Workload

    cfg = config_mod.load(base.config, [*base.sets, f"model.device={device}", *_topology("ring", 16)])
    modelcheck.check_source(cfg.model)  # a missing download: one line naming it, as world-size says it
    t0 = time.monotonic()
    w = Workload.build(cfg)
    setup = time.monotonic() - t0

    def timed(fn: Callable[[], object], warm: bool = True) -> float:
        if warm:
            fn()  # first call: lazy initialisation, caches
        t = time.monotonic()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.monotonic() - t

    with torch.no_grad():
        forward = timed(lambda: objective.loss(w.model, w.batch(0, 0)))
    k = min(cfg.eval.batch_size, len(w.splits.test))
    example = timed(lambda: w.evaluate("test", limit=k), warm=False) / k  # after the forwards' warm-up
    names = select_trainable(w.model, cfg.zo.trainable)
    params = dict(w.model.named_parameters())
    trainable = sum(params[n].numel() for n in names)
    vec = torch.zeros(trainable, dtype=torch.float32)
    frame = timed(lambda: tensorwire.decode(tensorwire.encode_dense(vec)), warm=False)
    r, targets = cfg.algorithm.lora_rank, cfg.algorithm.lora_targets
    adapters = sum(
        r * (m.in_features + m.out_features)
        for name, m in w.model.named_modules()
        if isinstance(m, torch.nn.Linear) and name.rpartition(".")[2] in targets
    )
    # adapters: lora.inject's count (Σ r·(in + out) over the targets), without injecting
    memory = float(torch.cuda.mem_get_info()[0]) if device == "cuda" else _mem_available()
    scored = len(w.splits.test) + len(w.splits.dev)
    c = Costs(device, forward, example, frame, setup, trainable, adapters or 1, scored, len(w.splits.test), memory)
    echo(
        f"reproduce: calibrated on {device}: forward {forward:.3f} s (batch {cfg.task.batch_size}), "
        f"scoring {example * 1e3:.1f} ms/example, dense frame {frame:.3f} s ({trainable:,} scalars), "
        f"load {setup:.1f} s, free memory {memory / 2**30:.1f} GiB"
    )
    return c


def _mem_available() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")


def describe(plan: Plan) -> str:
    """The plan as printed before anything runs."""
    lines = [f"plan: {len(plan.runs)} runs of {plan.steps} steps each, expected {plan.total / 60:.1f} min:"]
    for s, sec in zip(plan.runs, plan.seconds):
        lines.append(f"  {s.name:<22} {s.algorithm:<11} tier {s.tier}  {sec / 60:7.1f} min  ({', '.join(s.groups)})")
    if plan.left_out:
        lines += ["left out:", *(f"  {why}" for why in plan.left_out)]
    return "\n".join(lines)


def save_plan(out: Path, plan: Plan, costs: Costs, args: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    body = {
        "args": args,
        "costs": asdict(costs),
        "steps": plan.steps,
        "runs": [asdict(s) for s in plan.runs],
        "seconds": plan.seconds,
        "left_out": plan.left_out,
    }
    atomic_write_text(out / PLAN, json.dumps(body, indent=1) + "\n")


def load_plan(out: Path) -> tuple[Plan, dict[str, Any]]:
    """The stored plan of DIR and the whole plan.json."""
    try:
        body = json.loads((out / PLAN).read_text())
        runs = [Spec(**{**s, "overrides": tuple(s["overrides"]), "groups": tuple(s["groups"])}) for s in body["runs"]]
        return Plan(body["steps"], runs, body["seconds"], body["left_out"]), body
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ReproduceError(f"{out / PLAN}: no readable plan ({type(e).__name__ + ': ' + str(e)})") from None
