"""Figure `sim` (`seedflood bench --only sim`): client-steps per second of the shared-model
simulation's estimates, sequential against batched (`sim.batched`), beside the batched floor.

Owns one benchmark. For each N (default 1, 16, 64, 128; `--sim-clients` overrides) it times the
part of a `seedflood simulate` step that is ~98% of its CPU: every client's K two-point
estimates on the shared model (`SharedModel.estimate`'s work), three ways, alternated within
each round so a burst of foreign load hits all three:
- sequential: for each client, `zo.two_point` on its batch (2·K forwards per client, in turn);
- batched: `batched.BatchedEstimator.estimate` (one forward over all 2·K·N perturbed batches,
  or `--sim-chunk` clients per forward);
- floor: one unperturbed grouped forward over the same 2·K·N batches
  (`BatchedEstimator.plain`): what the batched step would cost if perturbing were free.
Client-steps per second = N / step time. Reported beside them: speedup = sequential / batched,
batched / floor, and a step of N clients batched over one client's sequential step (two
forwards at K = 1; the goal on a GPU: ≤ 3× at N = 16). Each round uses a new step
(new batches and seeds); the state is never updated (estimates do not write the weights), so
every round measures the same model.

Every side encodes each client's batch of the round once inside its timing (Workload.batch
keeps one batch, shared by a client's ± forwards), as a simulate step does.

Sizes: the `step` figure's batch (16 examples, ≤ 64 tokens; rt on SmolLM2, synthetic on the tiny
model), zo.perturbations = 1, the config's direction (`--sim-direction`). A side whose
projected time (its warm-up call at this N × rounds) exceeds `--sim-budget` seconds is printed
as "skipped", never extrapolated. Nothing here asserts a timing.

Assumes: HF_HUB_OFFLINE=1; torch threads set by `seedflood bench --threads` (default 1).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

DEFAULT_CLIENTS = (1, 16, 64, 128)
QUICK_CLIENTS = (1, 4)


def _now() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _stats(xs: Sequence[float]) -> dict[str, float] | None:
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def tf32() -> bool:
    """Whether CUDA fp32 matrix products run as TF32 (torch's flag, or cuBLAS's override variable
    docs/results.md's GPU runs set)."""
    import os

    import torch

    return bool(torch.backends.cuda.matmul.allow_tf32) or os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") == "1"


def build(
    model: str, clients: int, direction: str = "subcge", chunk: int = 0, device: str = "cpu", extra: Sequence[str] = ()
):
    """(workload, protocol, BatchedEstimator) for `clients` clients of the step figure's size."""
    from seedflood.core.config import runconfig as config
    from seedflood.core.flood.protocol import Protocol
    from seedflood.ml.batched import BatchedEstimator
    from seedflood.ml.workload import Workload

    examples = max(1000, 16 * clients)  # every client keeps a full batch of 16
    if model == "tiny":
        task = ["task.name=synthetic", "model.tiny={hidden_size: 64, intermediate_size: 128}"]
    else:
        task = ["task.name=rt"]
    cfg = config.load(
        None,
        [
            f"model.name={model}",
            *task,
            f"task.train_examples={examples}",
            "task.dev_examples=0",
            "task.test_examples=8",
            "task.batch_size=16",
            "task.max_tokens=64",
            "topology.kind=complete",
            f"topology.nodes={clients}",
            f"zo.direction={direction}",
            "zo.lr=1e-3",
            "sim.batched=true",
            f"sim.clients_per_forward={chunk}",
            f"model.device={device}",
            *extra,
        ],
    )
    w = Workload.build(cfg)
    protocol = Protocol.of(cfg, 1)
    est = BatchedEstimator(w.model, w.direction, protocol, cfg.sim)
    return w, protocol, est


def fig_sim(
    model: str,
    clients: Sequence[int],
    rounds: int = 3,
    budget_s: float = 120.0,
    direction: str = "subcge",
    chunk: int = 0,
    device: str = "cpu",
    out=None,
) -> dict[str, Any]:
    """Measure every N in `clients` (see the module docstring); returns JSON-friendly results."""
    import torch

    from seedflood.core.zo import estimate as zo

    results: dict[str, Any] = {
        "model": model,
        "direction": direction,
        "rounds": rounds,
        "budget_s": budget_s,
        "chunk": chunk,
        "device": device,
        "tf32": tf32(),
        "threads": torch.get_num_threads(),
        "per_n": [],
    }
    one_client: dict[str, float] = {}  # clock suffix -> sequential step time at N = 1 (median)
    for n in clients:
        w, p, est = build(model, n, direction, chunk, device)
        sync = torch.cuda.synchronize if w.model.device.type == "cuda" else (lambda: None)
        if est.fallback:
            results["per_n"].append({"n": n, "fallback": est.fallback})
            continue
        nodes = list(range(n))

        def sequential(t: int) -> None:
            for node in nodes:
                for k in range(p.perturbations):
                    zo.two_point(lambda: w.loss(node, t), w.direction, p.seed(node, t, k), t, p.eps)  # noqa: B023

        def batched(t: int) -> None:
            est.estimate(t, nodes, w.batch)

        def floor(t: int) -> None:
            batches = [w.batch(node, t) for node in nodes for _ in range(2 * p.perturbations)]
            est.plain(batches)

        # Warm-up (allocations, basis, first-touch) on a step outside the timed ones; it also
        # gives the projections the budget rule needs.
        warm = {}
        for name, fn in (("sequential", sequential), ("batched", batched), ("floor", floor)):
            sync()
            w0, _ = _now()
            fn(10_000)
            sync()
            warm[name] = time.perf_counter() - w0
        times: dict[str, list[float]] = {k: [] for k in warm}
        cpu: dict[str, list[float]] = {k: [] for k in warm}
        skip = {k for k, s in warm.items() if s * rounds > budget_s}
        for r in range(rounds):
            for name, fn in (("sequential", sequential), ("batched", batched), ("floor", floor)):
                if name in skip:
                    continue
                sync()
                w0, c0 = _now()
                fn(r)
                sync()
                w1, c1 = _now()
                times[name].append(w1 - w0)
                cpu[name].append(c1 - c0)
        row: dict[str, Any] = {"n": n, "skipped": sorted(skip)}
        for clock, data in (("", times), ("_cpu", cpu)):
            for name in warm:
                st = _stats(data[name])
                row[f"{name}{clock}_s"] = st
                row[f"{name}{clock}_client_steps_per_s"] = n / st["median"] if st else None
            seq, bat, flo = (row[f"{k}{clock}_s"] for k in ("sequential", "batched", "floor"))
            if n == 1 and seq:
                one_client[clock] = seq["median"]
            one = one_client.get(clock)
            row[f"speedup{clock}"] = seq["median"] / bat["median"] if seq and bat else None
            row[f"batched_over_floor{clock}"] = bat["median"] / flo["median"] if bat and flo else None
            row[f"batched_over_one_client{clock}"] = bat["median"] / one if bat and one else None
        results["per_n"].append(row)
    if out is not None:
        print_sim(results, out)
    return results


def _t(s: dict[str, float] | None) -> str:
    if s is None:
        return "skipped"
    ms = s["median"] * 1e3
    return f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"


def _r(x: float | None, fmt: str = "{:.1f}") -> str:
    return "skipped" if x is None else fmt.format(x)


def print_sim(res: dict[str, Any], out) -> None:
    """Two tables, wall clock and this process's CPU time (foreign load hardly moves the latter)."""
    from seedflood.bench.common import table

    for clock, what in (("", "wall clock"), ("_cpu", "CPU time of this process")):
        rows = []
        for e in res["per_n"]:
            if "fallback" in e:
                rows.append([e["n"], "fallback: " + e["fallback"]] + [""] * 8)
                continue
            rows.append(
                [
                    e["n"],
                    _t(e[f"sequential{clock}_s"]),
                    _t(e[f"batched{clock}_s"]),
                    _t(e[f"floor{clock}_s"]),
                    _r(e[f"sequential{clock}_client_steps_per_s"]),
                    _r(e[f"batched{clock}_client_steps_per_s"]),
                    _r(e[f"floor{clock}_client_steps_per_s"]),
                    _r(e[f"speedup{clock}"], "{:.2f}x"),
                    _r(e[f"batched_over_floor{clock}"], "{:.2f}x"),
                    _r(e[f"batched_over_one_client{clock}"], "{:.2f}x"),
                ]
            )
        table(
            out,
            f"sim ({what}): client-steps per second of simulate's estimates, {res['model']}, {res['direction']}, "
            f"{res['device']}" + (" (TF32 matmuls)" if res["tf32"] else ""),
            [
                "N",
                "seq step",
                "batched step",
                "floor",
                "seq cl-steps/s",
                "batched cl-steps/s",
                "floor cl-steps/s",
                "speedup",
                "batched/floor",
                "batched/(1 client)",
            ],
            rows,
            [
                "step = every client's K=1 two-point estimate (2 forwards each); medians of "
                f"{res['rounds']} alternated rounds, {res['threads']} torch thread(s)",
                "floor = one unperturbed forward over the same 2N batches stacked (batching's cost if "
                "perturbing were free)",
                "batched/(1 client) = batched N-client step / sequential 1-client step (two forwards); "
                "GPU goal: <= 3x at N = 16",
                f"a side whose projected time exceeds {res['budget_s']:.0f} s is skipped, not extrapolated",
            ]
            if not clock
            else [],
        )
