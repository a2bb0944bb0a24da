"""One process of a run: read the launcher's world, become the evaluator or a client, tear down.

Owns the composition of a process (docs/design.md §2): world and topology checks before anything
expensive, the workload (run.threads = 0: the machine's cores split over the launcher's local
processes), the run's `Protocol`, the process group, resume (rank 0 checks the run
directory and broadcasts its log; every client catches up by replaying it, the evaluator from
its newest intact checkpoint plus the log tail), the role's run, and the end of the run: each
client posts its report (hash, byte counts, flood stats, threads, memory: RSS/PSS/USS) to the
rendezvous store and exits; the evaluator collects them once it has scored its backlog and writes summary.json. No collective
call waits on the evaluator, so finishing never depends on how long scoring takes.

Assumes: every process gets the same config; the run directory is on storage rank 0 can write
(clients on other hosts need no access to it: they catch up from the broadcast log).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from seedflood import checkpoint as ckpt
from seedflood import protocol as proto
from seedflood import rundir, runtime
from seedflood import topology as topo
from seedflood.client import Client
from seedflood.config import Config
from seedflood.evaluator import Evaluator, restore
from seedflood.gloo import EvaluatorInbox, GlooTransport
from seedflood.message import decode, encode
from seedflood.metrics import human_bytes, setup_logging
from seedflood.protocol import Protocol
from seedflood.replay import state_hash
from seedflood.rundir import Records
from seedflood.transport import ByteCounter
from seedflood.workload import Workload

log = logging.getLogger(__name__)


class RunError(RuntimeError):
    """Rank 0 refused the run directory; every rank exits with this one line (status 2)."""


def _client_key(node: int) -> str:
    return f"client-{node}"


def run(cfg: Config, environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Run this process's role to the end; rank 0 returns the summary."""
    started = time.monotonic()
    world = runtime.World.from_env(environ if environ is not None else os.environ)
    top = rundir.topology_of(cfg)
    runtime.check_world(world, top.n)
    protocol = Protocol.of(cfg, top.diameter)
    role = "eval" if world.is_evaluator else f"client {world.client_node}"
    setup_logging(cfg.run.log_level, role)
    workload = Workload.build(cfg, local_rank=world.local_rank, local_processes=world.local_world_size)
    if world.is_evaluator:
        log.info(
            "task %s, %s split, label counts per client:\n%s", cfg.task.name, cfg.task.split, workload.label_table()
        )
    with runtime.process_group(world, cfg.transport) as group:
        records = _resume(cfg, protocol, workload, group)
        if world.is_evaluator:
            return _evaluate(cfg, top, protocol, workload, group, records, started)
        _client(cfg, top, protocol, world.client_node, workload, group, records)
        return None


def _resume(cfg: Config, protocol: Protocol, w: Workload, group: runtime.Group) -> Records:
    """Rank 0 decides what the run continues from and tells every rank (or why it cannot)."""
    payload: dict[str, Any] | None = None
    if group.world.is_evaluator:
        trajectory = proto.trajectory(cfg, protocol, w.train_digest())
        try:
            records = rundir.resume_records(cfg, protocol, trajectory, w.loaded.base_hash)
            payload = {"records": [(s, encode(m)) for s, m in records]}
        except ckpt.CheckpointError as e:
            payload = {"error": str(e)}
    payload = group.broadcast(payload)
    if "error" in payload:
        raise RunError(payload["error"])
    records = [(s, decode(f, seed_of=protocol.seed)) for s, f in payload["records"]]
    for s, msgs in records:  # rank 0 validated them; a broadcast is a wire like any other
        protocol.check_step(s, msgs)
    return records


def _client(
    cfg: Config, top: topo.Topology, protocol: Protocol, node: int, w: Workload, group: runtime.Group, records: Records
) -> None:
    attach = node == cfg.eval.attach
    counter = ByteCounter()
    transport = GlooTransport(
        node, top.neighbors(node), proto.rank_of, counter, evaluator_rank=proto.EVALUATOR_RANK if attach else None
    )
    step_hashes: list[str] = []
    with transport:
        client = Client.in_topology(
            top, node, protocol, w.direction, lambda step: w.loss(node, step), transport, cfg.transport.timeout_s
        )
        client.resume(records)  # O(messages) for subcge, no checkpoint needed
        if attach:
            client.listeners.append(lambda s, msgs: transport.push(encode(msgs), s))
        if cfg.run.hash_steps:
            client.listeners.append(lambda s, _: step_hashes.append(state_hash(w.model, w.direction)))
        if records:
            log.info("resumed at step %d by replaying %d logged steps", len(records), len(records))
        client.run()
    group.post(
        _client_key(node),
        {
            "node": node,
            "hash": state_hash(w.model, w.direction),
            "step_hashes": step_hashes,
            "bytes": counter.rows(),
            "flood": vars(client.flood.stats),
            "threads": runtime.threads(),
            "memory": runtime.memory(),  # at the end of training: the weights' pages are as written as they get
        },
    )


def _evaluate(
    cfg: Config,
    top: topo.Topology,
    protocol: Protocol,
    w: Workload,
    group: runtime.Group,
    records: Records,
    started: float,
) -> dict[str, Any]:
    run_dir = Path(cfg.run.out_dir)
    start = restore(w, protocol, run_dir, records)
    header = rundir.log_header(
        cfg, proto.trajectory(cfg, protocol, w.train_digest()), w.loaded.identity, w.loaded.base_hash
    )
    inbox = EvaluatorInbox(proto.rank_of(cfg.eval.attach), cfg.eval.attach)
    evaluator = Evaluator(cfg, protocol, w, inbox, header, start_step=start, progress=True)
    try:
        final = evaluator.run()
    finally:
        evaluator.close()
        inbox.close()
    reports = group.collect([_client_key(n) for n in top.nodes])
    clients = [reports[_client_key(n)] for n in top.nodes]
    counter = ByteCounter.from_rows([row for r in clients for row in r["bytes"]])
    consensus = all(r["hash"] == final["param_hash"] for r in clients)
    summary = {
        **rundir.summary_common(cfg, top, protocol, counter, final, evaluator.zero_shot, start, started),
        "client_hashes": [r["hash"] for r in clients],
        "consensus": consensus,
        "client_step_hashes": [r["step_hashes"] for r in clients] if cfg.run.hash_steps else None,
        "flood": [r["flood"] for r in clients],
        "threads": [r["threads"] for r in clients],
        "memory": {"evaluator": runtime.memory(), "clients": [r["memory"] for r in clients]},
        "consensus_distance": 0.0 if consensus else None,  # bit-identical clients: no distance
        "bit_identical": consensus,
    }
    ckpt.atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=1, sort_keys=True))
    if not summary["consensus"]:
        log.error("clients disagree with the evaluator: %s vs %s", summary["client_hashes"], final["param_hash"])
    log.info("mean bytes per edge per step: %s", human_bytes(summary["bytes_per_edge_per_step"]))
    return summary
