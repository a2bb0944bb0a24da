"""One process of a run: read the launcher's world, become the evaluator or a client, tear down.

Owns the composition of a process (docs/design.md, Processes and the step loop): world and topology checks before anything
expensive, the workload (run.threads = 0: the machine's cores split over the launcher's local
processes), the run's `Protocol`, the process group, resume (rank 0 checks the run
directory and broadcasts its log; every client catches up by replaying it, the evaluator from
its newest intact checkpoint plus the log tail), the role's run, and the end of the run: each
client posts its report (hash, byte counts, flood stats, threads, memory: RSS/PSS/USS) to the
rendezvous store and exits; the evaluator collects them once it has scored its backlog and writes summary.json. No collective
call waits on the evaluator, so finishing never depends on how long scoring takes.

Churn runs (`churn.settle` > 0, docs/churn-design.md, Per-edge transport and the store) use no process group: the store alone
(`runtime.store_group`: start-up broadcast and final reports) and one gloo group per edge
(`links.EdgeTransport`), so a client that crashes, stalls or is cut off leaves the others
training; the evaluator follows the clients' attach node, whichever client that is now, over an
edge (`attach.AttachInbox`), and collects the final reports of the clients that are members at
the end. A client that stops (no majority, or excluded) posts why, so an evaluator left without an
attach node knows when nobody is left to stream. Every churn client also keeps its own copy of the
agreed log and its report (`clientlog.ClientLog`, eval.client_logs), so no agreed step depends on the
evaluator's timing: rank 0 completes its log from the longest client log on its disk before it
resumes (`clientlog.complete_from_clients`), and reads there the reports the store does not hold.
Start-up has its own bound (transport.startup_timeout_s): every churn client waits, saying so,
until every other is up before it connects its edges (`rendezvous.await_start`).

Assumes: every process gets the same config; the run directory is on storage rank 0 can write
(clients on other hosts need no access to it: they catch up from the broadcast log).
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from seedflood.comm import runtime
from seedflood.comm.attach import AttachInbox
from seedflood.comm.bounded import StoreGone
from seedflood.comm.gloo import EvaluatorInbox, GlooTransport
from seedflood.comm.links import EdgeTransport
from seedflood.comm.rendezvous import STARTED_KEY, await_start
from seedflood.core import protocol as proto
from seedflood.core.config import Config
from seedflood.core.graph import Topology
from seedflood.core.membership import Change, MembershipError, Roster
from seedflood.core.protocol import Protocol
from seedflood.core.replay import state_hash
from seedflood.core.stepstream import decode_step, encode_step
from seedflood.core.topology import topology_of
from seedflood.core.transport import EVALUATOR, LATE_FACTOR, ByteCounter, Inbox
from seedflood.ml import host
from seedflood.ml.workload import Workload
from seedflood.roles.churn import ChurnStrategy, sponsored_catch_up
from seedflood.roles.client import Client
from seedflood.roles.evaluator import Evaluator, Settings, restore_run
from seedflood.roles.host import Strategy
from seedflood.roles.strict import STRICT
from seedflood.rundir.clientlog import ClientLog, client_report, complete_from_clients
from seedflood.rundir.layout import CheckpointError, RunDir
from seedflood.rundir.logfile import Records
from seedflood.rundir.logheader import log_header
from seedflood.rundir.metrics import human_bytes, setup_logging
from seedflood.rundir.resume import logged_changes, resume_records
from seedflood.rundir.summary import ClientReports, RunSummary, seedflood_summary

log = logging.getLogger(__name__)


class RunError(RuntimeError):
    """Rank 0 refused the run directory; every rank exits with this one line (status 2)."""


REPORT_S = 10.0  # how often the evaluator says whose final report it still waits for (s)


def _client_key(node: int) -> str:
    return f"client-{node}"


def run(cfg: Config, environ: dict[str, str] | None = None) -> RunSummary | None:
    """Run this process's role to the end; rank 0 returns the summary."""
    started = time.monotonic()
    world = runtime.World.from_env(environ if environ is not None else os.environ)
    top = topology_of(cfg)
    runtime.check_world(world, top.n)
    protocol = Protocol.of(cfg, top.diameter)
    role = "eval" if world.is_evaluator else f"client {world.client_node}"
    setup_logging(cfg.run.log_level, role)
    workload = Workload.build(cfg, local_rank=world.local_rank, local_processes=world.local_world_size)
    if world.is_evaluator:
        log.info(
            "task %s, %s split, label counts per client:\n%s", cfg.task.name, cfg.task.split, workload.label_table()
        )
    group_of = runtime.store_group if protocol.churn else runtime.process_group
    with group_of(world, cfg.transport) as group:
        records, changes = _resume(cfg, protocol, workload, group)
        if isinstance(group, runtime.StoreGroup):
            group.started(cfg.transport.timeout_s)
        if world.is_evaluator:
            return _evaluate(cfg, top, protocol, workload, group, records, started)
        _client(cfg, top, protocol, world.client_node, workload, group, records, changes)
        return None


def _resume(cfg: Config, protocol: Protocol, w: Workload, group: runtime.Group) -> tuple[Records, dict[int, Change]]:
    """Rank 0 decides what the run continues from and tells every rank (or why it cannot): the
    logged steps and their membership changes."""
    payload: dict[str, Any] | None = None
    if group.world.is_evaluator:
        trajectory = proto.trajectory(cfg, protocol, w.train_digest())
        run_dir = RunDir.of(cfg)
        try:
            records = resume_records(run_dir, protocol, trajectory, w.loaded.base_hash, resume=cfg.checkpoint.resume)
            if protocol.churn:  # agreed steps only the clients' own logs hold (an evaluator restarted late)
                header = log_header(cfg, trajectory, w.loaded.identity, w.loaded.base_hash)
                records = complete_from_clients(run_dir, protocol, header, records)
            changes = logged_changes(run_dir) if records else {}
            payload = {"records": [(s, encode_step(m, changes.get(s))) for s, m in records]}
        except CheckpointError as e:
            payload = {"error": str(e)}
    payload = group.broadcast(payload)
    if "error" in payload:
        raise RunError(payload["error"])
    records, changes = [], {}
    roster = Roster(protocol.n_origins)
    for s, f in payload["records"]:  # rank 0 validated them; a broadcast is a wire like any other
        msgs, change = decode_step(f, s, seed_of=protocol.seed)
        if change:
            roster.apply(change)
            changes[s] = change
        protocol.check_step(s, msgs, members=roster.members)
        records.append((s, msgs))
    return records, changes


def _transport(
    cfg: Config, top: Topology, node: int, group: runtime.Group, counter: ByteCounter, attach: int | None
) -> GlooTransport | EdgeTransport:
    """Strict (`attach` None: the configured one): point-to-point on the process group. Churn
    (`attach`: the attach node after the logged changes): a gloo group per edge, connected now."""
    if attach is None:
        rank = proto.EVALUATOR_RANK if node == cfg.eval.attach else None
        return GlooTransport(node, top.neighbors(node), proto.rank_of, counter, evaluator_rank=rank)
    store = group.store  # type: ignore[attr-defined]
    t = EdgeTransport(node, top.neighbors(node), store, counter=counter, timeout_s=cfg.transport.timeout_s)
    if t.rejoining:  # a restarted client: its sponsor connects it (`churn.sponsored_catch_up`)
        return t
    if t.store.check([STARTED_KEY]):  # the others gave up waiting for this one: join as a restart does
        log.warning(
            "node %d: the run started without it (it came later than transport.startup_timeout_s=%g): "
            "joining by a sponsor",
            node,
            cfg.transport.startup_timeout_s,
        )
        t.rejoining = True
        return t
    t.attach = node == attach
    # Every client waits for every other to be up (model loaded) within the start-up bound, not the
    # hop timeout: a slow loader must not be left out, and a client must not start hopping while
    # a neighbour is still connecting (its first hop would wait out a peer that is not hopping).
    late = await_start(t.store, node, top.nodes, cfg.transport.startup_timeout_s)
    want = [*top.neighbors(node), *([EVALUATOR] if t.attach else [])]
    got = t.connect([p for p in want if p not in late], cfg.transport.timeout_s)
    t.store.set(STARTED_KEY, "1")
    if missing := sorted(set(want) - set(got)):
        log.warning(
            "node %d: not connected to %s at start-up (transport.startup_timeout_s=%g); training on without them",
            node,
            missing,
            cfg.transport.startup_timeout_s,
        )
    return t


def _client(
    cfg: Config,
    top: Topology,
    protocol: Protocol,
    node: int,
    w: Workload,
    group: runtime.Group,
    records: Records,
    changes: dict[int, Change],
) -> None:
    counter = ByteCounter()
    roster = Roster(protocol.n_origins, attach=cfg.eval.attach)
    for s in sorted(changes):
        roster.apply(changes[s])
    transport = _transport(cfg, top, node, group, counter, roster.attach if protocol.churn else None)
    step_hashes: list[str] = []
    with transport:
        strategy: Strategy = STRICT
        if isinstance(transport, EdgeTransport):  # churn
            strategy = ChurnStrategy(
                transport,
                state_hash=lambda: state_hash(w.model, w.direction),
                attach=cfg.eval.attach,
                evaluator=transport,  # it feeds the evaluator whenever it is the attach node
                incarnation=transport.incarnation,  # its votes carry it; a rejoin checks it
            )
        client = Client.in_topology(
            top,
            node,
            protocol,
            w.direction,
            lambda step: w.loss(node, step),
            transport,
            cfg.transport.timeout_s,
            strategy,
        )
        if isinstance(transport, EdgeTransport) and transport.rejoining:
            # a restarted client (incarnation > 1 in the run's store), or one that started later
            # than the others' start-up bound: caught up by the neighbour that claims it
            client.churn.rejoin(sponsored_catch_up(transport, LATE_FACTOR * cfg.transport.timeout_s))
        else:
            client.resume(records, changes)  # O(messages) for subcge, no checkpoint needed
        if node == cfg.eval.attach and not protocol.churn:
            client.listeners.append(lambda s, msgs: transport.push(encode_step(msgs, None), s))
        if cfg.run.hash_steps:
            client.listeners.append(lambda s, _: step_hashes.append(state_hash(w.model, w.direction)))
        if records:
            log.info("resumed at step %d by replaying %d logged steps", len(records), len(records))
        # Churn: this client's own copy of every agreed step (eval.client_logs), so no step depends
        # on the evaluator being up when it is decided (docs/churn-design.md, Client logs)
        own = _client_log(cfg, protocol, w, node) if protocol.churn else None
        if own is not None:
            own.extend(client.churn.history, client.churn.roster.changes)
            client.listeners.append(lambda s, _: own.extend(client.churn.history, client.churn.roster.changes))
        try:
            client.run()
        except MembershipError as e:  # tell the evaluator this client is done streaming for good
            stopped = {"node": node, "stopped": str(e)}
            if own is not None:
                own.extend(client.churn.history, client.churn.roster.changes)
                own.report(stopped)
            _post(group, _client_key(node), stopped)
            raise
        finally:
            if own is not None:
                own.close()
    report = {
        "node": node,
        "hash": state_hash(w.model, w.direction),
        "step_hashes": step_hashes,
        "bytes": counter.rows(),
        "flood": vars(client.flood.stats),
        "threads": host.threads(),
        "memory": host.memory(),  # at the end of training: the weights' pages are as written as they get
    }
    if own is not None:
        own.report(report)
    _post(group, _client_key(node), report)


def _client_log(cfg: Config, protocol: Protocol, w: Workload, node: int) -> ClientLog | None:
    if not cfg.eval.client_logs:
        return None
    header = log_header(cfg, proto.trajectory(cfg, protocol, w.train_digest()), w.loaded.identity, w.loaded.base_hash)
    return ClientLog(RunDir.of(cfg), protocol, header, node)


def _churn_reports(cfg: Config, run_dir: RunDir, group: runtime.Group, members: list[int]) -> dict[str, Any]:
    """The final reports of `members`: from the store, or from their client logs on this disk
    (clientlog.client_report: what a client left when the store is gone, or when this evaluator
    came back to a fresh store). Waits at most LATE_FACTOR × transport.timeout_s, saying on
    screen every REPORT_S whom it waits for; a report missing then is logged and left out (its
    hash shows as null in summary.json), never a reason to write no summary."""
    bound = LATE_FACTOR * cfg.transport.timeout_s
    found: dict[str, Any] = {}
    store_ok = True
    start = time.monotonic()
    report_at = start + REPORT_S
    while True:
        for n in members:
            key = _client_key(n)
            if key in found:
                continue
            value = client_report(run_dir, n)
            if value is None and store_ok:
                try:
                    if group.store.check([group.report_key(key)]):  # type: ignore[attr-defined]
                        value = json.loads(group.store.get(group.report_key(key)))  # type: ignore[attr-defined]
                except StoreGone as e:
                    store_ok = False
                    log.error("evaluator: the store is gone (%s): final reports only from client logs on this disk", e)
            if value is not None:
                found[key] = value
        missing = [n for n in members if _client_key(n) not in found]
        now = time.monotonic()
        if not missing:
            return found
        if now - start > bound or (not store_ok and run_dir.clients is None):
            log.error(
                "evaluator: no final report from nodes %s within %g s: their hashes and byte counts are unknown "
                "and the consensus is checked without them; `seedflood replay %s` checks the log",
                missing,
                bound,
                cfg.run.out_dir,
            )
            return found
        if now >= report_at:
            log.warning(
                "evaluator: waiting for the final reports of nodes %s (%.0f s of %g)", missing, now - start, bound
            )
            report_at = now + REPORT_S
        time.sleep(runtime.REPORT_POLL_S)


def _post(group: runtime.Group, key: str, report: dict[str, Any]) -> None:
    """Leave the final report for the evaluator; a store that is gone (its host died) costs the
    report, not the client's exit status: training is done and its state is in the log."""
    try:
        group.post(key, report)
    except Exception as e:
        log.warning("could not leave the final report (the store is unreachable: %s)", str(e).splitlines()[0])


def _evaluate(
    cfg: Config,
    top: Topology,
    protocol: Protocol,
    w: Workload,
    group: runtime.Group,
    records: Records,
    started: float,
) -> RunSummary:
    settings = Settings.of(cfg)
    run_dir = settings.run
    wall = time.time() - (time.monotonic() - started) - 1.0  # this process's start (an mtime may lag a little)
    restored = restore_run(w, protocol, run_dir.root, records)
    start = restored.steps  # the first step the stream must bring
    header = log_header(cfg, proto.trajectory(cfg, protocol, w.train_digest()), w.loaded.identity, w.loaded.base_hash)
    if protocol.churn:
        if 0 < start < protocol.steps:
            log.warning("evaluator: its log holds %d steps; the attach node sends the rest", start)
        inbox: Inbox = AttachInbox(
            group.store,  # type: ignore[attr-defined]
            top.n,
            protocol.steps,
            start=start,
            wait_s=max(cfg.transport.startup_timeout_s, LATE_FACTOR * cfg.transport.timeout_s),
            blob_wait_s=LATE_FACTOR * cfg.transport.timeout_s,
            timeout_s=cfg.transport.timeout_s,
            done_keys=[group.report_key(_client_key(n)) for n in top.nodes],
            # the same reports on this disk (a store restarted with this evaluator never gets
            # them), written since it started: one an earlier launch left says nothing
            done=lambda: all(client_report(run_dir, n, since=wall) is not None for n in top.nodes),
        )
    else:
        inbox = EvaluatorInbox(proto.rank_of(cfg.eval.attach), cfg.eval.attach)
    evaluator = Evaluator(settings, protocol, w, inbox, header, start_step=start, progress=True)
    try:
        final = evaluator.run()
    finally:
        evaluator.close()
        inbox.close()
    # the members at the end report (those that left never will); a churn run names the rest
    members = sorted(evaluator.roster.members)
    if protocol.churn:
        reports = _churn_reports(cfg, run_dir, group, members)
    else:
        reports = group.collect([_client_key(n) for n in members])
    clients = [reports.get(_client_key(n)) for n in top.nodes]
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
        memory={"evaluator": host.memory(), "clients": [r and r["memory"] for r in clients]},
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
    return summary
