"""How far honest scalars differ across kinds of CPU (`python -m seedflood.bench.auditkinds`).

Measures what `trust.audit_tolerance` must cover (docs/trust.md, Mixed hardware): the same
scalars recomputed by processes that differ only in their kind — torch's vector kernels
(`ATEN_CPU_CAPABILITY`: default = none, avx2, avx512 where the CPU has it) and the torch thread
count (1 or 2) — side by side in one run. Each kind is one subprocess (`--worker`) that builds the
config's workload and, for steps 0..--steps−1, computes every origin's K scalars of step s through
`zo.two_point` (the estimator's code path: L+, L− and the f32 scalar), then applies step s's
messages. The first kind's base weights and scalars are what every kind loads and applies, so all
recompute on the same state (applying is kind-independent: each worker's final state hash is
printed to show it; "base built" says whether the kind built the same base itself — a random tiny
model's init is not the same under ATEN_CPU_CAPABILITY=default).

Printed, per kind against the first and over every pair of kinds: scalars bit-equal, the largest
|Δ scalar| and |Δ (L+ − L−)| (the loss difference, in nats), and that in f32 ulps of the loss.
The tolerance is set on the loss difference (scalar tolerance = it / 2ε): `--margin` × the
largest pair difference is printed as a suggestion. Nothing is asserted.

    HF_HUB_OFFLINE=1 .venv/bin/python -m seedflood.bench.auditkinds [--config launch/configs/debug.yaml]
        [--steps 5] [--clients 4] [--margin 10] [--kinds native,default,...] [--set KEY=VALUE ...]

Assumes: run from the repository root (or --config); a kind the CPU lacks is skipped (torch then
falls back to a lower capability: the worker reports the one it used).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

DEBUG = Path("launch/configs/debug.yaml")
# name -> (environment, torch threads). avx2 is set the way the mixed run set it.
KINDS: dict[str, tuple[dict[str, str], int]] = {
    "native": ({}, 1),
    "2 threads": ({}, 2),
    "avx512": ({"ATEN_CPU_CAPABILITY": "avx512"}, 1),
    "avx2": ({"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, 1),
    "default": ({"ATEN_CPU_CAPABILITY": "default"}, 1),
}
_NEEDS = {"avx512": "avx512f", "avx2": "avx2"}  # /proc/cpuinfo flag a kind needs


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}


def worker(
    config: Path, sets: list[str], steps: int, threads: int, out: Path, reference: Path | None
) -> dict[str, Any]:
    """One kind: every origin's scalars of each step, on the state the reference's messages make."""
    import torch

    from seedflood.core.config import runconfig
    from seedflood.core.flood.protocol import Protocol
    from seedflood.core.topology.resolve import topology_of
    from seedflood.core.wire.message import Message
    from seedflood.core.zo import estimate as zo
    from seedflood.core.zo.replay import Applier, state_hash
    from seedflood.ml.workload import Workload

    cfg = runconfig.load(config, sets)
    p = Protocol.of(cfg, topology_of(cfg).diameter)
    w = Workload.build(cfg)
    torch.set_num_threads(threads)  # after the build, which sets run.threads
    built = state_hash(w.model, w.direction)[:16]
    base = reference.with_suffix(".pt") if reference else out.with_suffix(".pt")
    if reference is None:
        torch.save(w.model.state_dict(), base)
    else:  # the reference's base: a random tiny model's init is drawn by kind-dependent kernels
        w.model.load_state_dict(torch.load(base))
    ref = json.loads(reference.read_text())["rows"] if reference else None
    applier = Applier(w.direction, p)
    rows: list[list[float]] = []  # [step, origin, k, L+, L-, f32 scalar]
    for s in range(steps):
        own: list[Message] = []
        for o in range(p.n_origins):
            for k in range(p.perturbations):
                losses: list[float] = []

                def loss(o: int = o, s: int = s, losses: list[float] = losses) -> float:
                    losses.append(w.loss(o, s))
                    return losses[-1]

                seed = p.seed(o, s, k)
                m = Message.make(o, s, seed, zo.two_point(loss, w.direction, seed, s, p.eps), k)
                rows.append([s, o, k, losses[0], losses[1], m.scalar])
                own.append(m)
        if ref is not None:  # apply the reference kind's scalars: every kind estimates on one state
            own = [
                Message.make(int(o), s, p.seed(int(o), s, int(k)), x, int(k)) for s_, o, k, _, _, x in ref if s_ == s
            ]
        applier.apply(s, own)
    return {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "eps": p.eps,
        "rows": rows,
        "built": built,
        "hash": state_hash(w.model, w.direction)[:16],
    }


def _run_kind(name: str, a: argparse.Namespace, reference: Path | None, tmp: Path) -> dict[str, Any]:
    env_extra, threads = KINDS[name]
    out = tmp / f"{name.replace(' ', '_')}.json"
    argv = [sys.executable, "-m", "seedflood.bench.auditkinds", "--worker", str(out), "--threads", str(threads)]
    argv += ["--config", str(a.config), "--steps", str(a.steps), "--clients", str(a.clients)]
    argv += [x for s in a.set for x in ("--set", s)]
    if reference is not None:
        argv += ["--reference", str(reference)]
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")}
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    r = subprocess.run(argv, env={**env, **env_extra}, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"kind {name!r} failed:\n{r.stderr[-3000:]}")
    got: dict[str, Any] = json.loads(out.read_text())
    got["file"] = out
    return got


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """Bit-equal scalars, largest |Δ scalar|, |Δ (L+ − L−)| and that in f32 ulps of the loss."""
    x, y = np.array(a["rows"], dtype=np.float64), np.array(b["rows"], dtype=np.float64)
    assert (x[:, :3] == y[:, :3]).all(), "workers disagree on which scalars they computed"
    dl = np.abs((x[:, 3] - x[:, 4]) - (y[:, 3] - y[:, 4]))
    ulp = np.spacing(np.abs(x[:, 3:5]).max(axis=1).astype(np.float32)).astype(np.float64)
    return {
        "equal": int((x[:, 5] == y[:, 5]).sum()),
        "n": len(x),
        "scalar": float(np.abs(x[:, 5] - y[:, 5]).max()),
        "loss_diff": float(dl.max()),
        "ulps": float((dl / ulp).max()),
        "largest_scalar": float(np.abs(x[:, 5]).max()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m seedflood.bench.auditkinds", description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=DEBUG)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--clients", type=int, default=4, help="topology.nodes: the origins whose scalars are computed")
    ap.add_argument("--margin", type=float, default=10.0)
    ap.add_argument("--kinds", default=",".join(KINDS), help="a comma-separated subset; the first is the reference")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--reference", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if not a.config.exists():
        print(
            f"seedflood.bench.auditkinds: error: no config at {a.config} (run from the repository root or pass --config)"
        )
        return 2
    if a.steps < 1 or a.clients < 1 or a.margin < 1:
        print("seedflood.bench.auditkinds: error: --steps >= 1, --clients >= 1, --margin >= 1")
        return 2
    sets = [f"topology.nodes={a.clients}", "topology.kind=ring" if a.clients > 2 else "topology.kind=complete", *a.set]
    if a.worker is not None:
        a.worker.write_text(json.dumps(worker(a.config, sets, a.steps, a.threads, a.worker, a.reference)))
        return 0
    from seedflood.core.config import runconfig
    from seedflood.core.config.configerror import ConfigError

    try:
        runconfig.load(a.config, sets)
    except ConfigError as e:
        print(f"seedflood.bench.auditkinds: error: {e}")
        return 2
    import tempfile

    asked = [k.strip() for k in a.kinds.split(",") if k.strip()]
    if not asked or any(k not in KINDS for k in asked):
        print(f"seedflood.bench.auditkinds: error: --kinds: a comma-separated subset of {', '.join(KINDS)}")
        return 2
    flags = cpu_flags()
    kinds = [k for k in asked if _NEEDS.get(k, "") in flags or k not in _NEEDS]
    skipped = [k for k in asked if k not in kinds]
    print(f"seedflood.bench.auditkinds: {a.config}, {a.clients} origins, {a.steps} steps, kinds: {', '.join(kinds)}")
    if skipped:
        print(f"  skipped (the CPU lacks them): {', '.join(skipped)}")
    got: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="auditkinds-") as tmp:
        for name in kinds:
            t0 = time.perf_counter()
            ref = got[kinds[0]]["file"] if got else None
            got[name] = _run_kind(name, a, ref, Path(tmp))
            g = got[name]
            print(f"  {name}: capability {g['capability']}, {g['threads']} thread(s), {time.perf_counter() - t0:.1f} s")
    eps = got[kinds[0]]["eps"]
    first = kinds[0]
    head = ["kind", "capability", "threads", "base built", "bit-equal", "max |Δ scalar|", "max |Δ(L+ − L−)|"]
    head += ["f32 ulps of L", "final hash"]
    rows = []
    for name in kinds:
        c = compare(got[first], got[name])
        g = got[name]
        rows.append(
            [
                name,
                str(g["capability"]),
                str(g["threads"]),
                "same" if g["built"] == got[first]["built"] else "other",
                f"{c['equal']}/{c['n']}",
                f"{c['scalar']:.3g}",
                f"{c['loss_diff']:.3g}",
                f"{c['ulps']:.1f}",
                g["hash"],
            ]
        )
    print()
    print(f"each kind against {first!r} (the same scalars, the same state; zo.eps {eps:g}):")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for r in rows:
        print("  ".join(x.rjust(w) for x, w in zip(r, widths)))
    pairs = [compare(got[x], got[y]) for x, y in itertools.combinations(kinds, 2)]
    worst = {k: max(p[k] for p in pairs) for k in ("scalar", "loss_diff", "ulps", "largest_scalar")} if pairs else {}
    if worst:
        tol = a.margin * worst["loss_diff"]
        print()
        print(
            f"over every pair of kinds: max |Δ scalar| {worst['scalar']:.3g} (largest |scalar| "
            f"{worst['largest_scalar']:.3g}), max |Δ(L+ − L−)| {worst['loss_diff']:.3g} nats "
            f"({worst['ulps']:.1f} f32 ulps of L)"
        )
        print(
            f"suggested trust.audit_tolerance ({a.margin:g} × that): {tol:.3g} nats, i.e. a scalar passes within "
            f"{tol / (2 * eps):.3g} of its recomputation at zo.eps {eps:g}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
