"""N clients in one process: the reference the multi-process runtime is checked against.

Owns: running every client of a config through the real client loop (flooding, codec, replay)
over an in-memory transport, one thread per client, each with its own model copy. The result
holds each client's final hash, its per-step hashes, the complete steps in order (what the
evaluator would log) and the traffic counters. A run can be stopped after some steps and
resumed from the steps it logged, exactly as a relaunched run resumes from its log.

Assumes: torch ops are deterministic for a fixed thread count; callers that compare against
other processes pin `run.threads` (the tests use 1).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from seedflood import topology as topo
from seedflood.client import Client, Records
from seedflood.config import Config
from seedflood.memory import InMemoryNetwork, Mutator
from seedflood.message import Message
from seedflood.protocol import Protocol
from seedflood.replay import state_hash
from seedflood.transport import ByteCounter, TransportError
from seedflood.workload import Workload

log = logging.getLogger(__name__)


@dataclass
class SimResult:
    hashes: dict[int, str]
    """node -> final state hash."""
    step_hashes: dict[int, list[str]]
    """node -> hash after each applied step."""
    records: list[tuple[int, list[Message]]]
    """Every complete step applied (by node 0), in order: what the evaluator logs."""
    counter: ByteCounter
    workloads: dict[int, Workload] = field(repr=False)


def simulate(
    cfg: Config,
    top: topo.Topology | None = None,
    hash_every_step: bool = True,
    mutate: Mutator | None = None,
    stop: int | None = None,
    resume: Records = (),
    protocol: Protocol | None = None,
) -> SimResult:
    """Run every client of `cfg`; raises the first client error (others cascade).

    `stop`: end after this many steps without draining (a run killed there); `resume`: the
    complete steps of an earlier run to catch up from (each client resumes as after a relaunch).
    `mutate(src, dst, hop, frame) -> frame` may corrupt traffic for fault-injection tests.
    `protocol`: run under this protocol instead of the config's (e.g. a reference with another
    delay, `dataclasses.replace(p, delay=d, overlap=False)`); the topology must fit it.
    """
    top = top or topo.build(cfg.topology)
    topo.check_nodes(top, cfg.topology.nodes)
    protocol = protocol or Protocol.of(cfg, top.diameter)
    network = InMemoryNetwork(
        {i: top.neighbors(i) for i in top.nodes}, timeout_s=cfg.transport.timeout_s, mutate=mutate
    )
    workloads = {i: Workload.build(cfg) for i in top.nodes}
    step_hashes: dict[int, list[str]] = {i: [] for i in top.nodes}
    records: list[tuple[int, list[Message]]] = list(resume)
    hashes: dict[int, str] = {}
    errors: list[BaseException] = []

    def run(node: int) -> None:
        w = workloads[node]
        try:
            with network.endpoint(node) as transport:
                client = Client.in_topology(
                    top,
                    node,
                    protocol,
                    w.direction,
                    lambda step: w.loss(node, step),
                    transport,
                    cfg.transport.timeout_s,
                )
                client.resume(resume)
                if node == 0:
                    client.listeners.append(lambda s, msgs: records.append((s, msgs)))
                if hash_every_step:
                    client.listeners.append(lambda s, _: step_hashes[node].append(state_hash(w.model, w.direction)))
                client.run(stop)
                hashes[node] = state_hash(w.model, w.direction)
        except BaseException as e:  # surfaced below; the transport cascades it to the others
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), name=f"client-{i}") for i in top.nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        # The root cause, not the neighbours' "peer failed" echoes of it.
        root = [e for e in errors if not isinstance(e, TransportError)]
        raise (root or errors)[0]
    return SimResult(hashes, step_hashes, records, network.counter(), workloads)
