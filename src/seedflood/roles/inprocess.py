"""N clients in one process: the reference the multi-process runtime is checked against.

Owns: running every client of a config through the real client loop (flooding, codec, replay)
over an in-memory transport, one thread per client, each with its own model copy. The result
holds each client's final hash, its per-step hashes, the complete steps in order (what the
evaluator would log) and the traffic counters. A run can be stopped after some steps and
resumed from the steps it logged, exactly as a relaunched run resumes from its log. Clients take
run.step_delay_s / run.slow_nodes as launched ones do (roles/pace.py): the pace, not the bits.

Faults (`events`, churn runs): each node's own thread carries out its events at the start of the
step they name — `kill` (crash before this step: the network fails every edge of the node at once), `crash` (dies
in hop `hop` of this step after its frame reached only its first `arg` peers), `stall`
(SIGSTOP for `arg` seconds: the node's next exchange blocks, its neighbours drop it once it has
been silent for the transport timeout), `cut` (the link to node `arg` fails both ways), `heal`
(a cut link to node `arg` works again; its ends reconnect it, as any down edge between live
members),
`corrupt` (add `arg` to one weight: a client whose state silently differs, for the audit),
`restart` (a killed node comes back once the others reach `step`: a new incarnation with the
base weights, caught up by its sponsor's log; its per-step hashes before that are None; a life
that ends before the run does is restarted again, up to RESTART_TRIES times), `leave` (asked
to leave gracefully before this step: it originates nothing from it on, and once a committed
step leaves it out it closes its edges with its neighbours at an agreed hop and stops; its one
line, "node N left at step S", is in `exits`; a later `restart` event starts it again, as
after a kill), `join` (a brand-new id, >= the topology's size and < churn.max_nodes, starts once
the others reach `step`: it waits for a member that the join rule links it to to sponsor it,
replays that member's log and counts from the step its JOIN note names; docs/churn-design.md,
A new id joins; refused in one line for an id that is a member already, joins twice, lies
beyond churn.max_nodes, or has no key in a signed run's keys). With churn.repair, a committed
step that leaves members out links those left under-linked or apart (docs/churn-design.md,
Graph repair); the network grows the edges and their ends heal them. Pace (`pace`, any run): node i sleeps `pace[i]` seconds before each forward, an emulated
device speed, as run.step_delay_s paces a launched client (roles/train.py); the bits do not change.
Liars (`lies`,
any run): node i sends `lies[i]`'s scalars in place of its honest ones (roles/lying.py).
Impostors (`impostors`, signed runs): node i's process signs with `impostors[i]`, a key that is
not node i's (a process without node i's key acting as node i): its restarted lives if it has
`restart` events (the genuine first life is killed, an impostor takes its slot and must pass the
rejoin challenge), else its only life. A node that stops by the churn rules (minority, excluded)
or is killed is reported in `exits`, not raised; with `supervise`, one stopped by the rules is
restarted as its launcher would restart it. A newcomer whose JOIN step was committed without it
(`roster.JoinMissedError`: its sponsor stalled or was cut off before relaying the note) is always
started again, as the next incarnation, and sponsored again.

Assumes: torch ops are deterministic for a fixed thread count; callers that compare against
other processes pin `run.threads` (the tests use 1).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from seedflood.comm.memory import InMemoryNetwork, Mutator
from seedflood.core.churn import prefix
from seedflood.core.churn.member import Left
from seedflood.core.config.runconfig import Config
from seedflood.core.flood import protocol as proto
from seedflood.core.flood.flooding import FloodStats
from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.signing import Sign, Signing
from seedflood.core.flood.transport import ByteCounter, TransportError
from seedflood.core.membership.growth import Growth
from seedflood.core.membership.roster import Change, JoinMissedError, MembershipError
from seedflood.core.topology import resolve as topo
from seedflood.core.topology.graph import Topology
from seedflood.core.wire.message import Message
from seedflood.core.zo.replay import state_hash
from seedflood.ml.workload import Workload
from seedflood.roles.audit import AuditStats
from seedflood.roles.churnstart import ChurnStrategy, sponsored_catch_up
from seedflood.roles.client import Client
from seedflood.roles.identities import signing_of
from seedflood.roles.logserver import Steps, fetched
from seedflood.roles.lying import Lie, LyingClient
from seedflood.roles.pace import delay, slowed
from seedflood.roles.strategy import Records, Strategy
from seedflood.roles.strict import STRICT

log = logging.getLogger(__name__)


@dataclass
class SimResult:
    hashes: dict[int, str]
    """node -> final state hash."""
    step_hashes: dict[int, list[str | None]]
    """node -> hash after each applied step; None for every step a rejoined node logged up to its
    rejoin (it took them from its sponsor's catch-up, not through its own model)."""
    records: list[tuple[int, Sequence[Message]]]
    """Every complete step applied (by node 0), in order: what the evaluator logs."""
    counter: ByteCounter
    workloads: dict[int, Workload] = field(repr=False)
    exits: dict[int, str] = field(default_factory=dict)
    """node -> why it stopped early (killed, minority, excluded, "node N left at step S" after a
    `leave` event); absent = finished."""
    changes: dict[int, Change] = field(default_factory=dict)
    """The roster changes (step -> Change) of the lowest finished node."""
    flood: dict[int, FloodStats] = field(default_factory=dict)
    """node -> its flood's counters at its (last life's) end, finished or stopped."""
    audits: dict[int, AuditStats] = field(default_factory=dict)
    """node -> its recomputation counters (trust.audit > 0), as `flood`."""


RESTART_TRIES = 5
"""`restart`: a rejoin that fails (its sponsor dies before it is admitted, so it is left alone)
is restarted again, as a launcher's restart-on-failure policy would, at most this often."""


@dataclass(frozen=True)
class Event:
    """A fault a node's thread carries out at the start of `step` (see the module docstring)."""

    step: int
    node: int
    action: str  # kill | crash | stall | cut | heal | corrupt | restart | leave | join
    arg: float = (
        0.0  # crash: peers its last frame reaches; stall: seconds; cut, heal: the other end; corrupt: added to a weight
    )
    hop: int = 0  # crash: in which hop of the step (0-based)

    def __post_init__(self) -> None:
        if self.action not in ("kill", "crash", "stall", "cut", "heal", "corrupt", "restart", "leave", "join"):
            raise ValueError(f"unknown fault action {self.action!r}")


def simulate(
    cfg: Config,
    top: Topology | None = None,
    hash_every_step: bool = True,
    mutate: Mutator | None = None,
    stop: int | None = None,
    resume: Records = (),
    protocol: Protocol | None = None,
    events: Sequence[Event] = (),
    supervise: bool = False,
    lies: Mapping[int, Lie] | None = None,
    impostors: Mapping[int, Sign] | None = None,
    pace: Mapping[int, float] | None = None,
) -> SimResult:
    """Run every client of `cfg`; raises the first client error (others cascade).

    `stop`: end after this many steps without draining (a run killed there); `resume`: the
    complete steps of an earlier run to catch up from (each client resumes as after a relaunch).
    `mutate(src, dst, hop, frame) -> frame` may corrupt traffic for fault-injection tests.
    `protocol`: run under this protocol instead of the config's (e.g. a reference with another
    delay, `dataclasses.replace(p, delay=d, overlap=False)`); the topology must fit it.
    `events`: faults to inject (churn runs only, the transport then tolerates failures; `corrupt`,
    which fails nothing, in strict runs too).
    `impostors`: node -> a signing function not its own (module docstring; trust.sign runs).
    `pace`: node -> seconds it sleeps before each forward (module docstring).
    `supervise`: a node without `restart` events that the churn rules stop (cut off from the
    majority, excluded) is restarted while others still run, as the churn launchers restart a
    client that exits with that error (status 1: launch/churn.sh's torchrun agents, MAX_RESTARTS;
    compose's on-failure; under SLURM it is `scontrol requeue` by hand); off, it stays stopped
    (what the partition tests check).
    """
    top = top or topo.build(cfg.topology)
    topo.check_nodes(top, cfg.topology.nodes)
    protocol = protocol or Protocol.of(cfg, top.diameter)
    if any(e.action != "corrupt" for e in events) and not protocol.churn:
        raise ValueError("fault events other than corrupt need a churn run (churn.settle >= 1)")
    network = InMemoryNetwork(
        {i: top.neighbors(i) for i in top.nodes},
        timeout_s=cfg.transport.timeout_s,
        mutate=mutate,
        tolerate=protocol.churn,
    )
    joiners = _joiners(top, protocol, events)  # brand-new id -> its join event
    nodes = [*top.nodes, *sorted(joiners)]
    workloads = {i: Workload.build(cfg) for i in nodes}
    trajectory = proto.trajectory(cfg, protocol, workloads[top.nodes[0]].train_digest()) if cfg.trust.sign else {}
    signings = {i: signing_of(cfg, trajectory, i) for i in top.nodes}  # None each, unless trust.sign
    for j in joiners:
        try:
            signings[j] = signing_of(cfg, trajectory, j)
        except ValueError as e:  # identity.IdentityError: its key is missing or not the roster's
            raise ValueError(f"join of node {j}: trust.sign is on and {e}") from None
    # the join rule and graph repair: both grow the graph (churn.max_nodes, churn.repair)
    base = {i: top.neighbors(i) for i in top.nodes}
    repair = protocol.churn and protocol.repair
    growth = Growth.of(base, protocol.delay, repair=repair) if joiners or repair else None
    restarted = {e.node for e in events if e.action == "restart"}
    held: dict[int, tuple[Steps, prefix.Have]] = {}  # node -> its next life's prefix from the log server

    def fetch(node: int) -> None:
        """churn.log_server: as a launched restart or new id does, fetch the prefix before the
        others can see this life (its sponsor then sends only the steps after it)."""
        if cfg.churn.log_server:
            w = workloads[node]
            header = {"trajectory": proto.trajectory(cfg, protocol, w.train_digest()), "base_hash": w.loaded.base_hash}
            timeout = Protocol.LATE_FACTOR * cfg.transport.timeout_s
            held[node] = fetched(node, cfg.churn.log_server, protocol, header, 0, timeout)

    def signing(node: int, rejoin: bool) -> Signing | None:
        own = signings[node]
        if own is None or node not in (impostors or {}) or (node in restarted and not rejoin):
            return own
        return Signing(node, own.tag, (impostors or {})[node], own.verify)  # another key, node's id

    step_hashes: dict[int, list[str | None]] = {i: [] for i in nodes}
    logs: dict[int, list[tuple[int, Sequence[Message]]]] = {i: list(resume) for i in nodes}
    rosters: dict[int, dict[int, Change]] = {}
    hashes: dict[int, str] = {}
    exits: dict[int, str] = {}
    flood: dict[int, FloodStats] = {}
    audit: dict[int, AuditStats] = {}
    lies = dict(lies or {})
    errors: list[BaseException] = []
    todo = {i: sorted((e for e in events if e.node == i and e.action != "join"), key=lambda e: e.step) for i in nodes}

    def fault(e: Event) -> bool:
        """Carry out e; True if the node is gone."""
        if e.action == "corrupt":  # a silently wrong client (bad memory, a bug, a tampered weight)
            with torch.no_grad():
                workloads[e.node].direction.params[0].view(-1)[0] += e.arg
            return False
        if e.action == "kill":
            network.kill(e.node)
            exits[e.node] = f"killed at step {e.step}"
            return True
        if e.action == "crash":  # dies inside a hop of this step, after estimating
            network.crash_in(e.node, e.hop, int(e.arg))
            return False
        if e.action == "stall":
            network.stall(e.node)
            threading.Timer(e.arg, network.unstall, args=(e.node,)).start()
        elif e.action == "heal":
            network.heal(e.node, int(e.arg))
        else:
            network.cut(e.node, int(e.arg))
            network.cut(int(e.arg), e.node)
        return False

    progress = {i: -1 for i in nodes}  # node -> last step it applied
    waiting: set[int] = set()  # nodes whose supervisor waits to restart them (no client running)
    stopped: set[int] = set()  # nodes a life of which the churn rules stopped
    missed: set[int] = set()  # newcomers whose last life's JOIN step was committed without them

    def others_running(node: int) -> bool:
        return any(t.is_alive() for i, t in threads.items() if i != node and i not in waiting)

    def run(node: int) -> None:
        restarts = [e for e in todo[node] if e.action == "restart"]
        todo[node] = [e for e in todo[node] if e.action != "restart"]
        if node in joiners:  # a brand-new id starts once the others reach its step
            waiting.add(node)
            while max(progress.values()) < joiners[node].step and others_running(node):
                time.sleep(0.01)
            waiting.discard(node)
            fetch(node)
            network.add(node)
            once(node, rejoin=True)
        else:
            once(node)
        for e in restarts:
            if node in hashes or node not in network.dead:
                return
            waiting.add(node)  # two supervisors waiting on each other would wait forever
            while max(progress.values()) < e.step and others_running(node):
                time.sleep(0.01)
            waiting.discard(node)
            relaunch(node)
        if not restarts and node in stopped and (supervise or node in missed) and others_running(node):
            log.warning("node %d: stopped (%s); its launcher restarts it", node, exits[node])
            relaunch(node)

    def relaunch(node: int) -> None:
        """A supervisor that restarts on failure: a new incarnation until one life finishes,
        nobody is left to rejoin, or RESTART_TRIES lives."""
        for _ in range(RESTART_TRIES):
            # as a process restart does, start after the old edges are gone (bounded)
            gone_by = time.monotonic() + Protocol.LATE_FACTOR * cfg.transport.timeout_s
            while network.held_by(node) and time.monotonic() < gone_by:
                time.sleep(0.01)
            # the restarted process loads its model (base weights only) before it registers,
            # as train.py does: a sponsor then never waits on a neighbour still loading
            workloads[node] = Workload.build(cfg)
            fetch(node)
            network.revive(node)
            exits.pop(node, None)
            once(node, rejoin=True)
            if node not in exits or not others_running(node):
                return  # it finished, or there is nobody left to rejoin
            log.warning("node %d: restarted life ended (%s); restarting it again", node, exits[node])

    def once(node: int, rejoin: bool = False) -> None:
        w = workloads[node]
        try:
            with network.endpoint(node) as transport:
                # no evaluator follows in-process clients; incarnation 0: a rejoin takes the one
                # its catch-up admits
                strategy: Strategy = (
                    ChurnStrategy(transport, state_hash=lambda: state_hash(w.model, w.direction), growth=growth)
                    if protocol.churn
                    else STRICT
                )
                client = (LyingClient if node in lies else Client).in_topology(
                    top,
                    node,
                    protocol,
                    w.direction,
                    # run.step_delay_s as launched (roles/pace.py), plus this call's own `pace`
                    slowed(lambda step: w.loss(node, step), delay(cfg.run, node) + (pace or {}).get(node, 0.0)),
                    transport,
                    cfg.transport.timeout_s,
                    strategy,
                    signing(node, rejoin),
                    loss_of=w.loss,
                )
                if isinstance(client, LyingClient):
                    client.lie = lies[node]
                if rejoin:  # as a launched client: wait for the sponsor's claim, meet it, take its log
                    steps, have = held.pop(node, ([], prefix.NOTHING))
                    try:
                        blob = sponsored_catch_up(
                            transport, Protocol.LATE_FACTOR * cfg.transport.timeout_s, client.flood.signing, have=have
                        )
                    except TransportError as e:  # nobody stepping any more to sponsor it
                        exits[node] = f"no neighbour sponsored the rejoin: {e}"
                        network.kill(node)
                        return
                    client.churn.rejoin(blob, steps)
                    logs[node] = list(client.churn.history)
                    step_hashes[node] = [None] * client.logged
                else:
                    client.resume(resume)
                flood[node] = client.flood.stats
                if client.audit is not None:
                    audit[node] = client.audit.stats
                client.listeners.append(lambda s, msgs: logs[node].append((s, msgs)))
                client.listeners.append(lambda s, _: progress.__setitem__(node, max(progress[node], s)))
                if hash_every_step:
                    client.listeners.append(lambda s, _: step_hashes[node].append(state_hash(w.model, w.direction)))
                for event in todo[node]:
                    if event.step < client.next_step:  # a restarted node: carried out by its first life
                        continue
                    client.run(event.step)
                    if event.action == "leave":
                        client.churn.leave()
                    elif fault(event):
                        return
                client.run(stop)
                hashes[node] = state_hash(w.model, w.direction)
                rosters[node] = dict(client.mode.changes)
        except Left as e:  # left gracefully: its edges are closed, nobody waits on it
            exits[node] = str(e)
            network.kill(node)  # the process exits (a `restart` event may start it again)
        except MembershipError as e:  # stopped by the churn rules: an outcome, not a failure
            exits[node] = str(e)
            stopped.add(node)
            if isinstance(e, JoinMissedError):
                missed.add(node)
            network.kill(node)  # the process exits: its edges close
        except BaseException as e:  # surfaced below; the transport cascades it to the others
            if node in network.dead and isinstance(e, TransportError):
                exits.setdefault(node, f"crashed: {e}")
            else:
                errors.append(e)

    threads = {i: threading.Thread(target=run, args=(i,), name=f"client-{i}") for i in nodes}
    for t in threads.values():
        t.start()
    for t in threads.values():
        t.join()
    if errors:
        # The root cause, not the neighbours' "peer failed" echoes of it.
        root = [e for e in errors if not isinstance(e, TransportError)]
        raise (root or errors)[0]
    first = min(hashes, default=0)
    return SimResult(
        hashes, step_hashes, logs[first], network.counter(), workloads, exits, rosters.get(first, {}), flood, audit
    )


def _joiners(top: Topology, protocol: Protocol, events: Sequence[Event]) -> dict[int, Event]:
    """Brand-new id -> its `join` event; ValueError (one line) for a join the run cannot take."""
    out: dict[int, Event] = {}
    for e in (e for e in events if e.action == "join"):
        if e.node in top.nodes:
            raise ValueError(f"join of node {e.node}: it is a member already (the topology's nodes are 0..{top.n - 1})")
        if e.node in out:
            raise ValueError(f"join of node {e.node}: it joins once (at step {out[e.node].step}); restart it instead")
        if protocol.ids <= top.n:
            raise ValueError(f"join of node {e.node}: the run takes no new ids (set churn.max_nodes above {top.n})")
        if not top.n <= e.node < protocol.ids:
            raise ValueError(
                f"join of node {e.node}: churn.max_nodes is {protocol.max_nodes}, so new ids are "
                f"{top.n}..{protocol.ids - 1}"
            )
        out[e.node] = e
    return out
