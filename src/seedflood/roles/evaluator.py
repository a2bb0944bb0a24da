"""The evaluator role (rank 0): follows the flood, logs it, scores and checkpoints the consensus.

Owns: the run directory while a run is live. For each complete step pushed by its attach client
it validates the step (`Protocol.check_step`: every origin, every k, the next step in order),
applies it to its own copy of the canonical state, appends it to the message log (flushed per
step, fsynced at each checkpoint), and every `eval.every` steps scores the model on the dev and
test splits (each metrics line with the roster's size), and writes a metrics line for each
committed roster change (`membership_record`); every `checkpoint.every` steps it writes a checkpoint (the newest `KEEP` are kept,
so a corrupt one can fall back to the one before). It trains nothing and never takes part in a
hop, so it cannot slow the clients down: frames wait in its inbox while it scores, and the
progress bar follows the clients (frames received), not the scoring; each scoring shows its own
progress over the examples (`PhaseProgress`: a second bar on a terminal, a line every 15 s in a log).

Two ways to be fed: `run()` follows an inbox (the launched run: frames pushed by the attach
client, applied to the evaluator's own model copy); or, with `apply=False` and no inbox, the
owner of a model it shares drives it (`sharedmodel`, the one-process simulation): `begin()`,
`take(frame)` right after the owner applied that step to the shared model, `finish()`. Both
validate, log, score and checkpoint with the same code, so the run directory is the same.

In a signed run (`trust.sign`) it trusts no client it follows: each step is verified before it
is applied (`certificate.StepVerifier`: every message signed by its origin and, under churn, a
certificate of signed votes proving the commit); a step that fails is refused and counted, never
applied or logged, and the evaluator stops with one line naming the client that sent it and the
step (the attach node is a function of the committed roster: no other client would stream to
it). The log keeps each step's seals (logrecords.py, seal records) for replay and check.

A churn run's evaluator whose stream ends short (the clients finished while it was down or
starting) takes the missing steps from the longest client log on its disk (`take_from_clients`,
`clientlog.steps_from_clients`), validated as from the wire, so they are logged, scored and
checkpointed as streamed ones.

It is handed only what it reads (`Settings`: the run directory with where client logs lie,
the eval and checkpoint sections, the stream's timeout) and the config as recorded, which it
writes (config.yaml, each checkpoint's meta) but never reads.

Assumes: frames arrive in step order from one attach client (the transport keeps order);
`resume.resume_records` has already accepted the run directory for this config.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seedflood.core.churn.certificate import StepVerifier
from seedflood.core.config import runconfig as config_mod
from seedflood.core.config.runconfig import CheckpointConfig, Config, EvalConfig
from seedflood.core.flood import stepstream
from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.transport import Inbox, TransportError
from seedflood.core.membership.roster import Change
from seedflood.core.wire import message
from seedflood.core.wire.message import Message
from seedflood.core.zo.replay import Applier, state_hash
from seedflood.ml import model
from seedflood.ml.workload import Workload
from seedflood.rundir import checkpoints as ckpt
from seedflood.rundir.atomic import atomic_dir, atomic_write_text
from seedflood.rundir.clientlog import steps_from_clients
from seedflood.rundir.health import HealthReader
from seedflood.rundir.layout import LOG, CheckpointError, RunDir
from seedflood.rundir.logfile import LogReader, LogWriter
from seedflood.rundir.metrics import (
    MEMBERSHIP,
    MetricsWriter,
    PhaseProgress,
    Progress,
    human_bytes,
    truncate_metrics,
)
from seedflood.rundir.trackers import open_trackers

log = logging.getLogger(__name__)

KEEP = 2
"""Checkpoints kept on disk: the newest, and one to fall back to if it is found corrupt."""

HEALTH_EVERY_S = 1.0
"""A churn run's health goes to the sinks at most this often (seconds; the clients' status
records it is read from are rewritten about once a second), and after the last step."""

Logged = Sequence[tuple[int, Sequence[Message]]]
"""(step, its messages) of logged steps, in order: a log read back (rundir.logfile.Records) or a
slice of one an in-process run holds; only read."""


class EvaluatorError(RuntimeError):
    """The stream from the attach client broke the protocol (gap, incomplete step)."""


@dataclass(frozen=True)
class Settings:
    """What the evaluator reads of a run's config, and nothing more."""

    run: RunDir  # its paths, and where the clients' own logs lie on this disk (run.clients)
    eval: EvalConfig  # every (scoring period, steps), attach (its first attach node)
    checkpoint: CheckpointConfig  # every (steps), hf_model
    timeout_s: float  # the wait for the next frame from an inbox that does not watch its sender (transport.timeout_s)
    recorded: dict[str, Any]  # the whole config as the run records it: written, never read

    @classmethod
    def of(cls, cfg: Config) -> Settings:
        return cls(RunDir.of(cfg), cfg.eval, cfg.checkpoint, cfg.transport.timeout_s, cfg.to_dict())


@dataclass(frozen=True)
class Restored:
    """Where `restore_run` brought a workload: to the state after `steps` logged steps, from the
    checkpoint of step `checkpoint` (0: none, the base weights) plus a replay of the steps after it."""

    steps: int
    checkpoint: int


def restore(w: Workload, protocol: Protocol, run_dir: Path, records: Logged) -> int:
    """`restore_run`, returning len(records): the step the run continues from."""
    return restore_run(w, protocol, run_dir, records).steps


def restore_run(w: Workload, protocol: Protocol, run_dir: Path, records: Logged) -> Restored:
    """Bring `w` to the state after `records`: the newest intact checkpoint within them plus a
    replay of the rest (or all of them from the base weights)."""
    applier = Applier(w.direction, protocol)
    start = 0
    found, skipped = ckpt.usable_checkpoint(run_dir, len(records)) if run_dir.is_dir() else (None, [])
    for note in skipped:
        log.warning("%s; falling back to an older checkpoint or the log", note)
    if found is not None:
        meta = ckpt.read_meta(found)
        if meta.get("base_hash") != w.loaded.base_hash:
            raise CheckpointError(f"{found}: base model hash differs from this run's model")
        state = ckpt.load_state(found / "state.pt", meta["state_sha256"])
        params = dict(w.model.named_parameters())
        for name in w.direction.names:
            params[name].data.copy_(state[name])
        extra = set(w.direction.extra_state())
        w.direction.load_extra_state({k: v for k, v in state.items() if k in extra})
        if state_hash(w.model, w.direction) != meta["param_hash"]:
            raise CheckpointError(f"{found}: restored state does not have the hash its meta.json records")
        start = meta["step"]
        log.info("restored checkpoint %s; replaying %d logged steps after it", found.name, len(records) - start)
    applier.last_step = start - 1
    applier.apply_all(records[start:])
    return Restored(len(records), start)


def membership_record(step: int, change: Change, members: int) -> dict[str, Any]:
    """The metrics line of a committed roster change (`MEMBERSHIP` event): at the change's step,
    the roster's size after it and the joins and leaves it counts (TensorBoard: roster/members,
    roster/joins, roster/leaves), and the change in words."""
    return {
        "step": step,
        "event": MEMBERSHIP,
        "members": members,
        "joins": len(change.join),
        "leaves": len(change.leave),
        "change": change.describe(),
    }


class Evaluator:
    def __init__(
        self,
        settings: Settings,
        protocol: Protocol,
        workload: Workload,
        inbox: Inbox | None,
        header: dict[str, Any],
        start_step: int = 0,
        progress: bool = True,
        apply: bool = True,
        verifier: StepVerifier | None = None,
    ) -> None:
        """`apply` False: the workload's state is advanced by the caller (a model shared with
        the simulated clients, `sharedmodel`), which calls `take` right after applying that step,
        so every score and checkpoint sees the state after it; `inbox` is then None and the
        caller moves `progress` itself. `verifier`: a signed run's check of every step before it
        is taken (None: unsigned, every step is taken as its sender's)."""
        self.settings = settings
        self.apply = apply
        self.protocol = protocol
        self.w = workload
        self.inbox = inbox
        self.header = header
        self.run_dir = settings.run
        self.applier = Applier(workload.direction, protocol)
        self.applier.last_step = start_step - 1
        self.next_step = start_step
        self.log = LogWriter(self.run_dir.log, header, check=protocol.check_step)
        self.log.truncate_to(start_step)
        self.roster = protocol.roster(attach=settings.eval.attach)
        """Members of the next step; a churn run's steps carry their changes (logged with them)."""
        for s in sorted(self.log.changes):
            self.roster.apply(self.log.changes[s])
        self.verifier = verifier
        if verifier is not None and start_step:  # the steps logged before are verified: chain on them
            reader = LogReader(self.run_dir.log)
            for s, msgs in reader.read()[1][:start_step]:
                verifier.extend(s, msgs, reader.changes.get(s))
        self.log_bytes = self.run_dir.log.stat().st_size
        # One history after a resume: keep the lines before start_step, and the line at start_step
        # unless this run scores that step again (zero-shot at 0, the final score at the end).
        rescored = start_step == 0 or start_step >= protocol.steps
        # A membership line of a step it takes again (step >= start_step) goes too: it is written again.
        truncate_metrics(self.run_dir.metrics, start_step - 1 if rescored else start_step, events_before=start_step)
        trackers = open_trackers(settings.eval.trackers, self.run_dir.root, settings.recorded, resume=start_step > 0)
        self.metrics = MetricsWriter(self.run_dir.metrics, tensorboard=self.run_dir.tensorboard, trackers=trackers)
        self.health = HealthReader(self.run_dir)
        """A churn run's health (rundir/health.py), to TensorBoard and the trackers as steps are taken:
        its clients' status records carry it (a strict run's carry none, and it writes nothing)."""
        self._health_at = 0.0  # time.monotonic() of the last health written
        self.joins = self.exclusions = 0  # members the committed changes of this evaluator's steps added, left out
        self.progress = Progress(protocol.steps, initial=start_step, enabled=progress)
        self.show_progress = progress
        """Also show each scoring's progress over its examples (PhaseProgress)."""
        if inbox is not None:
            inbox.on_frame = lambda: self.progress.advance_to(start_step + inbox.received)
        self.listeners: list[Callable[[int, list[Message], Change | None], None]] = []
        """Called with (step, messages, change) for each step taken, after it is logged."""
        self.last: dict[str, Any] = {}
        self.zero_shot: dict[str, Any] = {}
        self.t0 = time.monotonic()

    # -- scoring --------------------------------------------------------------------------------
    def score(self, step: int, **extra: Any) -> dict[str, Any]:
        """Evaluate the canonical model after `step` steps; writes one metrics line."""
        t = time.monotonic()
        with PhaseProgress(f"scoring step {step}", enabled=self.show_progress) as bar:
            m = self.w.scores(on_examples=bar.update)
        record = {
            "step": step,
            **m,
            "log_bytes": self.log_bytes,
            "members": len(self.roster.members),  # the roster of the last step taken (TensorBoard: roster/members)
            "eval_seconds": round(time.monotonic() - t, 2),
            "elapsed_seconds": round(time.monotonic() - self.t0, 2),
            **extra,
        }
        self.metrics.write(record)
        self.last = record
        auc = "n/a" if m["auc"] is None else f"{m['auc']:.3f}"
        thr = "" if m["threshold_accuracy"] is None else f", dev-threshold acc {m['threshold_accuracy']:.3f}"
        self.progress.write(f"step {step:5d}: test acc {m['accuracy']:.3f}, loss {m['loss']:.4f}, AUC {auc}{thr}")
        self.progress.show(eval_step=step, acc=m["accuracy"], loss=m["loss"])
        return record

    # -- the stream -----------------------------------------------------------------------------
    def take(self, frame: bytes) -> None:
        """One complete step from the attach client: validate, apply, log, maybe score/save."""
        step = self.next_step
        try:
            msgs, change, certificate = stepstream.decode_signed_step(frame, step, seed_of=self.protocol.seed)
            self._verify(step, msgs, change, certificate)
            if change:
                self.roster.apply(change)
            self.protocol.check_step(step, msgs, members=self.roster.members)
        except message.FrameError as e:
            raise EvaluatorError(f"evaluator: bad frame for step {step}: {e}") from None
        if change:
            log.warning("membership %s", change.describe())
        if self.apply:
            self.applier.apply(step, msgs)
        seals = None if self.verifier is None else stepstream.encode_seals(msgs, certificate or b"")
        self.log_bytes += self.log.append(step, msgs, change, seals)
        if change:
            self.metrics.write(membership_record(step, change, len(self.roster.members)))
            self.joins += len(change.join)
            self.exclusions += len(change.leave)
        self.next_step += 1
        for listener in self.listeners:
            listener(step, msgs, change)
        self.report_health(step)
        done = self.next_step
        self.progress.show(log=human_bytes(self.log_bytes))
        every, save_every = self.settings.eval.every, self.settings.checkpoint.every
        if every and done % every == 0 and done < self.protocol.steps:
            self.score(done)
        if save_every and done % save_every == 0 and done < self.protocol.steps:
            self.save(done)

    def report_health(self, step: int, force: bool = False) -> None:
        """A churn run's health at `step` to the sinks (never metrics.jsonl), at most every
        HEALTH_EVERY_S unless `force`: the clients' summed counters and the roster's changes."""
        if step < 0:
            return
        now = time.monotonic()
        if not force and now - self._health_at < HEALTH_EVERY_S:
            return
        self._health_at = now
        read = self.health.read()
        if not read["clients"] and not (self.joins or self.exclusions):
            return  # no client reports health (a strict run), and the roster has not changed
        self.metrics.health(step, {**read, "joins": float(self.joins), "exclusions": float(self.exclusions)})

    def _verify(self, step: int, msgs: list[Message], change: Change | None, certificate: bytes | None) -> None:
        """A signed run: refuse (count, and stop in one line) a step its sender cannot prove."""
        if self.verifier is None:
            return
        refusal = self.verifier.check(step, msgs, change, certificate, self.roster)
        if refusal is not None:
            sender = self.inbox.sender_of(step) if self.inbox is not None else "its feed"
            n = self.verifier.refused
            raise EvaluatorError(
                f"evaluator: refused step {step} from {sender}: {refusal.reason}; nothing of it is applied "
                f"or logged ({n} item{'' if n == 1 else 's'} refused)"
            )

    def run(self) -> dict[str, Any]:
        """Follow the stream to its end; returns the final metrics record. The inbox hands over
        the steps from `start_step` on, in order (a churn run's `attach.AttachInbox` merges a
        restarted evaluator's catch-up and every change of attach node into that)."""
        if self.inbox is None:
            raise ValueError("Evaluator.run follows an inbox; without one call begin / take / finish")
        self.begin()
        # An inbox that watches its sender (a churn run's attach edge: its heartbeat tells a dead
        # client from a slow step, as a hop may wait out a silent neighbour) ends or fails by
        # itself: wait for each frame as long as it takes.
        timeout = None if self.inbox.watches_sender else self.settings.timeout_s
        if self.next_step < self.protocol.steps:
            self.take_from_clients(whole=True)  # a restart after the clients finished: nobody streams
        while self.next_step < self.protocol.steps:
            try:
                frame = self.inbox.get(timeout=timeout)
            except TimeoutError as e:
                if self.take_from_clients():
                    break
                raise EvaluatorError(f"evaluator: {e} (after step {self.next_step - 1})") from None
            except TransportError:
                if self.take_from_clients():
                    break
                raise
            if frame is None:
                if self.take_from_clients():
                    break
                raise EvaluatorError(
                    f"evaluator: the stream ended after step {self.next_step - 1} of {self.protocol.steps}"
                )
            self.take(frame)
        return self.finish()

    def take_from_clients(self, whole: bool = False) -> bool:
        """Where the clients keep their own logs (a churn run; `RunDir.clients` None: they keep
        none): take the steps from `next_step` on from the longest client log readable on
        this disk (`clientlog.steps_from_clients`: this run's, CRC- and wire-checked, agreeing with
        this log), as if streamed; `whole`: only when it holds every step of the run (the clients
        are done). True when the run is complete then. What the stream could not bring (the
        clients finished while this evaluator was down or starting) is so never lost."""
        found = steps_from_clients(self.run_dir, self.protocol, self.header)
        if found is None:
            return False
        path, records, changes = found.path, found.records, found.changes
        if len(records) <= self.next_step or (whole and len(records) < self.protocol.steps):
            return False
        first = self.next_step
        for s, msgs in records[first:]:
            certificate = None  # unsigned: a signed run's verifier refuses it
            if s in found.seals:  # verified as if streamed: the seals the client logged with it
                msgs, certificate = stepstream.decode_seals(found.seals[s], msgs)
            self.take(stepstream.encode_step(msgs, changes.get(s), certificate))
        self.progress.advance_to(self.next_step)
        log.warning("evaluator: took steps %d..%d from the client log %s", first, self.next_step - 1, path)
        return self.next_step >= self.protocol.steps

    def begin(self) -> None:
        """Before the first step: the run's config.yaml, and the zero-shot score of a new run."""
        atomic_write_text(self.run_dir.config, config_mod.dump(self.settings.recorded))
        if self.next_step == 0:
            self.zero_shot = self.score(0, zero_shot=True)

    def finish(self) -> dict[str, Any]:
        """After the last step: the final score (with the state's hash) and checkpoint."""
        if self.next_step != self.protocol.steps:
            raise EvaluatorError(f"evaluator: finished after step {self.next_step - 1} of {self.protocol.steps}")
        self.progress.close()
        self.report_health(self.next_step - 1, force=True)
        final = self.score(self.next_step, final=True, param_hash=state_hash(self.w.model, self.w.direction))
        self.save(self.next_step)
        return final

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self, step: int) -> Path:
        """Checkpoint after `step` steps: state, meta, log prefix and (optionally) an HF model dir."""
        w = self.w
        self.log.sync()  # the log up to this step is durable before a checkpoint points past it
        target = ckpt.checkpoint_dir(self.run_dir.root, step)
        with atomic_dir(target) as tmp:
            state = {n: p.detach().cpu() for n, p in zip(w.direction.names, w.direction.params)}
            state.update(w.direction.extra_state())
            sha = ckpt.save_state(tmp / "state.pt", state)
            shutil.copyfile(self.run_dir.log, tmp / LOG)
            if self.settings.checkpoint.hf_model:
                model.save(w.loaded, tmp / "hf", w.direction.effective_tensors())
            meta = {
                "step": step,
                "base_identity": w.loaded.identity,
                "base_hash": w.loaded.base_hash,
                "param_hash": state_hash(w.model, w.direction),
                "state_sha256": sha,
                "config": self.settings.recorded,
            }
            atomic_write_text(tmp / "meta.json", json.dumps(meta, indent=1, sort_keys=True))
        ckpt.mark_latest(self.run_dir.root, target)
        ckpt.prune(self.run_dir.root, KEEP)
        log.info("checkpoint after step %d at %s", step, target)
        return target

    def close(self) -> None:
        self.metrics.close()
        self.log.close()
        self.progress.close()
