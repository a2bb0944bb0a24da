"""The `seedflood` commands that inspect a run directory: replay, check, eval.

Owns: rebuilding a run's model from base weights + its message log (replay, eval), verifying a
run directory without loading weights (check), and their summary lines or `--json` objects. A
log that ends in a torn record (a crash mid-append), or whole but short of what summary.json
and the checkpoints say the run did, is one line from each: a warning on stderr from replay and
eval (which apply its whole steps), the error that makes check refuse the directory
(rundir.torntail: after which step, and what disagrees).

Assumes: called by seedflood.cli's dispatch, which maps a known bad input to exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from seedflood.rundir.layout import RunDir


def _found(path: str) -> RunDir:
    """The run directory a command reads (CheckpointError, one line, when `path` holds no log)."""
    from seedflood.rundir.layout import RunDir

    return RunDir.at(path)


def _rebuild(run: RunDir, steps: int | None):
    """Config, workload, number of steps applied, and the log's (whole steps, torn tail bytes),
    rebuilt from base + log (resume.recorded_log: config.yaml must match the log header; every
    record passes the wire's validation)."""
    from seedflood.core.flood.protocol import trajectory
    from seedflood.core.zo.replay import Applier
    from seedflood.ml.workload import Workload
    from seedflood.rundir import resume
    from seedflood.rundir.layout import CheckpointError

    cfg, proto = resume.recorded(run)
    w = Workload.build(cfg)
    records, torn = resume.recorded_log(run, proto, trajectory(cfg, proto, w.train_digest()), w.loaded.base_hash)
    logged = len(records)
    if steps is not None:
        if not 0 <= steps <= len(records):
            raise CheckpointError(f"--step {steps} is outside 0..{len(records)} (steps in the log)")
        records = records[:steps]
    Applier(w.direction, proto).apply_all(records)
    return cfg, w, len(records), (logged, torn)


def _warn_torn(run: RunDir, log: tuple[int, int], param_hash: str | None = None) -> None:
    """One line on stderr when the log ends in a torn record, or whole but short of the run (see
    the module docstring); `param_hash`: the state after every whole step, compared with
    summary.json's."""
    from seedflood.rundir.torntail import short_log_line, torn_tail_line

    logged, torn = log
    if line := torn_tail_line(run, logged, torn, param_hash) if torn else short_log_line(run, logged):
        print(f"seedflood: warning: {line}", file=sys.stderr)


def _writable_dir(path: Path) -> None:
    """Raise CheckpointError unless `path` can be created (or is a directory we can write)."""
    import os

    from seedflood.rundir.layout import CheckpointError

    p = path.resolve()
    existing = next(a for a in (p, *p.parents) if a.exists())
    if not existing.is_dir():
        raise CheckpointError(f"cannot write {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CheckpointError(f"cannot write {path}: {existing} is not writable")


def cmd_replay(args: argparse.Namespace) -> int:
    from seedflood.core.zo.replay import state_hash

    if args.out:
        _writable_dir(Path(args.out))
    run = _found(args.run_dir)
    cfg, w, n, log = _rebuild(run, args.step)
    digest = state_hash(w.model, w.direction)
    _warn_torn(run, log, digest if n == log[0] else None)
    if args.out:
        from seedflood.ml import model

        model.save(w.loaded, Path(args.out), w.direction.effective_tensors())
    result = {"steps": n, "param_hash": digest, **({"out": args.out} if args.out else {})}
    if args.json:
        print(json.dumps(result))
        return 0
    _print_fields(
        [
            ("run directory", args.run_dir),
            ("replayed", f"{n} logged steps applied to the base model"),
            ("param hash", digest),
            *([("model directory", args.out)] if args.out else []),
        ]
    )
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Verify a run directory without loading weights: config.yaml against the log header, every
    log record, every checkpoint's checksum, and a log that ends whole and not short of the run
    (a torn tail, or a summary or checkpoint past its end, is refused with its line,
    rundir.torntail). Exit 2 naming the first problem."""
    from seedflood.core.flood.protocol import trajectory
    from seedflood.ml import sampling
    from seedflood.ml.workload import train_digest
    from seedflood.rundir import checkpoints as ckpt
    from seedflood.rundir import resume
    from seedflood.rundir.layout import CheckpointError
    from seedflood.rundir.logheader import header_checked
    from seedflood.rundir.torntail import short_log_line, torn_tail_line

    run = _found(args.run_dir)
    cfg, proto = resume.recorded(run)
    digest = train_digest(sampling.load_splits(cfg.task, cfg.run.seed))
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
    if not header_checked(run.log):
        print(
            "seedflood: note: log.bin predates log header checksums (a legacy log): its header is read unchecked",
            file=sys.stderr,
        )
    names = [c.name for c in found]
    if args.json:
        print(json.dumps({"ok": True, "steps": len(records), "checkpoints": names}))
        return 0
    _print_fields(
        [
            ("run directory", str(run.root)),
            ("verdict", "OK: config.yaml matches the log header; every log record and checkpoint checksum is valid"),
            ("steps logged", str(len(records))),
            ("checkpoints", f"{len(names)}" + (f" ({', '.join(names)})" if names else "")),
        ]
    )
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from seedflood.rundir.metrics import PhaseProgress

    run = _found(args.run_dir)
    cfg, w, n, log = _rebuild(run, args.step)
    _warn_torn(run, log)
    with PhaseProgress(f"scoring step {n} (dev + test)") as bar:
        m = w.score_splits(on_examples=bar.update)[1]["metrics"]
    if args.json:
        print(json.dumps({"steps": n, **m}))
        return 0

    def fmt(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f}"

    shares = ", ".join(f"{f:.2f}" for f in m["pred_frac"])
    _print_fields(
        [
            ("run directory", args.run_dir),
            ("scored", f"the model after {n} logged steps, on {m['n']} test examples"),
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
