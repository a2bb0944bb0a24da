"""The `seedflood` commands that inspect a run directory: replay, check, eval.

Owns: rebuilding a run's model from base weights + its message log (replay, eval), verifying a
run directory without loading weights (check), and their summary lines or `--json` objects. A
log that ends in a torn record (a crash mid-append), or whole but short of what summary.json
and the checkpoints say the run did, is one line from each: a warning on stderr from replay and
eval (which apply its whole steps), the error that makes check refuse the directory
(rundir.torntail: after which step, and what disagrees). Replay and eval can also leave
origins out (`--exclude ORIGIN [--from STEP]`, un-training): every message of those origins at
steps >= STEP is dropped and the rest applied as logged; the output names what was left out and
says that the later scalars were measured on states that included it (EXCLUDE_NOTE).

Assumes: called by seedflood.cli's dispatch, which maps a known bad input to exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from seedflood.comm.identity import PublicRoster
    from seedflood.rundir.layout import RunDir
    from seedflood.rundir.logfile import Records

EXCLUDE_NOTE = (
    "the other origins' later scalars were measured on states that included the excluded updates: "
    "this is the logged run minus those updates, not the model the others would have trained without them"
)


def _found(path: str) -> RunDir:
    """The run directory a command reads (CheckpointError, one line, when `path` holds no log)."""
    from seedflood.rundir.layout import RunDir

    return RunDir.at(path)


def _exclusion(args: argparse.Namespace) -> tuple[list[int], int]:
    """The origins `--exclude` names (sorted, once each) and the step `--from` leaves them out
    from (0 by default); ConfigError for a `--from` without `--exclude` (nothing to leave out)."""
    from seedflood.core.config.configerror import ConfigError

    origins = sorted(set(args.exclude or ()))
    if args.from_step is not None and not origins:
        raise ConfigError(f"--from {args.from_step} needs --exclude ORIGIN: the origins to leave out from that step")
    return origins, 0 if args.from_step is None else args.from_step


def without(records: Records, origins: list[int] | set[int], start: int) -> tuple[Records, int]:
    """`records` with every message of `origins` at steps >= `start` left out (the steps
    themselves kept, possibly empty), and how many messages were left out."""
    drop = set(origins)
    kept: Records = []
    left_out = 0
    for step, msgs in records:
        if step >= start and drop:
            keep = [m for m in msgs if m.origin not in drop]
            left_out += len(msgs) - len(keep)
            msgs = keep
        kept.append((step, msgs))
    return kept, left_out


def _rebuild(run: RunDir, steps: int | None, exclude: list[int] | None = None, start: int = 0):
    """Config, workload, number of steps applied, the log's (whole steps, torn tail bytes), and
    the messages left out, rebuilt from base + log (resume.recorded_log: config.yaml must match
    the log header; every record passes the wire's validation). `exclude`: origins whose messages
    at steps >= `start` are left out (CheckpointError for an origin the run does not have or a
    `start` outside 0..steps logged); the rest is applied as logged, in canonical order."""
    from seedflood.core.flood.protocol import trajectory
    from seedflood.core.zo.replay import Applier
    from seedflood.ml.workload import Workload
    from seedflood.rundir import resume
    from seedflood.rundir.layout import CheckpointError

    cfg, proto = resume.recorded(run)
    n_origins = proto.ids  # the founders, and the new ids churn.max_nodes lets join
    if bad := [o for o in exclude or () if not 0 <= o < n_origins]:
        raise CheckpointError(f"--exclude {bad[0]}: the run has {n_origins} clients (origins 0..{n_origins - 1})")
    w = Workload.build(cfg)
    records, torn = resume.recorded_log(run, proto, trajectory(cfg, proto, w.train_digest()), w.loaded.base_hash)
    logged = len(records)
    if steps is not None:
        if not 0 <= steps <= len(records):
            raise CheckpointError(f"--step {steps} is outside 0..{len(records)} (steps in the log)")
        records = records[:steps]
    left_out = 0
    if exclude:
        if not 0 <= start <= logged:
            raise CheckpointError(f"--from {start} is outside 0..{logged} (steps in the log)")
        records, left_out = without(records, exclude, start)
    Applier(w.direction, proto).apply_all(records)
    return cfg, w, len(records), (logged, torn), left_out


def _excluded(origins: list[int], start: int, left_out: int) -> dict[str, Any]:
    """The `--json` object of an exclusion: what was left out, and the note (EXCLUDE_NOTE)."""
    return {"origins": origins, "from_step": start, "messages_left_out": left_out, "note": EXCLUDE_NOTE}


def _excluded_rows(origins: list[int], start: int, left_out: int) -> list[tuple[str, str]]:
    """The summary lines of an exclusion: what was left out, and the note (EXCLUDE_NOTE)."""
    who = f"origin{'s' if len(origins) > 1 else ''} {', '.join(map(str, origins))}"
    return [
        ("excluded", f"{who} from step {start}: {left_out} logged messages left out"),
        ("note", EXCLUDE_NOTE),
    ]


def _warn_torn(run: RunDir, log: tuple[int, int], param_hash: str | None = None) -> None:
    """One line on stderr when the log ends in a torn record, or whole but short of the run (see
    the module docstring); `param_hash`: the state after every whole step, compared with
    summary.json's."""
    from seedflood.rundir.torntail import short_log_line, torn_tail_line

    logged, torn = log
    if line := torn_tail_line(run, logged, torn, param_hash) if torn else short_log_line(run, logged):
        print(f"seedflood: warning: {line}", file=sys.stderr)


def _unproven(run: RunDir) -> str | None:
    """A signed run: the line naming the first logged step its signatures do not prove (None:
    every step is proven, or the run is unsigned; roles/sealcheck.py)."""
    from seedflood.roles.sealcheck import unproven
    from seedflood.rundir import resume

    proto = resume.recorded(run)[1]
    return unproven(run.log, proto, proto.churn)


def _warn_unproven(run: RunDir) -> None:
    """replay: one line on stderr when a signed run's log holds a step its signatures do not prove."""
    if line := _unproven(run):
        print(f"seedflood: warning: {line}", file=sys.stderr)


def _writable_dir(path: Path) -> None:
    """Raise CheckpointError unless `path` can be created (or is a directory we can write)."""
    from seedflood.rundir.layout import CheckpointError, unwritable

    if why := unwritable(path):
        raise CheckpointError(f"cannot write {path}: {why}")


def cmd_replay(args: argparse.Namespace) -> int:
    from seedflood.core.zo.replay import state_hash

    origins, start = _exclusion(args)
    if args.out:
        _writable_dir(Path(args.out))
    run = _found(args.run_dir)
    cfg, w, n, log, left_out = _rebuild(run, args.step, origins, start)
    digest = state_hash(w.model, w.direction)
    _warn_torn(run, log, digest if n == log[0] and not origins else None)  # an un-trained hash is not the run's
    _warn_unproven(run)
    if args.out:
        from seedflood.ml import model

        model.save(w.loaded, Path(args.out), w.direction.effective_tensors())
    result: dict[str, Any] = {"steps": n, "param_hash": digest, **({"out": args.out} if args.out else {})}
    if origins:
        result["excluded"] = _excluded(origins, start, left_out)
    if args.json:
        print(json.dumps(result))
        return 0
    _print_fields(
        [
            ("run directory", args.run_dir),
            ("replayed", f"{n} logged steps applied to the base model"),
            *(_excluded_rows(origins, start, left_out) if origins else []),
            ("param hash", digest),
            *([("model directory", args.out)] if args.out else []),
        ]
    )
    return 0


def _given_roster(path: str | None) -> PublicRoster | None:
    """`check --roster`'s roster (None when not given); IdentityError (one line) when the file is
    not one `seedflood keys` wrote."""
    if path is None:
        return None
    from seedflood.comm import identity

    return identity.load_roster(Path(path))


def _roster_differs(run: RunDir, roster: PublicRoster, name: str) -> str | None:
    """How the roster the log header records differs from `roster`, read from `name` (None: the
    same keys)."""
    from seedflood.roles.identities import roster_differs
    from seedflood.rundir.logheader import read_header

    return roster_differs(read_header(run.log), roster, name)


def cmd_check(args: argparse.Namespace) -> int:
    """Verify a run directory without loading weights: config.yaml against the log header, every
        log record, every checkpoint's checksum, and a log that ends whole and not short of the run
        (a torn tail, or a summary or checkpoint past its end, is refused with its line,
        rundir.torntail), and in a signed run every step's seals (roles/sealcheck.py: a step they do not
    prove is refused with its line); with `--roster`, a log whose header records another roster
    than that file's (or none) is refused first (identities.roster_differs: one line naming what
    differs). Exit 2 naming the first problem."""
    from seedflood.core.flood.protocol import trajectory
    from seedflood.ml import sampling
    from seedflood.rundir import checkpoints as ckpt
    from seedflood.rundir import resume
    from seedflood.rundir.layout import CheckpointError
    from seedflood.rundir.logfile import LogReader
    from seedflood.rundir.logheader import header_checked
    from seedflood.rundir.torntail import short_log_line, torn_tail_line

    roster = _given_roster(args.roster)  # a malformed roster file: one line before the run is read
    run = _found(args.run_dir)
    cfg, proto = resume.recorded(run)
    if roster is not None and (differs := _roster_differs(run, roster, args.roster)):
        raise CheckpointError(f"{run.log}: {differs}")
    digest = sampling.train_digest(sampling.load_splits(cfg.task, cfg.run.seed))
    records, torn = resume.recorded_log(run, proto, trajectory(cfg, proto, digest))
    found = ckpt.checkpoints(run.root)
    bad = [why for c in found if (why := ckpt.verify(c))]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise CheckpointError(bad[0] + more)
    if torn:  # legitimate after a crash, but not a whole run directory: never "OK"
        raise CheckpointError(torn_tail_line(run, len(records), torn))
    if short := short_log_line(run, len(records)):  # whole records, but fewer than the run wrote
        raise CheckpointError(short)
    if line := _unproven(run):  # a signed run: every step proven against the header's roster, or not OK
        raise CheckpointError(line)
    signed = "trust" in LogReader(run.log).read()[0]
    if not header_checked(run.log):
        print(
            "seedflood: note: log.bin predates log header checksums (a legacy log): its header is read unchecked",
            file=sys.stderr,
        )
    names = [c.name for c in found]
    if args.json:
        print(
            json.dumps(
                {"ok": True, "steps": len(records), "checkpoints": names}
                | ({"signed": True} if signed else {})
                | ({"roster": args.roster} if roster is not None else {})
            )
        )
        return 0
    against = (
        f"{args.roster} (the log header records the same)" if roster is not None else "the roster in the log header"
    )
    _print_fields(
        [
            ("run directory", str(run.root)),
            ("verdict", "OK: config.yaml matches the log header; every log record and checkpoint checksum is valid"),
            *([("signatures", f"every step proven against {against}")] if signed else []),
            ("steps logged", str(len(records))),
            ("checkpoints", f"{len(names)}" + (f" ({', '.join(names)})" if names else "")),
        ]
    )
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from seedflood.rundir.metrics import PhaseProgress

    origins, start = _exclusion(args)
    run = _found(args.run_dir)
    cfg, w, n, log, left_out = _rebuild(run, args.step, origins, start)
    _warn_torn(run, log)
    with PhaseProgress(f"scoring step {n} (dev + test)") as bar:
        m = w.score_splits(on_examples=bar.update)[1]["metrics"]
    if args.json:
        print(json.dumps({"steps": n, **m, **({"excluded": _excluded(origins, start, left_out)} if origins else {})}))
        return 0

    def fmt(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f}"

    shares = ", ".join(f"{f:.2f}" for f in m["pred_frac"])
    _print_fields(
        [
            ("run directory", args.run_dir),
            ("scored", f"the model after {n} logged steps, on {m['n']} test examples"),
            *(_excluded_rows(origins, start, left_out) if origins else []),
            (
                "accuracy",
                f"{fmt(m['accuracy'])}  AUC {fmt(m['auc'])}  dev-threshold accuracy {fmt(m['threshold_accuracy'])}",
            ),
            ("loss", f"{m['loss']:.4f} (mean cross-entropy, nats)"),
            ("predictions", f"{shares} (share per label)"),
        ]
    )
    return 0


def _print_fields(rows: list[tuple[str, str]]) -> None:
    """`label:  value` lines, the values aligned in one column."""
    width = max(len(label) for label, _ in rows) + 2
    for label, value in rows:
        print(f"{label + ':':<{width}}{value}")
