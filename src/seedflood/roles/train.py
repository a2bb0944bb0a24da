"""One process of a run: read the launcher's world, become the evaluator or a client, tear down.

Owns the composition of a process (docs/design.md, Processes and the step loop): world and
topology checks before anything expensive, the workload (run.threads = 0: the machine's cores
split over the launcher's local processes), the run's `Protocol`, the choice of strict or churn
(made once, here: `strictwiring.StrictWiring` or `churnwiring.ChurnWiring`, behind
`wiring.Wiring`), resume (rank 0 checks the run directory and broadcasts its log and the run's
build, rundir/build.py: a process on another build exits 2 with one line; every client catches
up by replaying the log, the evaluator from its newest intact checkpoint plus the log tail),
the role's run, and the end of the run: each client posts its report (hash, byte counts, flood
stats, threads, memory: RSS/PSS/USS, cost: roles/cost.py) to the rendezvous store and exits; the evaluator collects
them once it has scored its backlog and writes summary.json. No collective call waits on the
evaluator, so finishing never depends on how long scoring takes.

What a churn run (`churn.settle` > 0) does differently — no process group, a gloo group per edge,
rejoins, the clients' own logs, an evaluator that follows whichever client is the attach node —
is churnwiring.py's (docs/churn-design.md, Per-edge transport and the store), SIGTERM's graceful
leave included; a client that has left (`core.churn.member.Left`) posts a stopped report with its one line,
"node N left at step S", and returns, so the process exits 0.

A brand-new node id joining a running churn run (SEEDFLOOD_NODE=J, runtime.World; churn.max_nodes
> J) is a client like the others, outside the launch's ranks: it takes the resume broadcast, is
caught up by the member the join rule picks (churnwiring.py) and posts its final report, which the
evaluator reads with the founders' (summary.json's client lists are indexed by node id).

Assumes: every process gets the same config; the run directory is on storage rank 0 can write
(clients on other hosts need no access to it: they catch up from the broadcast log).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from seedflood.comm import runtime
from seedflood.core.churn.member import Left
from seedflood.core.config.runconfig import Config
from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.stepstream import decode_step, encode_step
from seedflood.core.flood.transport import ByteCounter, Inbox
from seedflood.core.membership.roster import Change, MembershipError
from seedflood.core.topology.resolve import topology_of
from seedflood.core.zo.replay import state_hash
from seedflood.ml import machine, modelcheck
from seedflood.ml.workload import Workload
from seedflood.roles.client import Client
from seedflood.roles.cost import Cost
from seedflood.roles.evaluator import Evaluator, Restored, restore_run
from seedflood.roles.identities import check_own_key, signing_of, verifier_of
from seedflood.roles.livestatus import SentCounter, client_status, evaluator_status
from seedflood.roles.pace import paced as _paced  # tests/unit/roles/test_pace.py checks it here
from seedflood.roles.strictwiring import StrictWiring
from seedflood.roles.wiring import G, Process, T, Wiring, client_key
from seedflood.rundir import build
from seedflood.rundir.layout import CheckpointError, RunDir
from seedflood.rundir.logfile import Records
from seedflood.rundir.metrics import human_bytes, setup_logging
from seedflood.rundir.resume import logged_changes, resume_records
from seedflood.rundir.status import FINISHED, STOPPED
from seedflood.rundir.summary import ClientReports, RunSummary, seedflood_summary

log = logging.getLogger(__name__)


class RunError(RuntimeError):
    """Rank 0 refused the run directory; every rank exits with this one line (status 2)."""


def run(cfg: Config, environ: dict[str, str] | None = None) -> RunSummary | None:
    """Run this process's role to the end; rank 0 returns the summary."""
    started = time.monotonic()
    world = runtime.World.from_env(environ if environ is not None else os.environ)
    top = topology_of(cfg)
    protocol = Protocol.of(cfg, top.diameter)
    churn = protocol.churn  # strict or churn, decided once (below: the wiring)
    # a new id (SEEDFLOOD_NODE) joins only a churn run open to it (churn.max_nodes)
    runtime.check_world(world, top.n, ids=protocol.ids)  # churn.max_nodes needs churn.settle
    runtime.check_store_port(world, churn)  # rank 0's MASTER_PORT taken: refused before the model loads
    role = "eval" if world.is_evaluator else f"client {world.client_node}"
    if not world.is_evaluator:
        check_own_key(cfg, world.client_node)  # signed: this node's key, before the model loads
    setup_logging(cfg.run.log_level, role)
    device = _device(cfg, world)  # this process's device is its current one before anything is built on it
    workload = Workload.build(cfg, device=device, local_processes=world.local_world_size)
    if world.is_evaluator:
        log.info(
            "task %s, %s split, label counts per client:\n%s", cfg.task.name, cfg.task.split, workload.label_table()
        )
    process = Process(cfg, top, protocol, workload)
    # Strict or churn: from here on, what differs is the wiring's to say.
    if churn:
        from seedflood.roles.churnwiring import ChurnWiring  # here: a strict process skips its 15 modules (0.9 MiB)

        return _serve(process, ChurnWiring(process), world, started)
    return _serve(process, StrictWiring(process), world, started)


def _device(cfg: Config, world: runtime.World) -> str:
    """This process's device (modelcheck.place: model.device, eval.device, its rank and local
    rank), made its current CUDA device (modelcheck.use_device); the evaluator says in one line
    when it shares a client's GPU on its host (its host's processes: LOCAL_WORLD_SIZE)."""
    model, evaluator = cfg.model.device, cfg.eval.device
    gpus = modelcheck.local_gpus() if modelcheck.needs_gpus(model, evaluator) else 0
    device = modelcheck.place(model, evaluator, world.rank, world.local_rank, gpus)
    modelcheck.use_device(device)
    if world.is_evaluator and device != "cpu":
        for notice in modelcheck.plan(model, evaluator, world.local_world_size, gpus).notices:
            log.warning("%s", notice)
    return device


def _serve(p: Process, wiring: Wiring[G, T], world: runtime.World, started: float) -> RunSummary | None:
    with wiring.group(world) as group:
        records, changes = _resume(p, wiring, group)
        wiring.started(group)
        if world.is_evaluator:
            return _evaluate(p, wiring, group, records, changes, started)
        _client(p, wiring, world.client_node, group, records, changes)
        return None


def _resume(p: Process, wiring: Wiring[G, T], group: G) -> tuple[Records, dict[int, Change]]:
    """Rank 0 decides what the run continues from and tells every rank (or why it cannot): the
    logged steps and their membership changes."""
    cfg, protocol, w = p.cfg, p.protocol, p.workload
    mixed = bool(protocol.audit_tolerance)  # the run's audits tolerate other kinds of CPU (build.KIND)
    payload: dict[str, Any] | None = None
    if group.world.is_evaluator:
        run_dir = RunDir.of(cfg)
        try:
            logged = resume_records(run_dir, protocol, p.trajectory, w.loaded.base_hash, resume=cfg.checkpoint.resume)
            records = wiring.completed(list(logged))  # broadcast as frames below: built once here
            changes = logged_changes(run_dir) if records else {}
            # the run's build (recorded, or this one for a new run), which every other process must run
            run_build = build.settle(run_dir, p.build, len(records), mixed)
            payload = {"records": [(s, encode_step(m, changes.get(s))) for s, m in records], "build": run_build}
        except CheckpointError as e:
            payload = {"error": str(e)}
    payload = group.broadcast(payload)
    if "error" in payload:
        raise RunError(payload["error"])
    if line := build.refusal(payload.get("build"), p.build, str(RunDir.of(cfg).root), mixed):
        raise RunError(line)  # a client, a restart or a new id on another build than the run's
    records, changes = [], {}
    roster = protocol.roster()
    for s, f in payload["records"]:  # rank 0 validated them; a broadcast is a wire like any other
        msgs, change = decode_step(f, s, seed_of=protocol.seed)
        if change:
            roster.apply(change)
            changes[s] = change
        protocol.check_step(s, msgs, members=roster.members)
        records.append((s, msgs))
    return records, changes


def _client(
    p: Process, wiring: Wiring[G, T], node: int, group: G, records: Records, changes: dict[int, Change]
) -> None:
    cfg, w = p.cfg, p.workload
    signing = signing_of(cfg, p.trajectory, node)  # its key is checked before it connects
    counter = SentCounter()
    transport = wiring.transport(node, group, counter, changes)
    step_hashes: list[str] = []
    cost = Cost()
    try:
        with transport:
            client = Client.in_topology(
                p.top,
                node,
                p.protocol,
                w.direction,
                _paced(cfg.run, node, cost.loss(lambda step: w.loss(node, step))),
                transport,
                cfg.transport.timeout_s,
                wiring.strategy(node, transport),
                signing,
                loss_of=w.loss,  # audits (trust.audit > 0) recompute the peers' scalars with it
            )
            wiring.start(client, transport, records, changes)
            cost.watch(client)
            if cfg.run.hash_steps:
                client.listeners.append(lambda s, _: step_hashes.append(state_hash(w.model, w.direction)))
            if records:
                log.info("resumed at step %d by replaying %d logged steps", len(records), len(records))
            own = wiring.own_record(client)
            # a new id's neighbours are the join rule's, known once it is admitted: none at start
            start = p.top.neighbors(node) if node in p.top.nodes else ()
            status = client_status(RunDir.of(cfg), client, counter, records, changes, start)
            with status:  # an error leaving it is the record's final state: failed, with its first line
                try:
                    cost.start()
                    client.run()
                    cost.stop()
                except (MembershipError, Left) as e:  # tell the evaluator this client is done streaming for good
                    stopped = {"node": node, "stopped": str(e)}
                    own.stopped(stopped)
                    status.end(STOPPED, str(e))
                    _post(group, client_key(node), stopped)
                    raise
                finally:
                    own.close()
                final_hash = state_hash(w.model, w.direction)
                status.end(FINISHED, state_hash=final_hash)
    except Left as e:  # left gracefully (SIGTERM): its stopped report is posted, it exits 0
        log.warning("%s", e)
        return
    # After the transport closed: its end-of-stream marker to the evaluator is counted too.
    report = {
        "node": node,
        "hash": final_hash,
        "step_hashes": step_hashes,
        "bytes": counter.rows(),
        # with trust.audit: the client's recomputation counters beside its flood's
        "flood": vars(client.flood.stats) | ({"audit": client.audit.stats.report()} if client.audit else {}),
        "threads": machine.threads(),
        "memory": machine.memory(),  # at the end of training: the weights' pages are as written as they get
        "cost": cost.report(),  # CPU of its steps, of its forwards, peak messages held (roles/cost.py)
    }
    own.finished(report)
    _post(group, client_key(node), report)


def _post(group: runtime.Group, key: str, report: dict[str, Any]) -> None:
    """Leave the final report for the evaluator; a store that is gone (its host died) costs the
    report, not the client's exit status: training is done and its state is in the log."""
    try:
        group.post(key, report)
    except Exception as e:
        log.warning("could not leave the final report (the store is unreachable: %s)", str(e).splitlines()[0])


def _evaluate(
    p: Process, wiring: Wiring[G, T], group: G, records: Records, changes: dict[int, Change], started: float
) -> RunSummary:
    protocol, w = p.protocol, p.workload
    settings = wiring.settings()
    run_dir = settings.run
    wall = time.time() - (time.monotonic() - started) - 1.0  # this process's start (an mtime may lag a little)
    restored = restore_run(w, protocol, run_dir.root, records)
    start = restored.steps  # the first step the stream must bring
    inbox = wiring.inbox(group, start, wall)
    verifier = verifier_of(p.header, protocol, wiring.certified)  # signed: each step is verified before it is taken
    evaluator = Evaluator(settings, protocol, w, inbox, p.header, start_step=start, progress=True, verifier=verifier)
    status = evaluator_status(run_dir, evaluator, records, changes)
    with status:  # the final record (finished) once summary.json is written; an error: failed
        summary, final_hash = _finish(p, wiring, group, evaluator, inbox, restored, started)
        status.end(FINISHED, state_hash=final_hash)
    return summary


def _finish(
    p: Process,
    wiring: Wiring[G, T],
    group: G,
    evaluator: Evaluator,
    inbox: Inbox,
    restored: Restored,
    started: float,
) -> tuple[RunSummary, str]:
    """Follow the stream to its end, collect the clients' final reports, write summary.json;
    returns the summary and the evaluator's final state hash."""
    cfg, top, protocol = p.cfg, p.top, p.protocol
    run_dir, start = evaluator.run_dir, restored.steps
    try:
        final = evaluator.run()
    finally:
        evaluator.close()
        inbox.close()
    # the members at the end report (those that left never will); a churn run names the rest
    reports = wiring.final_reports(group, sorted(evaluator.roster.members))
    # indexed by node id: the founders, then up to the highest new id a committed change admitted
    joined = [j for c in evaluator.roster.changes.values() for j, _ in c.join]
    clients = [reports.get(client_key(n)) for n in range(max(top.n, 1 + max(joined, default=-1)))]
    clients = [r if r is not None and "hash" in r else None for r in clients]  # a stopped client: no state
    present = [r for r in clients if r is not None]
    counter = ByteCounter.from_rows([row for r in present for row in r["bytes"]])
    # None: nothing to compare (no report came); False: a client differs from the evaluator
    consensus = all(r["hash"] == final["param_hash"] for r in present) if present else None
    said = ClientReports(
        client_hashes=[r and r["hash"] for r in clients],
        consensus=consensus,
        client_step_hashes=[r and r["step_hashes"] for r in clients] if cfg.run.hash_steps else None,
        flood=[r and r["flood"] for r in clients],
        threads=[r and r["threads"] for r in clients],
        memory={"evaluator": machine.memory(), "clients": [r and r["memory"] for r in clients]},
        cost=[r and r.get("cost") for r in clients],
    )
    summary = seedflood_summary(
        run_dir,
        top,
        protocol,
        counter,
        final,
        evaluator.zero_shot,
        said,
        hf_model=cfg.checkpoint.hf_model,
        resumed_from=restored.checkpoint,
        logged=start,
        started=started,
        roster=evaluator.roster,
    )
    summary.write(run_dir)
    if consensus is False:
        log.error("clients disagree with the evaluator: %s vs %s", said.client_hashes, final["param_hash"])
    log.info("mean bytes per edge per step: %s", human_bytes(counter.mean_bytes_per_edge_per_step()))
    return summary, str(final["param_hash"])
