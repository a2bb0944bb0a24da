"""Whether and how a run directory may be continued under a config.

Owns the decisions about an existing run directory, made before anything is written to it:
- the header a run's log carries (base model identity and hash, the trajectory fingerprint of
  `protocol.trajectory`, and the full config for the record);
- `resume_records`: the complete steps to resume from. A log written under other trajectory
  settings, a corrupt log (any record that fails the wire's validation, or corruption before
  the end), a log longer than `run.steps`, or an existing run while `checkpoint.resume` is off
  each raise `CheckpointError` with one line, and nothing on disk changes;
- `checkpoint_notes`: one line per checkpoint that a resume would skip because it is corrupt;
- `recorded` / `recorded_steps` / `recorded_log`: what replay, eval and check read back: the
  recorded config and every logged step (and the bytes of a torn tail after them, which those
  commands report: torntail.py), refusing a `config.yaml` edited away from the settings in the
  log header;
- `topology_of(cfg)`: the graph a config names (a file resolves against the config's directory);
- `summary_common`: the summary.json keys a launched and a simulated run write alike;
- the clients' own logs of a churn run (eval.client_logs, `client_root/node-N/`: config.yaml,
  log.bin, report.json): `ClientLog` (a client's writer), `client_report`, `steps_from_clients`
  (the longest one on this disk that belongs to the run and agrees with its log) and
  `complete_from_clients` (rank 0 appends what only they hold before it resumes).
`seedflood world-size` (the launchers' preflight) and rank 0 of `seedflood train` both call it,
so a bad resume stops before any process starts.

Assumes: the log is the source of truth (a run is a pure function of base weights, settings and
log); checkpoints only shorten catch-up.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from seedflood.core import config as config_mod
from seedflood.core import lockstep
from seedflood.core import topology as topo
from seedflood.core.config import Config
from seedflood.core.graph import Topology
from seedflood.core.membership import Change, Roster
from seedflood.core.message import Message
from seedflood.core.protocol import Protocol
from seedflood.core.protocol import trajectory as trajectory_of
from seedflood.core.transport import ByteCounter
from seedflood.rundir import checkpoints as ckpt
from seedflood.rundir.atomic import atomic_write_text
from seedflood.rundir.layout import CheckpointError, find_run_dir
from seedflood.rundir.logfile import LogReader, LogWriter
from seedflood.rundir.logheader import header_mismatch, read_header

log = logging.getLogger(__name__)

LOG = "log.bin"
Records = list[tuple[int, list[Message]]]


def topology_of(cfg: Config) -> Topology:
    """The client graph of `cfg`, checked against `topology.nodes`."""
    base = Path(cfg.source).parent if cfg.source else None
    top = topo.build(cfg.topology, base_dir=base)
    topo.check_nodes(top, cfg.topology.nodes)
    return top


def log_header(cfg: Config, trajectory: dict[str, Any], base_identity: str, base_hash: str) -> dict[str, Any]:
    return {
        "base_identity": base_identity,
        "base_hash": base_hash,
        "trajectory": trajectory,
        "config": cfg.to_dict(),
    }


def resume_records(
    cfg: Config, protocol: Protocol, trajectory: dict[str, Any], base_hash: str | None = None
) -> Records:
    """The logged steps this run continues from ([] for a new run directory); see the module doc.

    `base_hash` None (the preflight, which loads no weights) skips the base model comparison.
    """
    run_dir = Path(cfg.run.out_dir)
    path = run_dir / LOG
    if not path.is_file():
        return []
    if not cfg.checkpoint.resume:
        raise CheckpointError(
            f"{run_dir} already holds a run and checkpoint.resume is false: choose another run.out_dir or delete it"
        )
    old = read_header(path)
    new = {"trajectory": trajectory, "base_hash": base_hash if base_hash is not None else old.get("base_hash")}
    if diff := header_mismatch(old, new):
        raise CheckpointError(
            f"{path} belongs to a different run: settings differ: {', '.join(diff)}; "
            "use a new run.out_dir or delete the directory"
        )
    _, records = LogReader(path).read(check=protocol.check_step)
    if len(records) > protocol.steps:
        raise CheckpointError(
            f"{path} already holds {len(records)} steps, more than run.steps={protocol.steps}: "
            f"set run.steps >= {len(records)} or use a new run.out_dir"
        )
    return records


def logged_changes(cfg: Config) -> dict[int, Change]:
    """The membership changes (step -> Change) of the run directory's log (churn runs)."""
    reader = LogReader(Path(cfg.run.out_dir) / LOG)
    reader.read()
    return reader.changes


def checkpoint_notes(cfg: Config, logged: int) -> list[str]:
    """One line per corrupt checkpoint a resume after `logged` steps would skip."""
    run_dir = Path(cfg.run.out_dir)
    if not run_dir.is_dir():
        return []
    return ckpt.usable_checkpoint(run_dir, logged)[1]


def recorded(run_dir: Path) -> tuple[Config, Protocol]:
    """The config a run directory recorded (config.yaml) and the protocol it implies."""
    cfg = config_mod.load(find_run_dir(run_dir) / "config.yaml", recorded=True)
    return cfg, Protocol.of(cfg, topology_of(cfg).diameter)


def recorded_steps(
    run_dir: Path, cfg: Config, protocol: Protocol, train_digest: str, base_hash: str | None = None
) -> Records:
    """Every logged step, each validated like a frame from the wire, once config.yaml is shown to
    describe the trajectory the log header recorded (an edited config.yaml names the keys).
    `base_hash` None skips the base model comparison (no weights loaded)."""
    return recorded_log(run_dir, cfg, protocol, train_digest, base_hash)[0]


def recorded_log(
    run_dir: Path, cfg: Config, protocol: Protocol, train_digest: str, base_hash: str | None = None
) -> tuple[Records, int]:
    """`recorded_steps`, and the bytes of a torn tail past the last whole record (0: none)."""
    path = run_dir / LOG
    header = read_header(path)
    mine = {"trajectory": trajectory_of(cfg, protocol, train_digest), "base_hash": base_hash or header.get("base_hash")}
    if diff := header_mismatch(header, mine):
        raise CheckpointError(
            f"{run_dir}/config.yaml does not match the settings {LOG} was written with: {', '.join(diff)}"
        )
    reader = LogReader(path)
    records = reader.read(check=protocol.check_step)[1]
    return records, reader.torn


def summary_common(
    cfg: Config,
    top: Topology,
    protocol: Protocol,
    counter: ByteCounter,
    final: dict[str, Any],
    zero_shot: dict[str, Any],
    resumed_from: int,
    logged: int,
    started: float,
    roster: Roster | None = None,
) -> dict[str, Any]:
    """The summary.json keys a launched and a simulated SeedFlood run write alike: the run's shape,
    its bytes (per directed topology edge; `counter` as the transport counted them), the final
    and zero-shot scores, where its outputs are, and the run-directory contract that
    `seedflood compare` reads. Callers add the keys that differ (client hashes, flood stats,
    threads, memory, consensus). `resumed_from`: the step of the checkpoint the run's state was
    restored from (0: none, the base weights); `logged`: the logged steps it continued after
    (replayed from that checkpoint; 0: a new run); `started`: time.monotonic() at the run's
    start; `roster`: the evaluator's (who left, and every membership change, in a churn run)."""
    run_dir = Path(cfg.run.out_dir)
    cumulative = lockstep.cumulative_per_edge(counter, 2 * len(top.edges), protocol.steps)
    common = {
        "algorithm": "seedflood",
        "steps": protocol.steps,
        "clients": top.n,
        "topology": top.name,
        "diameter": top.diameter,
        "delay": protocol.delay,
        "param_hash": final["param_hash"],
        "bytes_per_edge": {f"{a}->{b}": v for (a, b), v in sorted(counter.per_edge_total().items()) if b >= 0},
        "bytes_per_edge_per_step": counter.mean_bytes_per_edge_per_step(),
        "bytes_total": counter.total(),
        "zero_shot": zero_shot or None,
        "final": final,
        "resumed_from_step": resumed_from,  # the checkpoint restored, not the log's length
        "resumed_log_steps": logged,
        "left": sorted(set(top.nodes) - set(roster.members)) if roster else [],
        "membership_changes": [c.describe() for _, c in sorted(roster.changes.items())] if roster else [],
        "model_dir": str(ckpt.latest(run_dir) / "hf") if cfg.checkpoint.hf_model else None,
        "log": str(run_dir / LOG),
        # the run-directory contract every algorithm writes (seedflood compare reads these)
        "bytes_per_edge_run": cumulative[-1] if cumulative else 0.0,
        "bytes_per_edge_cumulative": cumulative,
        "wall_seconds": round(time.monotonic() - started, 2),
    }
    return common


# -- the clients' own logs (churn runs, eval.client_logs) -----------------------------------------
REPORT = "report.json"


def client_root(cfg: Config) -> Path | None:
    """Where the clients keep their own logs (eval.client_logs against run.out_dir); None = off."""
    if not cfg.eval.client_logs:
        return None
    root = Path(cfg.eval.client_logs).expanduser()
    return root if root.is_absolute() else Path(cfg.run.out_dir) / root


def client_dir(cfg: Config, node: int) -> Path | None:
    root = client_root(cfg)
    return None if root is None else root / f"node-{node}"


class ClientLog:
    """One client's own copy of the agreed log, on its own disk: a directory `seedflood replay`
    reads like a run directory (config.yaml, log.bin in logfile.py's format, CRC-checked
    records, membership records before their steps) plus the client's final report.

    `extend(history, changes)` appends every decided step it lacks (flushed per step, fsynced
    by `close`). A restarted incarnation (or a relaunch) reopens the log its predecessor left;
    its records are compared with the history as the history reaches them, and a difference
    (never expected: agreed steps are final) cuts the log there after keeping a copy: never two
    histories in one file. One process writes a node's log at a time (an flock; a second one keeps none and says
    so). Never raises into training: a disk failure is one warning and the copy stops.

    Assumes: the caller hands the same `history` list (Churn.history: every decided step from 0)."""

    def __init__(self, cfg: Config, protocol: Protocol, header: dict[str, Any], node: int) -> None:
        self.node = node
        self.dir = client_dir(cfg, node)
        self.writer: LogWriter | None = None
        self._lock: Any = None
        self._held: Records | None = None  # the records a reopened log held (read at the first extend)
        self._verified = 0  # of them, those found equal to the history so far
        self._owned = False  # this process took the node's directory (its flock)
        if self.dir is None:
            return
        try:
            import fcntl

            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock = open(self.dir / ".lock", "w")
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                self._lock.close()
                self._lock = None
                log.warning("node %d: %s is held by another process of this node: no client log here", node, self.dir)
                return
            self._owned = True
            (self.dir / REPORT).unlink(missing_ok=True)  # a report left by an earlier launch is not this one's
            atomic_write_text(self.dir / "config.yaml", config_mod.dump(cfg))
            try:
                self.writer = LogWriter(self.dir / LOG, header, check=protocol.check_step)
            except CheckpointError as e:  # another run's or a damaged log: keep it aside, start anew
                aside = self.dir / f"{LOG}.{int(time.time())}.bad"
                (self.dir / LOG).rename(aside)
                log.warning("node %d: client log %s set aside (%s)", node, aside, e)
                self.writer = LogWriter(self.dir / LOG, header, check=protocol.check_step)
        except OSError as e:
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        log.warning("node %d: client log in %s stopped: %s", self.node, self.dir, e)
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError:
                pass
        self.writer = None

    def extend(self, history: list[tuple[int, list[Message]]], changes: dict[int, Change]) -> None:
        """Append the steps of `history` the log lacks; steps the log already held (a reopened
        log) are compared with the history as it reaches them (see the class docstring)."""
        w = self.writer
        if w is None:
            return
        try:
            if self._held is None:
                self._held = LogReader(w.path).read()[1] if w.next_step else []
            while self._verified < min(len(history), len(self._held)):
                s = self._verified
                if sorted(history[s][1]) != sorted(self._held[s][1]):
                    self._cut(s)
                    break
                self._verified += 1
            for s, msgs in history[w.next_step :]:
                w.append(s, msgs, changes.get(s))
        except (OSError, CheckpointError) as e:
            self._fail(e)

    def _cut(self, step: int) -> None:
        """The reopened log differs from the history at `step` (never expected: agreed steps are
        final): keep a copy, cut the log there."""
        w = self.writer
        assert w is not None and self._held is not None
        aside = w.path.with_name(f"{LOG}.{int(time.time())}.old")
        shutil.copyfile(w.path, aside)
        log.warning(
            "node %d: client log differs from the decided steps at step %d: cut there (the old log is kept as %s)",
            self.node,
            step,
            aside,
        )
        w.truncate_to(step)
        del self._held[step:]

    def report(self, value: dict[str, Any]) -> None:
        """Leave the final (or stop) report next to the log, for an evaluator that reads this disk
        (after `close` too: the report comes once training and the transport are done)."""
        if self.dir is None or not self._owned:
            return
        try:
            atomic_write_text(self.dir / REPORT, json.dumps(value))
        except OSError as e:
            log.warning("node %d: could not write %s: %s", self.node, self.dir / REPORT, e)

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError as e:
                log.warning("node %d: client log close failed: %s", self.node, e)
            self.writer = None
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None


def client_report(cfg: Config, node: int, since: float | None = None) -> dict[str, Any] | None:
    """The final report node `node` left next to its client log, if this disk holds one
    (written at or after `since`, a time.time(), when given: not one an earlier launch left)."""
    d = client_dir(cfg, node)
    try:
        if d is None or (since is not None and (d / REPORT).stat().st_mtime < since):
            return None
        return json.loads((d / REPORT).read_text())
    except (OSError, ValueError):
        return None


def steps_from_clients(
    root: Path | None, protocol: Protocol, header: dict[str, Any], own: Path
) -> tuple[Path, Records, dict[int, Change]] | None:
    """The longest client log readable on this disk that belongs to this run (its header's
    settings and base model equal `header`'s), reads whole (CRC and every step checked as from the
    wire) and agrees with the run directory's own log `own` on every step both hold; with its
    records and changes. None when no client log qualifies (each refusal is one warning).
    `root`: where the clients keep their logs (`client_root`), None = nowhere."""
    if root is None or not root.is_dir():
        return None
    mine_reader = LogReader(own)
    _, mine = mine_reader.read() if own.is_file() else ({}, [])
    best: tuple[Path, Records, dict[int, Change]] | None = None
    for path in sorted(root.glob(f"node-*/{LOG}")):
        try:
            if diff := header_mismatch(read_header(path), header):
                raise CheckpointError(f"settings differ: {', '.join(diff)}")
            reader = LogReader(path)
            _, records = reader.read(check=protocol.check_step)
        except (OSError, CheckpointError) as e:
            log.warning("client log %s not used: %s", path, e)
            continue
        differs = next(
            (
                s
                for (s, a), (_, b) in zip(mine, records)
                if sorted(a) != sorted(b) or mine_reader.changes.get(s) != reader.changes.get(s)
            ),
            None,
        )
        if differs is not None:
            log.warning("client log %s not used: it differs from %s at step %d", path, own, differs)
            continue
        if best is None or len(records) > len(best[1]):
            best = (path, records, reader.changes)
    return best


def complete_from_clients(cfg: Config, protocol: Protocol, header: dict[str, Any], records: Records) -> Records:
    """Rank 0 before a churn run (re)starts: append to the run directory's log the steps that
    only a client log on this disk holds (`steps_from_clients`), so that neither a restarted
    evaluator nor a whole relaunch continues from less than what was agreed. Returns the
    records, extended."""
    own = Path(cfg.run.out_dir) / LOG
    found = steps_from_clients(client_root(cfg), protocol, header, own)
    if found is None or len(found[1]) <= len(records):
        return records
    path, theirs, changes = found
    writer = LogWriter(own, header, check=protocol.check_step)
    try:
        writer.truncate_to(len(records))  # a torn or unchecked tail past the records resumed from
        for s, msgs in theirs[len(records) :]:
            writer.append(s, msgs, changes.get(s))
    finally:
        writer.close()
    log.warning("evaluator: took steps %d..%d from the client log %s", len(records), len(theirs) - 1, path)
    return list(theirs)
