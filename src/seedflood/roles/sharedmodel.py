"""Exact shared-model simulation: every client of a SeedFlood run in one process, on ONE model.

Owns `seedflood simulate` (docs/design.md, Experiments: shared-model simulation): a run of N clients that ends with the
bits, the log and the metrics of the multi-process run of the same config, in the memory of one
model and 2·K forwards per client per step.

Why one model is exact: every client applies the same complete steps at the same local step, so
all N clients hold the same bits after every step, and a two-point estimate never writes the
weights (the direction evaluates θ ± εz at forward time). So at local step t the shared model is
every client's model: each client's K estimates are computed in turn on it (its own batch of
step t, seeds protocol.seed(node, t, k)); the N·K messages go into every node's flood, driven in
the client's exact schedule (`lockarrays.make`: every node's flood as numpy arrays, equal to
`lockstep.Lockstep`'s real Floods and codec: every frame counted as the transport counts it and
checked against the receivers' limits, shortest-path routes, overlap's order and drain); step
t − delay is applied ONCE to the shared model, after the lockstep has checked that every node
holds the same complete set. An `evaluator.Evaluator` sharing the workload (`apply=False`)
follows each applied step exactly as the launched evaluator follows the attach client's stream:
log, scores at eval.every, checkpoints, zero-shot at step 0, final score.

Resume (as a relaunched run, §2): a run directory with a log for this config continues from its
L steps (`rundir.resume.resume_records` decides or refuses, in one line, and `rundir.build.settle` refuses
another build than the one build.json records): the shared model is brought to
steps < L − delay (newest usable checkpoint plus log replay), the later logged steps are held
complete by every node's flood, and the evaluator appends from step L.

Batched clients (`sim.batched: true`, opt-in; batched.py): the N·K estimates of a step come from
one forward over every client's ± batches, each group of rows with its own perturbation. Seeds,
messages' ids, frames, byte counts, applies and the log format are unchanged; the scalars equal
the sequential ones only up to floating-point reduction order, so such a run is statistically,
not bitwise, the launched run (it still replays and resumes exactly from its own log). A model
or direction that cannot be batched runs sequentially with one warning. The default (sequential,
one client after another) is the exact reference.

Assumes: the config was preflighted (cli); torch ops are deterministic for a fixed thread count
and device, so the result equals a launched run on the same hardware and software. Not here:
baselines (their clients hold different parameters; `baselines.run`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from seedflood.core.config.runconfig import Config
from seedflood.core.flood import lockarrays
from seedflood.core.flood import protocol as proto
from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.transport import ByteCounter
from seedflood.core.topology import resolve as topo
from seedflood.core.topology.graph import Topology
from seedflood.core.wire.message import Message, encode
from seedflood.core.zo import estimate as zo
from seedflood.core.zo.replay import Applier, state_hash
from seedflood.ml import machine
from seedflood.ml.batched import BatchedEstimator
from seedflood.ml.workload import Workload
from seedflood.roles.evaluator import Evaluator, Settings, restore_run
from seedflood.rundir import build
from seedflood.rundir.layout import RunDir
from seedflood.rundir.logheader import log_header
from seedflood.rundir.metrics import human_bytes
from seedflood.rundir.resume import resume_records
from seedflood.rundir.summary import ClientReports, RunSummary, seedflood_summary

log = logging.getLogger(__name__)

StepListener = Callable[[int, list[Message]], None]
Records = Sequence[tuple[int, Sequence[Message]]]


class SharedModel:
    """N clients of one run on one workload: estimates in turn, the real flood, one apply a step."""

    def __init__(self, cfg: Config, top: Topology, protocol: Protocol, workload: Workload) -> None:
        topo.check_nodes(top, protocol.n_origins)
        self.cfg = cfg
        self.top = top
        self.protocol = protocol
        self.w = workload
        self.lockstep = lockarrays.make(
            top,
            protocol.perturbations,
            protocol.hops,
            protocol.delay,
            overlap=protocol.overlap,
            wire=protocol.wire_limits,
            due=protocol.due,
        )
        self.applier = Applier(workload.direction, protocol)
        self.listeners: list[StepListener] = []
        """Called with (step, messages) right after each step beyond the resumed log is applied."""
        self.next_step = 0
        self.logged = 0
        self.resumed_from = 0
        """Set by `resume`: the step of the checkpoint the shared model was restored from (0: none)."""
        self.on_client: Callable[[int, int], None] | None = None
        """Called with (step, node) after each client's estimates (progress display)."""
        self.batched: BatchedEstimator | None = None
        """`sim.batched`: every client's estimates from batched forwards (batched.py: scalars
        equal up to floating-point reduction order); None = one client after another (exact)."""
        if cfg.sim.batched:
            est = BatchedEstimator(workload.model, workload.direction, protocol, cfg.sim)
            self.batched = None if est.fallback else est

    @property
    def counter(self) -> ByteCounter:
        return self.lockstep.counter

    def resume(self, records: Records, run_dir: Path | None = None) -> None:
        """Stand where every client resumed from these L logged steps stands: steps < L − delay
        applied to the shared model (from the newest usable checkpoint in `run_dir` within
        them plus a replay, else from the base weights), the rest complete in every flood."""
        if self.next_step or self.applier.last_step >= 0:
            raise RuntimeError("sharedmodel: resume must come before the first step")
        cut = self.lockstep.restore(records)
        if run_dir is not None:
            self.resumed_from = restore_run(self.w, self.protocol, run_dir, list(records[:cut])).checkpoint
            self.applier.last_step = cut - 1
        else:
            self.applier.apply_all(records[:cut])
        self.next_step = self.logged = len(records)

    def estimate(self, t: int) -> dict[int, list[Message]]:
        """Every client's K messages of step t, on the shared model (as client.Client.estimate):
        the clients due at t (zo.stride: a strided one originates only on its steps)."""
        if self.batched is not None:
            return self._estimate_batched(t)
        p, w = self.protocol, self.w
        out = {}
        for node in p.origins(t):
            own = []
            for k in range(p.perturbations):
                seed = p.seed(node, t, k)
                scalar = zo.two_point(lambda: w.loss(node, t), w.direction, seed, t, p.eps)  # noqa: B023 (called here)
                zo.check_scalar(scalar, p.max_scalar, t)
                own.append(Message.make(node, t, seed, scalar, k))
            out[node] = own
            if self.on_client is not None:
                self.on_client(t, node)
        return out

    def _estimate_batched(self, t: int) -> dict[int, list[Message]]:
        """`estimate` from batched forwards: the same seeds and messages, scalars within tolerance."""
        p = self.protocol
        assert self.batched is not None
        nodes = p.origins(t)
        scalars = self.batched.estimate(t, nodes, self.w.batch)
        out = {}
        for node in nodes:
            out[node] = [
                Message.make(node, t, p.seed(node, t, k), zo.check_scalar(x, p.max_scalar, t), k)
                for k, x in enumerate(scalars[node])
            ]
            if self.on_client is not None:
                self.on_client(t, node)
        return out

    def _apply(self, s: int, msgs: list[Message]) -> None:
        self.applier.apply(s, msgs)
        if s >= self.logged:
            for listener in self.listeners:
                listener(s, msgs)

    def run(self, stop: int | None = None, after_step: Callable[[int], None] | None = None) -> None:
        """Local steps next_step..stop-1 (default: to the end of the run, then drain)."""
        start = self.next_step
        stop = self.protocol.steps if stop is None else stop
        self.lockstep.run(
            self.protocol.steps, self.estimate, self._apply, start=start, stop=stop, after_step=after_step
        )
        self.next_step = max(start, stop)


@dataclass
class Result:
    """What a shared-model run produced (the test-facing view of `simulate`)."""

    hash: str
    step_hashes: list[str]
    """The shared state's hash after each step applied beyond the resumed log."""
    records: list[tuple[int, list[Message]]]
    """Every complete step applied, resumed ones first: what the evaluator logs."""
    counter: ByteCounter
    sim: SharedModel = field(repr=False)


def simulate(
    cfg: Config,
    top: Topology | None = None,
    *,
    hash_every_step: bool = True,
    stop: int | None = None,
    resume: Records = (),
    protocol: Protocol | None = None,
) -> Result:
    """`simulation.simulate`'s contract on one model (no run directory): run every client of
    `cfg`, optionally stopped after `stop` steps or resumed from logged steps."""
    top = top or topo.build(cfg.topology)
    protocol = protocol or Protocol.of(cfg, top.diameter)
    sim = SharedModel(cfg, top, protocol, Workload.build(cfg))
    sim.resume(resume)
    records = [(s, list(m)) for s, m in resume]
    step_hashes: list[str] = []
    sim.listeners.append(lambda s, msgs: records.append((s, msgs)))
    if hash_every_step:
        sim.listeners.append(lambda s, _: step_hashes.append(state_hash(sim.w.model, sim.w.direction)))
    sim.run(stop)
    return Result(state_hash(sim.w.model, sim.w.direction), step_hashes, records, sim.counter, sim)


def run(cfg: Config, progress: bool = True) -> RunSummary:
    """The whole run of `cfg` into cfg.run.out_dir (config.yaml, log.bin, metrics.jsonl,
    checkpoints, summary.json); returns the summary. Refuses (CheckpointError, one line) a run
    directory whose log was written under other settings, as a launched run does."""
    started = time.monotonic()
    top = topo.topology_of(cfg)
    protocol = Protocol.of(cfg, top.diameter)
    w = Workload.build(cfg)
    log.info("task %s, %s split, label counts per client:\n%s", cfg.task.name, cfg.task.split, w.label_table())
    run_dir = RunDir.of(cfg)
    trajectory = proto.trajectory(cfg, protocol, w.train_digest())
    records = resume_records(run_dir, protocol, trajectory, w.loaded.base_hash, resume=cfg.checkpoint.resume)
    build.settle(run_dir, build.current(cfg.model.device, cfg.model.dtype), len(records))  # as rank 0 does
    header = log_header(cfg, trajectory, w.loaded.identity, w.loaded.base_hash)
    sim = SharedModel(cfg, top, protocol, w)
    sim.resume(records, run_dir.root)
    if records:
        log.info("resumed at step %d (%d logged steps)", len(records), len(records))
    start = len(records)
    evaluator = Evaluator(Settings.of(cfg), protocol, w, None, header, start_step=start, progress=progress, apply=False)
    step_hashes: list[str] = []
    sim.listeners.append(lambda s, msgs: evaluator.take(encode(msgs)))  # the attach client's push
    if cfg.run.hash_steps:
        sim.listeners.append(lambda s, _: step_hashes.append(state_hash(w.model, w.direction)))
    shown = [time.monotonic()]

    def on_client(t: int, node: int) -> None:  # a step of many clients on a large model takes a while
        if time.monotonic() - shown[0] >= 1.0:
            shown[0] = time.monotonic()
            evaluator.progress.show(clients=f"{node + 1}/{top.n}")

    sim.on_client = on_client
    try:
        evaluator.begin()
        sim.run(after_step=lambda t: evaluator.progress.advance_to(t + 1))
        final = evaluator.finish()
    finally:
        evaluator.close()
    n = top.n
    memory = machine.memory()
    # One model is every client's model: equal by construction (so consensus, distance 0.0, bit
    # identical), and the flood checked that every node held the same complete set of each step
    # before it was applied.
    reports = ClientReports(
        client_hashes=[final["param_hash"]] * n,
        consensus=True,
        client_step_hashes=[step_hashes] * n if cfg.run.hash_steps else None,
        # bytes_total counts topology edges only: a simulated run has no evaluator channel
        flood=[vars(f.stats) for f in sim.lockstep.floods],
        threads=[machine.threads()] * n,
        memory={"evaluator": memory, "clients": None, "process": memory},
    )
    summary = seedflood_summary(
        run_dir,
        top,
        protocol,
        sim.counter,
        final,
        evaluator.zero_shot,
        reports,
        hf_model=cfg.checkpoint.hf_model,
        resumed_from=sim.resumed_from,
        logged=start,
        started=started,
        roster=evaluator.roster,
        simulated="shared-model",  # one process, one model (launched runs do not have this key)
    )
    summary.write(run_dir)
    log.info("mean bytes per edge per step: %s", human_bytes(sim.counter.mean_bytes_per_edge_per_step()))
    return summary
