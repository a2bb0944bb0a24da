"""One process of a run: read the launcher's world, become the evaluator or a client, tear down.

Owns the composition of a process (DESIGN.md §2): world and topology checks before anything
expensive, the workload, the process group, resume (rank 0 reads the log and broadcasts it;
every client catches up by replaying it, the evaluator from its checkpoint plus the log tail),
the role's run, and the closing gather of every client's hash and byte counts into summary.json.

Assumes: every process gets the same config; the run directory is on storage rank 0 can write
(clients on other hosts need no access to it: they catch up from the broadcast log).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch.distributed as dist

from seedflood import checkpoint as ckpt
from seedflood import runtime
from seedflood import topology as topo
from seedflood.client import Client
from seedflood.config import Config
from seedflood.evaluator import Evaluator, restore
from seedflood.message import Message, decode, encode
from seedflood.metrics import human_bytes, setup_logging
from seedflood.replay import Applier, state_hash
from seedflood.transport import ByteCounter, EvaluatorInbox, GlooTransport
from seedflood.workload import Workload

log = logging.getLogger(__name__)


def topology_of(cfg: Config) -> topo.Topology:
    base = Path(cfg.source).parent if cfg.source else None
    top = topo.build(cfg.topology, base_dir=base)
    topo.check_nodes(top, cfg.topology.nodes)
    return top


def _resume_records(cfg: Config) -> list[tuple[int, list[Message]]]:
    """Rank 0: the logged steps to resume from (empty for a fresh run)."""
    path = Path(cfg.run.out_dir) / "log.bin"
    if not (cfg.checkpoint.resume and path.is_file()):
        return []
    _, records = ckpt.LogReader(path).read()
    return records[: cfg.run.steps]


def _broadcast_records(records: list[tuple[int, list[Message]]]) -> list[tuple[int, list[Message]]]:
    """Rank 0's resume log to every rank, as message frames (a few bytes per message)."""
    payload = [[(s, encode(m)) for s, m in records]] if dist.get_rank() == 0 else [None]
    dist.broadcast_object_list(payload, src=0)
    return [(s, decode(f)) for s, f in payload[0]]


def run(cfg: Config, environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Run this process's role to the end; rank 0 returns the summary."""
    world = runtime.World.from_env(environ if environ is not None else os.environ)
    top = topology_of(cfg)
    runtime.check_world(world, top.n)
    role = "eval" if world.is_evaluator else f"client {world.client_node}"
    setup_logging(cfg.run.log_level, role)
    workload = Workload.build(cfg)
    with runtime.process_group(world, cfg.transport):
        records = _broadcast_records(_resume_records(cfg) if world.is_evaluator else [])
        if world.is_evaluator:
            return _evaluate(cfg, top, world, workload, records)
        _client(cfg, top, world, workload, records)
        return None


def _client(cfg: Config, top: topo.Topology, world: runtime.World, w: Workload,
            records: list[tuple[int, list[Message]]]) -> None:
    node = world.client_node
    start = len(records)
    applier = Applier(w.direction, cfg.zo, cfg.run.steps, top.n)
    applier.apply_all(records)  # catch up: O(messages) for subcge, no checkpoint needed
    attach = node == cfg.eval.attach
    counter = ByteCounter()
    transport = GlooTransport(node, top.neighbors(node), topo.rank_of, counter,
                              evaluator_rank=0 if attach else None)
    step_hashes: list[str] = []
    with transport:
        client = Client(node, top.neighbors(node), top.n, top.diameter, cfg, w.direction,
                        lambda step: w.loss(node, step), transport)
        client.resume_at(start)
        if attach:
            client.listeners.append(lambda s, msgs: transport.push(encode(msgs)))
        if cfg.run.hash_steps:
            client.listeners.append(lambda s, _: step_hashes.append(state_hash(w.model, w.direction)))
        if start:
            log.info("resumed at step %d by replaying %d logged steps", start, start)
        client.run(start)
    result = {"node": node, "hash": state_hash(w.model, w.direction), "step_hashes": step_hashes,
              "bytes": counter.rows(), "flood": vars(client.flood.stats)}
    dist.gather_object(result, None, dst=0)


def _evaluate(cfg: Config, top: topo.Topology, world: runtime.World, w: Workload,
              records: list[tuple[int, list[Message]]]) -> dict[str, Any]:
    run_dir = Path(cfg.run.out_dir)
    start = restore(w, run_dir, records)
    inbox = EvaluatorInbox(topo.rank_of(cfg.eval.attach), cfg.eval.attach)
    evaluator = Evaluator(cfg, w, inbox, start_step=start, progress=True)
    try:
        final = evaluator.run()
    finally:
        evaluator.close()
        inbox.close()
    results: list[Any] = [None] * world.world_size
    dist.gather_object(None, results, dst=0)
    clients = sorted((r for r in results if r is not None), key=lambda r: r["node"])
    counter = ByteCounter.from_rows([row for r in clients for row in r["bytes"]])
    per_edge = {f"{a}->{b}": n for (a, b), n in sorted(counter.per_edge_total().items()) if b >= 0}
    summary = {
        "steps": cfg.run.steps,
        "clients": top.n,
        "topology": top.name,
        "diameter": top.diameter,
        "param_hash": final["param_hash"],
        "client_hashes": [r["hash"] for r in clients],
        "consensus": all(r["hash"] == final["param_hash"] for r in clients),
        "client_step_hashes": [r["step_hashes"] for r in clients] if cfg.run.hash_steps else None,
        "bytes_per_edge": per_edge,
        "bytes_per_edge_per_step": counter.mean_bytes_per_edge_per_step(),
        "bytes_total": counter.total(),
        "flood": [r["flood"] for r in clients],
        "zero_shot": evaluator.zero_shot or None,
        "final": final,
        "resumed_from_step": start,
        "model_dir": str(ckpt.latest(run_dir) / "hf") if cfg.checkpoint.hf_model else None,
        "log": str(run_dir / "log.bin"),
    }
    ckpt.atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=1, sort_keys=True))
    if not summary["consensus"]:
        log.error("clients disagree with the evaluator: %s vs %s", summary["client_hashes"], final["param_hash"])
    log.info("mean bytes per edge per step: %s", human_bytes(summary["bytes_per_edge_per_step"]))
    return summary
