"""`seedflood bench --only load`: the anonymous memory a fresh process gains while model.load
loads its model, against the model's bytes (issue 43 item 6: goal <= GOAL x).

Owns: `fig_load`, which runs bench/load_worker.py in a fresh interpreter per repeat and prints one
row per repeat (and the medians): the model's parameter bytes, the bytes of them that lie in a
private map of the weights file, the growth of Anonymous memory across the load alone (after the
imports to the end) and its sampled peak, the growth with the imports counted (after torch to
the end), and both growths / the model's bytes. The imports are a fixed cost of the libraries
(about 110 MB for SmolLM2's transformers classes and what torch imports on a first meta-device
build), whatever the model's size: printed beside the load, not hidden.

`--quick` loads a tiny model (QUICK_TINY: about 38 MB) saved into a temporary directory; the
default is `--model` (SmolLM2, its GGUF converted first so that no conversion is measured).

Assumes: Linux (/proc/self/smaps_rollup), HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from seedflood.bench.common import Options, table

GOAL = 0.2  # Anonymous growth across the load / model bytes (issue 43)
QUICK_TINY = {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4}  # ~38 MB in float32
MB = 1e6


def _prepare(model: str, tmp: Path) -> str:
    """The model name the workers load: a GGUF source converted now, the tiny one (QUICK_TINY)
    saved to `tmp`."""
    from seedflood.core.config.trainsections import ModelConfig
    from seedflood.ml import model as M
    from seedflood.ml import sources

    if model == "tiny":
        loaded = M.load(ModelConfig(name="tiny", tiny=QUICK_TINY))
        M.save(loaded, tmp)
        return str(tmp)
    src = sources.source(ModelConfig(name=model))
    if src.kind == "gguf":
        sources.gguf_dir(Path(src.where))
    return model


def _run_worker(model: str, device: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "seedflood.bench.load_worker", model, device]
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode:
        raise RuntimeError(f"load worker failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def growth(run: dict[str, Any]) -> dict[str, Any]:
    """One worker's figures: bytes gained across the load alone (end - imports), its peak, with
    the imports (end - torch), the imports themselves, and the two growths / model bytes."""
    p, model = run["points"], run["model_bytes"]
    load, with_imports = p["end"] - p["imports"], p["end"] - p["torch"]
    return {
        "model_bytes": model,
        "mapped_bytes": run["mapped_bytes"],
        "hash": run["hash"],
        "load_bytes": load,
        "load_peak_bytes": run["peak"] - p["imports"],
        "imports_bytes": p["imports"] - p["torch"],
        "with_imports_bytes": with_imports,
        "load_ratio": load / model,
        "with_imports_ratio": with_imports / model,
    }


def fig_load(opts: Options, device: str = "cpu") -> dict[str, Any]:
    """`opts.repeats("load")` fresh interpreters, one load each; printed and returned."""
    with tempfile.TemporaryDirectory(prefix="seedflood-load-") as tmp:
        model = _prepare(opts.model, Path(tmp))
        runs = [growth(_run_worker(model, device)) for _ in range(opts.repeats("load"))]
    median = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "hash"}
    fig = {"model": opts.model, "device": device, "goal": GOAL, "runs": runs, "median": median}
    print_load(fig, opts.out)
    return fig


def print_load(fig: dict[str, Any], out: Any) -> None:
    def row(label: str, s: dict[str, Any]) -> list[str]:
        return [
            label,
            f"{s['model_bytes'] / MB:.1f}",
            f"{s['mapped_bytes'] / MB:.1f}",
            f"{s['load_bytes'] / MB:+.1f}",
            f"{s['load_peak_bytes'] / MB:+.1f}",
            f"{s['load_ratio']:.3f}",
            f"{s['imports_bytes'] / MB:+.1f}",
            f"{s['with_imports_bytes'] / MB:+.1f}",
            f"{s['with_imports_ratio']:.3f}",
        ]

    rows = [row(str(i + 1), r) for i, r in enumerate(fig["runs"])] + [row("median", fig["median"])]
    hashes = {r["hash"] for r in fig["runs"]}
    table(
        out,
        f"load: Anonymous memory gained loading {fig['model']} on {fig['device']} (MB, fresh process per repeat)",
        ["repeat", "model", "in map", "load", "load peak", "load/model", "imports", "load+imports", "(+imp)/model"],
        rows,
        [
            f"goal (issue 43): load/model <= {fig['goal']}; 'in map': parameter bytes inside a private map",
            "of the weights file (by address); 'load' = end - after the imports, 'load+imports' = end -",
            "after torch; peak sampled every 5 ms; weights hash "
            + (next(iter(hashes))[:12] if len(hashes) == 1 else "DIFFERS BETWEEN REPEATS"),
        ],
    )
