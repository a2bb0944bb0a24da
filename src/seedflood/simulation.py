"""N clients in one process: the reference the multi-process runtime is checked against.

Owns: running every client of a config through the real client loop (flooding, codec, replay)
over an in-memory transport, one thread per client, each with its own model copy. The result
holds each client's final hash, its per-step hashes and the traffic counters.

Assumes: torch ops are deterministic for a fixed thread count; callers that compare against
other processes pin `run.threads` (the tests use 1).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from seedflood import topology as topo
from seedflood.client import Client
from seedflood.config import Config
from seedflood.replay import state_hash
from seedflood.transport import ByteCounter, InMemoryNetwork, Mutator, TransportError
from seedflood.workload import Workload

log = logging.getLogger(__name__)


@dataclass
class SimResult:
    hashes: dict[int, str]
    """node -> final state hash."""
    step_hashes: dict[int, list[str]]
    """node -> hash after each applied step."""
    counter: ByteCounter
    workloads: dict[int, Workload] = field(repr=False)


def simulate(
    cfg: Config,
    top: topo.Topology | None = None,
    hash_every_step: bool = True,
    mutate: Mutator | None = None,
) -> SimResult:
    """Run every client of `cfg` to the end; raises the first client error (others cascade).

    `mutate(src, dst, hop, frame) -> frame` may corrupt traffic for fault-injection tests.
    """
    top = top or topo.build(cfg.topology)
    topo.check_nodes(top, cfg.topology.nodes)
    network = InMemoryNetwork(
        {i: top.neighbors(i) for i in top.nodes}, timeout_s=cfg.transport.timeout_s, mutate=mutate
    )
    workloads = {i: Workload.build(cfg) for i in top.nodes}
    step_hashes: dict[int, list[str]] = {i: [] for i in top.nodes}
    hashes: dict[int, str] = {}
    errors: list[BaseException] = []

    def run(node: int) -> None:
        w = workloads[node]
        try:
            with network.endpoint(node) as transport:
                client = Client(node, top.neighbors(node), top.n, top.diameter, cfg, w.direction,
                                lambda step: w.loss(node, step), transport)
                if hash_every_step:
                    client.listeners.append(lambda s, _: step_hashes[node].append(state_hash(w.model, w.direction)))
                client.run()
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
    return SimResult(hashes, step_hashes, network.counter(), workloads)
