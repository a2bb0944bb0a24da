"""`seedflood gpu-evidence`: the GPU evidence plan, run against a clock, results in one small folder.

Owns the plan and the command. Running a command against the clock and writing the folder are
gpuevidence_run.py's; reading run directories into rows, the report and the plot
gpuevidence_report.py's. The output folder OUT (at most 8 files, each capped at 15 MiB):

    evidence.json   every figure, written again as soon as each item ends (a cut run keeps them)
    evidence.md     the same as a short report
    a-runtime.log   (a)'s commands and output;  b-bench.log (b)'s;  c-reproduce.log (c)'s
    evidence.png    (b) client-steps per second against clients, (c) test accuracy against steps
    staged.json     what the kit's stage found (versions, GPU), when run from a staged kit

The items, in priority order so that what the clock cuts is the least important:
  (a) the launched runtime: launch/torchrun.sh, 4 clients + the evaluator, every client on the
      evaluator's hash; `seedflood replay` and a sequential `seedflood simulate` of the same config
      on the same device give that hash; then launch/churn.sh: one client SIGKILLed after 10 steps,
      restarted by its agent, rejoined, every client on the evaluator's hash and replay's. The churn
      run's length is derived from the first run's measured step rate and start-up time and from
      what is left of (a)'s clock (churn_steps), instead of a guess.
  (b) `seedflood bench --only sim` at 1, 16, 64, 128 clients: batched against sequential and the floor.
  (c) `seedflood reproduce`, tier 1 (ring16): SeedFlood alone with up to 5,000 steps first, then
      choco-lora, dzsgd-lora, dsgd-lora, then dsgd (first order) with up to 500 steps, each call
      planning (and calibrating) in what is left of the clock.
Each item owns a share of --budget (a 0.55, b 0.15, c the rest; time an item leaves over goes to
the next). A command still running at its item's deadline is killed with its process group: its
row says "cut at step S" (the last step its run directory holds), never finished.

--dry runs the same plan on CPU with the tiny model and the synthetic task at small sizes (seconds
per item): what `make gpu-check` and CI run, writing the same files.

Assumes: the launchers are in --launch (a staged kit's launch/, or the repository's); the
interpreter running this has seedflood, torch and transformers; one run at a time on the GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seedflood.experiments import budget
from seedflood.experiments.gpuevidence_report import consensus, normalise, plot, report, reproduce_rows
from seedflood.experiments.gpuevidence_run import Clock, Evidence, Ran, last_step, logged_steps, run, summary, worker

# Cumulative share of the budget each item may end by. On the H200 (9 min) (a) needed ~130 s before
# its churn run, which needs two start-ups (~63 s each) and the training between; (b) took 84 s.
SHARES = {"a": 0.55, "b": 0.70, "c": 1.0}
LOGS = {"a": "a-runtime", "b": "b-bench", "c": "c-reproduce"}  # each item's log (OUT/<name>.log)
CHURN_VICTIM = 3  # a client's rank (node 2); the evaluator attaches to node 0
RING16_PLAN = (("seedflood", 5000), ("choco-lora,dzsgd-lora,dsgd-lora", 5000), ("dsgd", 500))


@dataclass(frozen=True)
class Profile:
    """What the plan runs with: the GPU's real model and task, or --dry's tiny ones on the CPU."""

    config: str  # a launch/configs file name
    device: str
    sets: tuple[str, ...]  # overrides of every run
    steps: int  # the launched run's steps
    bench: tuple[str, ...]  # `seedflood bench` arguments
    reproduce: tuple[str, ...]  # extra `seedflood reproduce` arguments
    churn_steps: tuple[int, int]  # the churn run's fewest and most steps
    max_steps_scale: float  # (c)'s step caps times this


GPU = Profile(
    config="demo.yaml",
    device="cuda",
    sets=("task.test_examples=200", "task.dev_examples=100"),
    steps=24,
    bench=(
        "--model",
        "smollm2-135m",
        "--sim-device",
        "cuda",
        "--sim-clients",
        "1",
        "16",
        "64",
        "128",
        "--repeats",
        "3",
    ),
    reproduce=(),
    churn_steps=(100, 5000),
    max_steps_scale=1.0,
)
DRY = Profile(
    config="debug.yaml",
    device="cpu",
    sets=(),
    steps=12,
    bench=("--model", "tiny", "--sim-device", "cpu", "--sim-clients", "1", "4", "--repeats", "2"),
    reproduce=("--config", "{launch}/configs/debug.yaml", "--set", "eval.batch_size=64"),
    churn_steps=(200, 400),  # a tiny client restarted after step 10 rejoins by step ~130 on 2 cores
    max_steps_scale=0.002,  # 5000 -> 10 steps, 500 -> 1
)


# -- (a) the launched runtime -------------------------------------------------------------------------
@dataclass
class Runtime:
    """What (a)'s commands share: the evidence, the clock, the launchers, the config and its overrides."""

    ev: Evidence
    clock: Clock
    prof: Profile
    launch: Path
    env: dict[str, str]

    @property
    def config(self) -> str:
        return str(self.launch / "configs" / self.prof.config)

    def sets(self, *extra: str) -> list[str]:
        """--set arguments: the profile's, the device, a short run scored at its middle and end."""
        p = self.prof
        base = [*p.sets, f"model.device={p.device}", f"run.steps={p.steps}", "checkpoint.every=0"]
        return [x for s in [*base, f"eval.every={p.steps // 2}", *extra] for x in ("--set", s)]

    def run(self, argv: Sequence[str], **kw: Any) -> Ran:
        return run(self.ev, "a-runtime", argv, self.clock.left("a"), kw.pop("env", self.env), **kw)


def item_a(ev: Evidence, clock: Clock, prof: Profile, launch: Path, env: dict[str, str]) -> None:
    rt = Runtime(ev, clock, prof, launch, env)
    fig: dict[str, Any] = ev.figures.setdefault("a", {})
    want, startup, rate = launched(rt, fig)
    if want is None:
        return
    # the same hash from the log alone, and from the config simulated sequentially in one process
    ran, got = replay(ev, ev.work / "a-launched", clock.left("a"), env)
    fig["replay"] = {"exit": ran.code, "seconds": round(ran.seconds, 1), "hash": got, "equal": got == want}
    simulated = ev.work / "a-simulate"
    cmd = [sys.executable, "-m", "seedflood", "simulate", "--config", rt.config]
    ran = rt.run([*cmd, *rt.sets(f"run.out_dir={simulated}", "sim.batched=false")])
    got = (summary(simulated) or {}).get("param_hash")
    fig["simulate"] = {"exit": ran.code, "seconds": round(ran.seconds, 1), "hash": got, "equal": got == want}
    ev.save()
    churn(rt, fig, startup, rate)


def launched(rt: Runtime, fig: dict[str, Any]) -> tuple[str | None, float, float]:
    """launch/torchrun.sh: 4 clients + the evaluator. Returns the evaluator's hash (None: no
    summary), the start-up seconds (launch to the first logged step) and the steps per second."""
    out = rt.ev.work / "a-launched"
    progress: list[tuple[float, int]] = []  # (seconds since launch, steps logged)
    t0 = time.monotonic()

    def watch(_: subprocess.Popen) -> None:
        n = logged_steps(out)
        if n and (not progress or n > progress[-1][1]):
            progress.append((time.monotonic() - t0, n))

    ran = rt.run(["bash", str(rt.launch / "torchrun.sh"), rt.config, *rt.sets(f"run.out_dir={out}")], poll=watch)
    s = summary(out)
    startup = progress[0][0] if progress else ran.seconds
    (t1, n1), (t2, n2) = (progress[0], progress[-1]) if progress else ((0.0, 0), (0.0, 0))
    rate = (n2 - n1) / (t2 - t1) if t2 > t1 else 0.0
    fig["launched"] = {
        "exit": ran.code,
        "seconds": round(ran.seconds, 1),
        **consensus(s, rt.prof.steps, last_step(out)),
        "startup_s": round(startup, 1),
        "steps_per_s": round(rate, 2),
    }
    rt.ev.save()
    return (s or {}).get("param_hash"), startup, rate


def churn(rt: Runtime, fig: dict[str, Any], startup: float, rate: float) -> None:
    """launch/churn.sh: one client's worker SIGKILLed after 10 steps, restarted by its own agent;
    it must rejoin and every client end on the evaluator's hash and replay's; its length is
    churn_steps'."""
    from seedflood.comm.runtime import free_port

    out = rt.ev.work / "a-churn"
    low, high = rt.prof.churn_steps
    steps, why = churn_steps(rate, startup, rt.clock.left("a"), low, high)
    fig["churn"] = {"steps": steps, "victim_rank": CHURN_VICTIM, "why_steps": why}
    port = free_port()
    killed: dict[str, Any] = {}

    def kill_once(_: subprocess.Popen) -> None:
        if killed or logged_steps(out) < 10:
            return
        pid = worker(f"127.0.0.1:{port}", CHURN_VICTIM)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            killed.update(pid=pid, at_step=logged_steps(out))
            rt.ev.say("a-runtime", f"SIGKILLed rank {CHURN_VICTIM}'s worker (pid {pid}) at step {killed['at_step']}")

    sets = rt.sets(
        f"run.out_dir={out}", f"run.steps={steps}", "churn.settle=1", "transport.timeout_s=3", "eval.every=0"
    )
    env = {**rt.env, "STORE_PORT": str(port), "MAX_RESTARTS": "2"}
    ran = rt.run(["bash", str(rt.launch / "churn.sh"), rt.config, *sets], env=env, poll=kill_once)
    s = summary(out)
    fig["churn"].update(
        exit=ran.code,
        seconds=round(ran.seconds, 1),
        killed=killed,
        rejoined="rejoined by replaying" in rt.ev.log("a-runtime").read_text(errors="replace"),
        **consensus(s, steps, last_step(out)),
    )
    if s is not None:
        fig["churn"]["replay_equal"] = replay(rt.ev, out, rt.clock.left("a"), rt.env)[1] == s["param_hash"]
    rt.ev.save()


def churn_steps(rate: float, startup: float, left: float, low: int, high: int) -> tuple[int, str]:
    """The churn run's steps and why: as many as fit in `left` seconds (one start-up and a 20 s
    margin for the replay check taken off), never fewer than a restart needs to rejoin (its own
    start-up + 10 s of steps after the kill at step 10), within [low, high]. rate: steps per
    second of the launched run; startup: its seconds from launch to the first logged step.
    On the H200 the first plan (3 start-ups, ignoring the clock) asked for 515 steps with 86 s
    left, and the run was cut at step 152 before it could finish."""
    fits = math.floor(rate * (left - startup - 20))
    rejoin = math.ceil(rate * (startup + 10)) + 10
    steps = min(high, max(low, rejoin, fits))
    why = (
        f"{left:.0f} s left - start-up {startup:.0f} s - 20 s at {rate:.1f} steps/s = {fits}; "
        f"a rejoin needs {rejoin}; within {low}..{high}"
    )
    return steps, why


def replay(ev: Evidence, run_dir: Path, timeout_s: float, env: dict[str, str]) -> tuple[Ran, str | None]:
    """`seedflood replay RUN_DIR --json`: how it ended and the hash it printed (None if none)."""
    out = ev.work / f"{run_dir.name}-replay.json"
    argv = [sys.executable, "-m", "seedflood", "replay", str(run_dir), "--json"]
    ran = run(ev, "a-runtime", argv, timeout_s, env, stdout=out)
    lines = out.read_text().strip().splitlines() if out.is_file() else []
    try:
        return ran, json.loads(lines[-1])["param_hash"] if ran.code == 0 and lines else None
    except (ValueError, KeyError, TypeError):
        return ran, None


# -- (b) the batched engine's throughput ----------------------------------------------------------------
def item_b(ev: Evidence, clock: Clock, prof: Profile, env: dict[str, str]) -> None:
    out = ev.work / "b-bench.json"
    # sim's budget is per side and client count: a side projected past it is skipped, not run
    budget = max((clock.left("b") - 30) / 6, 5.0)
    ran = run(
        ev,
        "b-bench",
        [
            sys.executable,
            "-m",
            "seedflood",
            "bench",
            "--only",
            "sim",
            *prof.bench,
            "--sim-budget",
            f"{budget:.0f}",
            "--json",
            str(out),
        ],
        clock.left("b"),
        env,
    )
    fig: dict[str, Any] = {"exit": ran.code, "seconds": round(ran.seconds, 1)}
    if out.is_file():
        body = json.loads(out.read_text())
        fig["meta"] = body.get("meta")
        fig["sim"] = body.get("figures", {}).get("sim")
    ev.figures["b"] = fig
    ev.save()


# -- (c) tier 1 of the paper's grid --------------------------------------------------------------------
def item_c(ev: Evidence, clock: Clock, prof: Profile, launch: Path, env: dict[str, str]) -> None:
    rows: list[dict[str, Any]] = ev.figures.setdefault("c", {}).setdefault("runs", [])
    extra = [a.format(launch=launch) for a in prof.reproduce]
    for algorithms, cap in RING16_PLAN:
        left = clock.left("c") - 20  # the report and the plot after the last run
        if left < 60 and not ev.dry:
            rows.append({"algorithms": algorithms, "status": "not started", "why": f"{left:.0f} s left"})
            continue
        out = ev.work / f"c-{algorithms.replace(',', '+')}"
        steps = max(1, round(cap * prof.max_steps_scale))
        argv = [
            sys.executable,
            "-m",
            "seedflood",
            "reproduce",
            "--device",
            prof.device,
            "--groups",
            "ring16",
            "--algorithms",
            algorithms,
            "--max-steps",
            str(steps),
            "--budget",
            f"{max(left, 6) / 60 / 1.1:.2f}",
            "--out",
            str(out),
            "--results-md",
            str(out / "results.md"),
            *extra,
        ]
        ran = run(ev, "c-reproduce", argv, left, env)
        rows.extend(reproduce_rows(out, ran, algorithms))
        ev.save()
    normalise(rows)
    ev.save()


# -- the command -----------------------------------------------------------------------------------
def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "gpu-evidence",
        help="run the GPU evidence plan against a clock (docs: launch/gpu/)",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--out", required=True, help="the output folder (at most 8 files)")
    p.add_argument("--work", default=None, help="run directories and full logs (default OUT/../gpu-evidence-work)")
    p.add_argument("--launch", default=None, help="the launch/ folder (default: $SEEDFLOOD_LAUNCH, else ./launch)")
    p.add_argument("--budget", default="540", help="time for the whole plan: seconds, or 9m, 0.15h (default 540)")
    p.add_argument("--only", default="a,b,c", help="comma-separated items to run (default a,b,c)")
    p.add_argument("--dry", action="store_true", help="CPU, tiny model, small sizes: the plan end to end in minutes")
    p.set_defaults(fn=main)
    return p


def meta(dry: bool, budget_s: float) -> dict[str, Any]:
    import platform

    import torch

    cuda = torch.cuda.is_available()
    info: dict[str, Any] = {
        "dry": dry,
        "budget_s": budget_s,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device_name": torch.cuda.get_device_name() if cuda else f"CPU ({os.cpu_count()} cores)",
        "tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    info["commit"] = commit()
    return info


def commit() -> str | None:
    """The commit the code came from: the staged kit's record, else the checkout's (git)."""
    staged = Path(os.environ.get("SEEDFLOOD_GPU_HOME") or "/nonexistent") / "staged.json"
    if staged.is_file():
        return json.loads(staged.read_text()).get("commit")
    r = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True)
    return r.stdout.strip() or None if r.returncode == 0 else None


def main(args: argparse.Namespace) -> int:
    """0: the plan ran (whatever it measured); 2: bad input or no CUDA device (one line)."""
    import torch

    items = [x.strip() for x in args.only.split(",") if x.strip()]
    if not items or any(x not in SHARES for x in items):
        print(f"seedflood: error: --only takes a comma-separated subset of a,b,c, got {args.only!r}", file=sys.stderr)
        return 2
    if not args.dry and not torch.cuda.is_available():
        print(
            "seedflood: error: gpu-evidence: no CUDA device is visible to torch here (--dry runs on the CPU)",
            file=sys.stderr,
        )
        return 2
    try:
        args.budget = budget.seconds(args.budget)
    except budget.BudgetError as e:
        print(f"seedflood: error: {e}", file=sys.stderr)
        return 2
    launch = Path(args.launch or os.environ.get("SEEDFLOOD_LAUNCH") or "launch").resolve()
    if not (launch / "torchrun.sh").is_file():
        print(
            f"seedflood: error: {launch} holds no torchrun.sh: pass --launch (a staged kit's launch/)", file=sys.stderr
        )
        return 2
    out = Path(args.out).resolve()
    work = Path(args.work).resolve() if args.work else out.parent / "gpu-evidence-work"
    if work.exists():
        shutil.rmtree(work)  # a new plan: run directories of an earlier one would be resumed
    work.mkdir(parents=True)
    out.mkdir(parents=True, exist_ok=True)
    prof = DRY if args.dry else GPU
    env = {**os.environ, "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
    ev = Evidence(out, work, args.dry, report)
    clock = Clock(args.budget, SHARES)
    ev.figures["meta"] = meta(args.dry, args.budget)
    staged = Path(os.environ.get("SEEDFLOOD_GPU_HOME") or "/nonexistent") / "staged.json"
    if staged.is_file():
        shutil.copy2(staged, out / "staged.json")
    for item in items:
        ev.say(LOGS[item], f"starting with {clock.left(item):.0f} s until its deadline")
        if item == "a":
            item_a(ev, clock, prof, launch, env)
        elif item == "b":
            item_b(ev, clock, prof, env)
        else:
            item_c(ev, clock, prof, launch, env)
        ev.figures["meta"]["spent_s"] = round(clock.spent(), 1)
        ev.save()
    try:
        plot(ev.figures, work, out / "evidence.png")
    except Exception as e:  # the figures are in evidence.json whatever the plot does
        print(f"gpu-evidence: no plot: {type(e).__name__}: {e}", file=sys.stderr)
    ev.figures["meta"]["spent_s"] = round(clock.spent(), 1)
    ev.save()
    print(report(ev.figures))
    print(f"gpu-evidence: wrote {', '.join(sorted(p.name for p in out.iterdir()))} to {out}")
    return 0
