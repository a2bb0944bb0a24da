"""What the figure programs share: options, timing and formatting helpers, the plain-text table
they print, a direction that costs nothing, and the reproducible messages they apply.

Timing rules (every figure follows them): shared, noisy machines. Every timed quantity is
repeated, reported as the median with its min–max spread, and quantities that are compared are
measured alternately in one run (a burst of load hits both). Wall time is `time.perf_counter`;
ratios are also given on this process's CPU time (`time.process_time`), which foreign load hardly
moves. Nothing is extrapolated: a size that would blow the time budget is printed as "skipped".

Assumes: offline use (HF_HUB_OFFLINE=1); 'smollm2-135m' is converted into the local cache on its
first load (~20 s, once).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

DEFAULT_MODEL = "smollm2-135m"
_TAG_BENCH = 0xBE4C  # domain tag of the benchmark's random scalars

# Two tiny widths for `bytes --quick` (and the small side of the default run).
TINY_SMALL = "model.tiny={hidden_size: 64, intermediate_size: 128}"
TINY_LARGE = "model.tiny={hidden_size: 128, intermediate_size: 256}"


# -- options and output ---------------------------------------------------------------------------
class Options:
    """What the command line chose; every figure reads only what it needs."""

    # Timed repeats per figure when --repeats is not given (sized for a run of a few minutes).
    DEFAULT_REPEATS = {"apply": 5, "step": 3, "catchup": 3, "goodput": 5, "hops": 5, "load": 2}

    def __init__(self, args: argparse.Namespace) -> None:
        self.quick: bool = args.quick
        self.model: str = args.model or ("tiny" if args.quick else DEFAULT_MODEL)
        self._repeats: int = args.repeats
        self.gaussian_budget_s: float = args.gaussian_budget
        self.sim_clients: list[int] | None = getattr(args, "sim_clients", None)
        self.sim_budget_s: float = getattr(args, "sim_budget", 120.0)
        self.sim_chunk: int = getattr(args, "sim_chunk", 0)
        self.sim_direction: str = getattr(args, "sim_direction", "subcge")
        self.sim_device: str = getattr(args, "sim_device", "cpu")
        self.goodput_steps: int = getattr(args, "goodput_steps", 0)
        self.goodput_graphs: list[str] | None = getattr(args, "goodput_graphs", None)
        self.load_device: str = getattr(args, "load_device", "cpu")
        self.out = sys.stdout

    def repeats(self, figure: str) -> int:
        if self._repeats:
            return self._repeats
        return 3 if self.quick else self.DEFAULT_REPEATS.get(figure, 3)

    @property
    def tiny(self) -> bool:
        return self.model == "tiny"

    def model_overrides(self) -> list[str]:
        return [f"model.name={self.model}"] + ([TINY_SMALL] if self.tiny else [])


def load_cfg(overrides: Sequence[str]):
    from seedflood.core.config import runconfig as config

    return config.load(None, list(overrides))


def stats(xs: Sequence[float]) -> dict[str, float]:
    """median, min, max and count of a list of seconds."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def fmt_stats(s: dict[str, float] | None) -> str:
    """'12.3 ms (11.9–13.0, ×5)' from stats, or 'skipped'."""
    if s is None:
        return "skipped"
    f = fmt_time
    return f"{f(s['median'])} ({f(s['min'])}–{f(s['max'])}, ×{s['n']})"


def fmt_time(seconds: float) -> str:
    ms = seconds * 1e3
    if ms < 1:
        return f"{ms:.3f} ms"
    if ms < 100:
        return f"{ms:.1f} ms"
    return f"{ms:.0f} ms"


@contextlib.contextmanager
def quiet_logs(level: int = logging.WARNING) -> Iterator[None]:
    """Hide the library's logs below `level` while measuring (restored afterwards; the caller's
    logging configuration is left alone)."""
    lg = logging.getLogger("seedflood")
    old = lg.level
    lg.setLevel(level)
    try:
        yield
    finally:
        lg.setLevel(old)


@contextlib.contextmanager
def keep_threads() -> Iterator[None]:
    """Restore torch's thread count (Workload.build may set it from run.threads; main sets it)."""
    n = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(n)


def scalars(n: int, key: int) -> np.ndarray:
    """n reproducible N(0, 1) scalars (what a message carries; values do not affect timing)."""
    from seedflood.core.config import rng

    return rng.generator(_TAG_BENCH, key).standard_normal(n)


def step_messages(step: int, n_origins: int, run_seed: int, key: int):
    from seedflood.core.config import rng
    from seedflood.core.wire.message import Message

    xs = scalars(n_origins, key * 1_000_003 + step)
    return [Message.make(o, step, rng.derive(run_seed, o, step, 0), float(xs[o])) for o in range(n_origins)]


def now() -> tuple[float, float]:
    """(wall, CPU of this process) in seconds. CPU time hardly moves when other processes take
    the cores away, so ratios are reported on both clocks."""
    return time.perf_counter(), time.process_time()


def ratio(a: dict[str, float] | None, b: dict[str, float] | None) -> float | None:
    return a["median"] / b["median"] if a and b and b["median"] > 0 else None


def fmt_ratio(r: float | None, digits: int = 0) -> str:
    return "skipped" if r is None else f"{r:.{digits}f}x"


def forward_workload(opts: Options, extra: Sequence[str] = ()):
    """(config, workload, timer): a workload whose `loss(0, step)` is one plain forward of the
    `step` figure's size (batch 16, 64 tokens; task rt, or synthetic on the tiny model), the config
    it was built from, and a timer of that forward."""
    from seedflood.ml.workload import Workload

    task = (
        ["task.name=synthetic", "task.train_examples=256", "task.dev_examples=0", "task.test_examples=8"]
        if opts.tiny
        else ["task.name=rt", "task.train_examples=1000", "task.dev_examples=0", "task.test_examples=8"]
    )
    cfg = load_cfg(
        opts.model_overrides() + task + ["task.batch_size=16", "task.max_tokens=64", "topology.nodes=1", *extra]
    )
    w = Workload.build(cfg)
    w.batch(0, 0)  # encoded once, outside every timing

    def forward() -> tuple[float, float]:
        """(wall, cpu) of one plain forward on the canonical state."""
        with w.direction.current():
            w0, c0 = now()
            w.loss(0, 0)
            w1, c1 = now()
        return w1 - w0, c1 - c0

    return cfg, w, forward


def table(
    out: Any, title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]], notes: Sequence[str] = ()
) -> None:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = "  ".join("-" * w for w in widths)
    print(f"\n== {title}", file=out)
    for i, r in enumerate(cells):
        print("  ".join(c.rjust(w) if i and j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))), file=out)
        if i == 0:
            print(line, file=out)
    for n in notes:
        print(f"   {n}", file=out)
    out.flush()


class NullDirection:
    """A direction that costs nothing: isolates the flood (codec, state machine, transport)."""

    def perturbed(self, seed: int, step: int, scale: float) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def accumulate(self, step: int, seed: int, coef: float) -> None:
        pass

    def commit(self, step: int) -> None:
        pass

    def apply_steps(self, steps: Sequence[Any]) -> None:
        pass

    def apply_arrays(self, steps: Any, bounds: Any, seeds: Any, coefs: Any) -> None:
        pass


def netns_unavailable(tools: Sequence[str], install: str) -> str | None:
    """Why this host cannot make network namespaces with `tools` (None: it can): root, the
    tools on PATH (`install` says how to get them), and a probe namespace made and deleted."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in tools:
        if shutil.which(tool) is None:
            return f"{tool} is missing ({install})"
    probe = f"sfprobe{os.getpid() % 100000}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


# -- the in-process figure programs (clip, speeds, membership, churn) -----------------------------
def add_run_args(ap: argparse.ArgumentParser, config: Path) -> None:
    """--set, --config (default `config`, relative to the working directory) and --out."""
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override (repeatable)")
    ap.add_argument("--config", type=Path, default=config, help=f"the config (default {config}, from the repo root)")
    ap.add_argument("--out", help="write every figure as JSON here")


@contextlib.contextmanager
def figure_process(ap: argparse.ArgumentParser, config: Path) -> Iterator[None]:
    """A figure program's process: a missing config refused in argparse's one line (exit 2)
    before anything is built, then one torch thread, no tokenizer threads, and the library's logs
    below ERROR hidden while measuring (restored on the way out)."""
    if not config.is_file():
        ap.error(f"config {config} not found: run from the repository root or pass --config")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(1)
    with quiet_logs(logging.ERROR):
        yield


def write_json(path: str | Path, data: Any) -> None:
    """`data` as indented JSON at `path`, replaced whole (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)


def train_loss(w: Any) -> float:
    """Mean loss of a workload's current model over its whole train split (every client's shard)."""
    from seedflood.ml import encoding, objective

    with torch.no_grad(), w.direction.current():
        batch = encoding.encode(w.splits.train, w.spec, w.loaded.tokenizer, w.task.max_tokens)
        return float(objective.loss(w.model, batch))
