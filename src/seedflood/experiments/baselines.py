"""The paper's baselines as algorithms of this runtime: dzsgd, dsgd, choco, diloco, mezo, and the
LoRA variants dzsgd-lora, dsgd-lora, choco-lora.

Owns `run(cfg, progress) -> summary` (writes the run directory: config.yaml, metrics.jsonl,
summary.json, the contract `seedflood compare` reads) and `train(cfg, progress) -> Result` (the
same, plus the client vectors, for tests). The update rules, the shared model's flat client
vectors and the local steps live in baselines_core.py (its docstring defines each algorithm).
Every client's tensors travel as `tensorwire` frames through real `Transport` endpoints
(`memory.InMemoryNetwork`, one thread per node for each hop), so bytes are counted by the same
`ByteCounter` rule as SeedFlood's messages: HEADER + frame per directed edge, at the sender, at
the step the exchange belongs to. `frame_bytes` is that frame's size, analytically. With
`algorithm.wire: counted` (dzsgd, dsgd and their -lora variants) a mixing round reads the
neighbours' vectors in place and counts each directed edge that same HEADER + DENSE frame (on
the CPU the same bits and bytes as over frames, `test_baselines.py`; faster where a frame's
encode and decode dominate, as for a 135M model on a GPU host).

lr = algorithm.lr, or DEFAULT_LR[name] when it is 0. With algorithm.lr = zo.lr, mezo is
SeedFlood's one-client Gaussian run.

A `-lora` algorithm (LORA) is its base algorithm's update rule on a smaller vector: lora.inject
adds adapters (rank algorithm.lora_rank, scale lora_alpha / rank, on the lora_targets modules)
to the one shared model, whose base weights stay frozen and are the same for every client, and
each client's vector is its adapters alone (MeZO's z, the gradient, the mixing, the top-k and
the frames all cover only them). Bytes are counted exactly as for the full-parameter variant:
a DENSE (dsgd, dzsgd) or TOPK (choco) frame of the adapter vector per directed edge.

Scoring (eval.every, step 0 and the end) is of the average model x̄ = (1/N) Σ x_i (diloco: the
global θ), with the evaluator's record fields (workload.evaluate: test, dev-tuned threshold) plus
`consensus_distance` = mean_i ‖x_i − x̄‖₂ over the flat trainable vector (and relative to ‖x̄‖₂)
and `train_loss` (mean loss of the clients' batches since the previous record). At the end every
client is scored on test (`worst_accuracy`, `worst_node`).

Assumes: model.dtype float32 (client vectors are fp32 views); one process; no resume (a run
starts its metrics afresh).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from seedflood.comm.memory import InMemoryNetwork
from seedflood.core.config import runconfig as config_mod
from seedflood.core.config.configerror import ConfigError
from seedflood.core.config.runconfig import Config
from seedflood.core.flood.transport import HEADER, ByteCounter
from seedflood.core.topology import resolve as topo
from seedflood.core.zo.directions import Gaussian, select_trainable
from seedflood.experiments import gossip, tensorwire
from seedflood.experiments.baselines_core import Algorithm, Choco, Ctx, Flat, Gossip, Mezo
from seedflood.experiments.diloco import DiLoCo
from seedflood.ml import lora
from seedflood.ml.workload import Workload
from seedflood.rundir.atomic import atomic_write_text
from seedflood.rundir.layout import RunDir
from seedflood.rundir.metrics import (
    MetricsWriter,
    PhaseProgress,
    Progress,
    human_bytes,
    truncate_metrics,
)
from seedflood.rundir.summary import RunSummary
from seedflood.rundir.trackers import open_trackers

log = logging.getLogger(__name__)

DEFAULT_LR: dict[str, float] = {
    "dzsgd": 1e-5,  # MeZO full-parameter on SmolLM2/rt: 1e-5 reached 68.6% in 230 steps, 1e-6 barely moved
    "mezo": 1e-5,
    "dsgd": 1e-3,  # plain SGD, batch 16, 135M LM, 2-way classification loss
    "choco": 1e-3,
    "diloco": 1e-5,  # inner AdamW (fine-tuning scale)
    # The LoRA defaults are not tuned (docs/results.md §6): dzsgd-lora takes the top of MeZO's LoRA
    # grid {1e-5, 5e-5, 1e-4}; dsgd-lora 1e-2 (plain SGD; B = 0 at the start, so A gets no gradient
    # in the first step) moved SmolLM2/rt's test loss only 0.528 -> 0.521 in 5 steps on 8 clients.
    "dzsgd-lora": 1e-4,
    "dsgd-lora": 1e-2,
    "choco-lora": 1e-2,
}
ALGORITHMS = tuple(DEFAULT_LR)
LORA = ("dzsgd-lora", "dsgd-lora", "choco-lora")
GOSSIP = ("dzsgd", "dsgd", "choco", *LORA)
ALGORITHM_CLASSES: dict[str, type[Algorithm]] = {
    "dzsgd": Gossip,
    "dsgd": Gossip,
    "choco": Choco,
    "diloco": DiLoCo,
    "mezo": Mezo,
    "dzsgd-lora": Gossip,
    "dsgd-lora": Gossip,
    "choco-lora": Choco,
}


def base_name(name: str) -> str:
    """The update rule an algorithm runs: 'dsgd-lora' -> 'dsgd'."""
    return name.removesuffix("-lora")


# --- frames per step (analytic) -------------------------------------------------------------------


def frame_bytes(cfg: Config, numel: int, segments: int) -> int:
    """Bytes of one algorithm frame (without the transport's HEADER): what one edge carries per
    communication for gossip, per origin's frame for diloco; 0 for mezo."""
    name, a = base_name(cfg.algorithm.name), cfg.algorithm
    if name in ("dzsgd", "dsgd"):
        return tensorwire.size("dense", numel)
    if name == "choco":
        return tensorwire.size("topk", numel, tensorwire.topk_count(numel, a.topk))
    if name == "diloco":
        return tensorwire.size("int8", numel, segments) if a.compress == "int8" else tensorwire.size("dense", numel)
    return 0


# --- the run --------------------------------------------------------------------------------------


@dataclass
class Result:
    summary: RunSummary
    ctx: Ctx = field(repr=False)
    algorithm: Algorithm = field(repr=False)
    x0: torch.Tensor = field(repr=False)


def _workload(cfg: Config) -> tuple[Workload, Gaussian]:
    """The run's workload (model, splits, shards, batches: as SeedFlood's clients build it) with a
    Gaussian direction over the trainable parameters (the MeZO step), whatever zo.direction says:
    the zo.trainable matrices, or for a -lora algorithm the adapters lora.inject adds."""
    w = Workload.build(cfg)
    a = cfg.algorithm
    if a.name in LORA:
        names = lora.inject(w.model, a.lora_rank, a.lora_alpha, a.lora_targets, cfg.run.seed)
    else:
        names = select_trainable(w.model, cfg.zo.trainable)
    w.direction = Gaussian(w.model, names, cfg.run.seed)
    return w, w.direction


def check(cfg: Config) -> None:
    """Refuse what the baselines do not do, in one ConfigError line each."""
    a = cfg.algorithm
    if a.name not in ALGORITHMS:
        raise ConfigError(
            f"algorithm.name: {a.name} is not a baseline (seedflood runs through seedflood.roles.sharedmodel)"
        )
    if cfg.model.dtype != "float32":
        raise ConfigError("model.dtype: the baselines keep fp32 client vectors; use model.dtype=float32")
    if a.wire == "counted" and base_name(a.name) not in ("dzsgd", "dsgd"):
        raise ConfigError(f"algorithm.wire: counted is for dzsgd and dsgd (and their -lora variants), not {a.name}")


def train(cfg: Config, progress: bool = True) -> Result:
    """Run the baseline `cfg.algorithm.name`, write the run directory, return everything."""
    check(cfg)
    name = cfg.algorithm.name
    lr = cfg.algorithm.lr or DEFAULT_LR[name]
    t_start = time.monotonic()
    if name == "mezo":  # one client over the whole train split: a one-node workload
        wcfg = dataclasses.replace(
            cfg,
            topology=dataclasses.replace(cfg.topology, kind="complete", nodes=1),
            eval=dataclasses.replace(cfg.eval, attach=0),
        )
        top = None
    else:
        wcfg = cfg
        top = topo.build(cfg.topology)
        topo.check_nodes(top, cfg.topology.nodes)
    w, direction = _workload(wcfg)
    flat = Flat(w.model, direction.names)
    x0 = flat.flat()
    ctx = Ctx(cfg, name, w, flat, direction, top, lr)
    network = None
    if top is not None:
        network = InMemoryNetwork({i: top.neighbors(i) for i in top.nodes}, timeout_s=cfg.transport.timeout_s)
        ctx.endpoints = [network.endpoint(i) for i in top.nodes]
        ctx.pool = ThreadPoolExecutor(max_workers=top.n, thread_name_prefix="hop")
    algo = ALGORITHM_CLASSES[name](ctx, x0)
    seg = len(flat.sizes)
    per_frame = frame_bytes(cfg, flat.numel, seg)
    log.info(
        "%s: %d clients, %d trainable scalars%s, lr %g, %s per frame",
        name,
        ctx.n,
        flat.numel,
        f" (LoRA r={cfg.algorithm.lora_rank} on {','.join(cfg.algorithm.lora_targets)})" if name in LORA else "",
        lr,
        human_bytes(per_frame),
    )

    out = RunDir.of(cfg)
    out.root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out.config, config_mod.dump(cfg))
    truncate_metrics(out.metrics, -1)  # no resume: a fresh history
    sinks = open_trackers(
        cfg.eval.trackers, out.root, cfg.to_dict(), resume=False
    )  # eval.trackers, as a SeedFlood run's
    writer = MetricsWriter(out.metrics, tensorboard=out.tensorboard, trackers=sinks)
    bar = Progress(cfg.run.steps, enabled=progress)
    bar.bar.set_description(name)
    edges = 2 * len(top.edges) if top is not None else 0
    steps, every = cfg.run.steps, cfg.eval.every
    t0 = time.monotonic()

    def score(step: int, **extra: Any) -> dict[str, Any]:
        t = time.monotonic()
        xs = algo.clients()
        xbar = algo.average()
        dist, rel = (0.0, 0.0) if algo.identical else gossip.consensus_distance(xs, xbar)
        flat.bind(xbar)
        with PhaseProgress(f"scoring step {step}", enabled=progress) as phase:
            m = w.scores(on_examples=phase.update)
        losses, ctx.train_losses[:] = list(ctx.train_losses), []
        sent = ctx.counter().per_step_total(include_evaluator=False) if top is not None else {}
        record = {
            "step": step,
            **m,
            "train_loss": sum(losses) / len(losses) if losses else None,
            "consensus_distance": dist,
            "consensus_distance_rel": rel,
            "bytes_per_edge": sum(sent.values()) / edges if edges else 0.0,
            "eval_seconds": round(time.monotonic() - t, 2),
            "elapsed_seconds": round(time.monotonic() - t0, 2),
            **algo.extra(),
            **extra,
        }
        writer.write(record)
        auc = "n/a" if m["auc"] is None else f"{m['auc']:.3f}"
        bar.write(
            f"{name} step {step:5d}: test acc {m['accuracy']:.3f}, loss {m['loss']:.4f}, AUC {auc}, "
            f"consensus distance {dist:.3g} ({rel:.2g} of |x̄|)"
        )
        bar.show(eval_step=step, acc=m["accuracy"])
        return record

    try:
        zero_shot = score(0, zero_shot=True)
        t = 0
        while t < steps:
            nxt = algo.advance(t)
            bar.advance_to(nxt)
            if every and nxt // every > t // every and nxt < steps:
                score(nxt)
            t = nxt
        algo.finish(steps - 1)
        bar.close()
        worst: dict[str, Any] = {}
        if not algo.identical:  # every client on test: the worst one
            accs = []
            clients = algo.clients()
            with PhaseProgress("scoring every client on test", unit="client", enabled=progress) as phase:
                for i, x in enumerate(clients):
                    flat.bind(x)
                    accs.append(w.evaluate("test")["metrics"]["accuracy"])
                    phase.update(i + 1, len(clients))
            node = min(range(len(accs)), key=accs.__getitem__)
            worst = {"worst_accuracy": accs[node], "worst_node": node, "client_accuracies": accs}
        final = score(steps, final=True, **{k: v for k, v in worst.items() if k != "client_accuracies"})
    finally:
        writer.close()
        bar.close()
        if ctx.pool is not None:
            ctx.pool.shutdown()
        for e in ctx.endpoints:
            e.close()

    counter = ctx.counter() if top is not None else ByteCounter()
    per_step = counter.per_step_total(include_evaluator=False)
    cumulative, total = [], 0
    for s in range(steps):
        total += per_step.get(s, 0)
        if s == steps - 1:  # anything counted after the last step (a drain) belongs to the end
            total += sum(v for k, v in per_step.items() if k >= steps)
        cumulative.append(total / edges if edges else 0.0)
    summary = RunSummary(
        algorithm=name,
        steps=steps,
        clients=ctx.n,
        topology=cfg.topology.kind if top is not None else "single",
        final=final,
        zero_shot=zero_shot,
        bytes_total=counter.total(),
        bytes_per_edge_run=cumulative[-1],
        bytes_per_edge_cumulative=cumulative,
        wall_seconds=round(time.monotonic() - t_start, 2),
        consensus_distance=final["consensus_distance"],
        bit_identical=(final["consensus_distance"] == 0.0) if name in GOSSIP else None,
        details={  # a baseline's own keys
            "directed_edges": edges,
            "frame_bytes": per_frame,
            "header_bytes": HEADER,
            "trainable_params": flat.numel,
            "lora": (
                {
                    "rank": cfg.algorithm.lora_rank,
                    "alpha": cfg.algorithm.lora_alpha,
                    "targets": cfg.algorithm.lora_targets,
                }
                if name in LORA
                else None
            ),
            "lr": lr,
            "consensus_distance_rel": final["consensus_distance_rel"],
            "worst_accuracy": worst.get("worst_accuracy", final["accuracy"]),
            "worst_node": worst.get("worst_node"),
            "client_accuracies": worst.get("client_accuracies"),
            "transport": "memory",
        },
    )
    summary.write(out)
    return Result(summary, ctx, algo, x0)


def run(cfg: Config, progress: bool = True) -> RunSummary:
    """Run the baseline `cfg.algorithm.name`; writes cfg.run.out_dir and returns its summary.json."""
    return train(cfg, progress).summary
