"""The `seedflood` command: train | simulate | compare | eval | replay | check | topology show | world-size | sweep | bench.

Owns: argument parsing, turning every known bad input into one line on stderr and exit status 2,
and printing results. Everything else lives in the modules it calls.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import select
import sys
import threading
from pathlib import Path
from typing import Any

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1
JSON_HELP = "print the result as one JSON object (for scripts) instead of the summary lines"


def _bad_input_errors() -> tuple[type[BaseException], ...]:
    from seedflood.comm.runtime import WorldError
    from seedflood.core.configerror import ConfigError
    from seedflood.core.directions import DirectionError
    from seedflood.core.graph import TopologyError
    from seedflood.ml.datafiles import TaskError
    from seedflood.ml.sources import ModelError
    from seedflood.roles.train import RunError
    from seedflood.rundir.layout import CheckpointError

    return (ConfigError, TopologyError, TaskError, ModelError, WorldError, CheckpointError, DirectionError, RunError)


def _run_errors() -> tuple[type[BaseException], ...]:
    """Failures of a running process that are explained in one line (exit status 1)."""
    from seedflood.core.flooding import FloodError
    from seedflood.core.membership import MembershipError
    from seedflood.core.message import FrameError
    from seedflood.core.replay import ReplayError
    from seedflood.core.transport import TransportError
    from seedflood.core.zo import EstimateError
    from seedflood.roles.evaluator import EvaluatorError

    return (TransportError, FloodError, FrameError, EvaluatorError, EstimateError, ReplayError, MembershipError)


def _load_config(args: argparse.Namespace):
    from seedflood.core import config

    return config.load(args.config, args.set or [])


def _preflight(cfg, full: bool = True) -> int:
    """Check everything that can be checked without loading weights; returns the world size.

    `full` (the launchers' `world-size`) also loads the task's data and checks the run
    directory a resume would continue (settings, log integrity, checkpoints), so a bad run stops
    here, before any process starts and before anything is written.
    """
    from seedflood.core import config, directions, protocol, topology
    from seedflood.ml import model, sampling, tasks
    from seedflood.ml.workload import train_digest
    from seedflood.rundir import resume as rundir

    config.check_run(cfg)
    top = rundir.topology_of(cfg)
    proto = protocol.Protocol.of(cfg, top.diameter)
    tasks.get(cfg.task)
    model.check_source(cfg.model)
    directions.check_precision(cfg.zo, cfg.model.dtype)
    if full:
        train = sampling.check(cfg.task, cfg.run.seed, top.n)
        trajectory = protocol.trajectory(cfg, proto, train_digest(train))
        records = rundir.resume_records(cfg, proto, trajectory)
        for note in rundir.checkpoint_notes(cfg, len(records)):
            print(
                f"seedflood: warning: {note}; the run will fall back to an older checkpoint or the log", file=sys.stderr
            )
    return topology.world_size(top)


# -- subcommands ----------------------------------------------------------------------------------
def cmd_train(args: argparse.Namespace) -> int:
    from seedflood.roles import train

    cfg = _load_config(args)
    _preflight(cfg, full=False)  # the launcher's world-size ran the full preflight; rank 0 rechecks the run dir
    summary = train.run(cfg)
    if summary is not None:
        _print_summary(summary)
        if summary["consensus"] is False:  # None: no client report came (the store is gone)
            return 1
    return 0


def _consensus_line(s: dict) -> str:
    """How the clients' final hashes compare with the evaluator's (a client that left has none)."""
    if s["consensus"] is None:
        return "unchecked (no client reported: the store is gone)"
    if not s["consensus"]:
        return "MISMATCH"
    reported = sum(h is not None for h in s["client_hashes"])
    gone = len(s["client_hashes"]) - reported
    return f"all {reported} clients equal the evaluator" + (f" ({gone} more left the run)" if gone else "")


def cmd_simulate(args: argparse.Namespace) -> int:
    """The whole run of a config in this one process (sharedmodel: one model for every client;
    baselines.run for the other algorithms)."""
    cfg = _load_config(args)
    if cfg.algorithm.name != "seedflood":
        from seedflood.experiments import baselines

        _preflight(cfg, full=False)
        _print_run_summary(baselines.run(cfg, progress=True))
        return 0
    from seedflood.roles import sharedmodel

    _preflight(cfg, full=True)  # no launcher ran world-size first: check the data and the run dir here
    _print_run_summary(sharedmodel.run(cfg, progress=True))
    return 0


def _print_run_summary(s: dict[str, Any]) -> None:
    """A SeedFlood summary as the launched evaluator's; any other algorithm's by its contract keys."""
    if s.get("algorithm", "seedflood") == "seedflood":
        _print_summary(s)
        return
    from seedflood.rundir.metrics import human_bytes

    final = s.get("final") or {}

    def fmt(key: str) -> str:
        v = final.get(key)
        return "n/a" if v is None else f"{v:.3f}"

    print(f"{s['algorithm']}: steps {s['steps']}, {s['clients']} clients on {s['topology']}")
    print(
        f"final:      accuracy {fmt('accuracy')}  AUC {fmt('auc')}  "
        f"dev-threshold accuracy {fmt('threshold_accuracy')}  loss {fmt('loss')}"
    )
    distance = s.get("consensus_distance")
    print(
        f"bytes per edge per run: {human_bytes(s['bytes_per_edge_run'])}; consensus distance "
        f"{'n/a' if distance is None else f'{distance:.4g}'}; wall {s['wall_seconds']:.1f} s"
    )


def _print_summary(s: dict[str, Any]) -> None:
    from seedflood.rundir.metrics import human_bytes

    final, zero = s["final"], s.get("zero_shot") or {}

    def fmt(m: dict[str, Any], key: str) -> str:
        v = m.get(key)
        return "n/a" if v is None else f"{v:.3f}"

    print(f"steps {s['steps']}, {s['clients']} clients on {s['topology']} (diameter {s['diameter']})")
    if zero:
        print(
            f"zero-shot:  accuracy {fmt(zero, 'accuracy')}  AUC {fmt(zero, 'auc')}  "
            f"dev-threshold accuracy {fmt(zero, 'threshold_accuracy')}"
        )
    print(
        f"final:      accuracy {fmt(final, 'accuracy')}  AUC {fmt(final, 'auc')}  "
        f"dev-threshold accuracy {fmt(final, 'threshold_accuracy')}  loss {fmt(final, 'loss')}"
    )
    edges = s["bytes_per_edge"]  # topology edges only; bytes_total also has the evaluator's channel
    if s.get("consensus", True) is None:  # the clients count the bytes, and no report came
        print("bytes per edge per step: unknown (no client reported)")
    else:
        print(
            f"bytes per edge per step: {s['bytes_per_edge_per_step']:.1f} "
            f"(total {human_bytes(sum(edges.values()))} over {len(edges)} directed edges)"
        )
    print(f"consensus: {_consensus_line(s)} (hash {s['param_hash'][:16]})")
    if s.get("model_dir"):
        print(f"model directory: {s['model_dir']}")
    print(f"message log: {s['log']}")


def _rebuild(run_dir: Path, steps: int | None):
    """Config, workload and number of steps applied, rebuilt from base + log (rundir.recorded_steps:
    config.yaml must match the log header; every record passes the wire's validation)."""
    from seedflood.core.replay import Applier
    from seedflood.ml.workload import Workload
    from seedflood.rundir import resume as rundir
    from seedflood.rundir.layout import CheckpointError

    cfg, proto = rundir.recorded(run_dir)
    w = Workload.build(cfg)
    records = rundir.recorded_steps(run_dir, cfg, proto, w.train_digest(), w.loaded.base_hash)
    if steps is not None:
        if not 0 <= steps <= len(records):
            raise CheckpointError(f"--step {steps} is outside 0..{len(records)} (steps in the log)")
        records = records[:steps]
    Applier(w.direction, proto).apply_all(records)
    return cfg, w, len(records)


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
    from seedflood.core.replay import state_hash

    if args.out:
        _writable_dir(Path(args.out))
    cfg, w, n = _rebuild(Path(args.run_dir), args.step)
    digest = state_hash(w.model, w.direction)
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
    log record, every checkpoint's checksum. Exit 2 naming the first problem."""
    from seedflood.ml import sampling
    from seedflood.ml.workload import train_digest
    from seedflood.rundir import checkpoints as ckpt
    from seedflood.rundir import resume as rundir
    from seedflood.rundir.layout import CheckpointError
    from seedflood.rundir.logheader import header_checked

    run_dir = Path(args.run_dir)
    cfg, proto = rundir.recorded(run_dir)
    records = rundir.recorded_steps(run_dir, cfg, proto, train_digest(sampling.load_splits(cfg.task, cfg.run.seed)))
    found = ckpt.checkpoints(run_dir)
    bad = [why for c in found if (why := ckpt.verify(c))]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise CheckpointError(bad[0] + more)
    if not header_checked(run_dir / "log.bin"):
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
            ("run directory", str(run_dir)),
            ("verdict", "OK: config.yaml matches the log header; every log record and checkpoint checksum is valid"),
            ("steps logged", str(len(records))),
            ("checkpoints", f"{len(names)}" + (f" ({', '.join(names)})" if names else "")),
        ]
    )
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from seedflood.rundir.metrics import PhaseProgress

    cfg, w, n = _rebuild(Path(args.run_dir), args.step)
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


def cmd_topology_show(args: argparse.Namespace) -> int:
    from seedflood.core import topology

    cfg = topology.parse_spec(args.spec)
    print(topology.describe(topology.build(cfg)))
    return 0


def cmd_world_size(args: argparse.Namespace) -> int:
    print(_preflight(_load_config(args)))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run configuration INDEX of a sweep: all its processes, under torchrun --standalone here."""
    from seedflood.experiments import sweep

    return sweep.run_index(args.file, args.index, extra=args.set, out_root=args.out_root)


def cmd_sweep_summary(args: argparse.Namespace) -> int:
    """One row per run of the sweep; exit status 0 once every run is done."""
    from seedflood.experiments import sweep

    rows = sweep.summarize_sweep(sweep.load(args.file, out_root=args.out_root))
    print(sweep.format_table(rows, args.format), end="")
    return 0 if sweep.all_done(rows) else 1


def cmd_store(args: argparse.Namespace) -> int:
    """Host a churn run's rendezvous store until killed (docs/design.md §13)."""
    from seedflood.comm import runtime

    runtime.serve_store(args.host, args.port)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="seedflood", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    def with_config(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", required=False, help="run config YAML (defaults when omitted)")
        sp.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE", help="override a config value")

    t = sub.add_parser("train", help="run this process's role (under torchrun, srun or compose)")
    with_config(t)
    t.set_defaults(fn=cmd_train)

    sim = sub.add_parser(
        "simulate",
        help="run every client of a config in this one process on one shared model "
        "(same hash, log and metrics as the launched run)",
    )
    with_config(sim)
    sim.set_defaults(fn=cmd_simulate)

    for name, fn, text in (
        ("replay", cmd_replay, "rebuild the model from base + log and print its hash"),
        ("eval", cmd_eval, "rebuild the model from base + log and score it"),
    ):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("run_dir")
        sp.add_argument("--step", type=int, help="number of logged steps to apply (default: all)")
        if name == "replay":
            sp.add_argument("--out", help="also write a save_pretrained model directory here")
        sp.add_argument("--json", action="store_true", help=JSON_HELP)
        sp.set_defaults(fn=fn)

    ck = sub.add_parser("check", help="verify a run directory: settings, every log record, every checkpoint")
    ck.add_argument("run_dir")
    ck.add_argument("--json", action="store_true", help=JSON_HELP)
    ck.set_defaults(fn=cmd_check)

    top = sub.add_parser("topology", help="inspect topologies")
    tsub = top.add_subparsers(dest="topology_command", required=True)
    show = tsub.add_parser("show", help="nodes, edges, degrees and diameter of FILE or SPEC (e.g. ring:16)")
    show.add_argument("spec")
    show.set_defaults(fn=cmd_topology_show)

    st = sub.add_parser(
        "store",
        help="host a churn run's rendezvous store (then start every process with SEEDFLOOD_STORE=HOST:PORT)",
    )
    st.add_argument("--host", default="0.0.0.0", help="address to listen on (default all)")
    st.add_argument("--port", type=int, required=True)
    st.set_defaults(fn=cmd_store)

    ws = sub.add_parser("world-size", help="check a config and print its process count (clients + evaluator)")
    with_config(ws)
    ws.set_defaults(fn=cmd_world_size)

    sw = sub.add_parser(
        "sweep",
        help="run configuration INDEX of a sweep file, all its processes under "
        "torchrun on this machine (INDEX defaults to $SLURM_ARRAY_TASK_ID)",
    )
    sw.add_argument("file")
    sw.add_argument("--index", default=None, help="grid point 0..K-1 (default: $SLURM_ARRAY_TASK_ID)")
    sw.add_argument("--out-root", default=None, help="directory for the run directories (default: the file's out_root)")
    sw.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override applied to every run of the sweep",
    )
    sw.set_defaults(fn=cmd_sweep)

    ss = sub.add_parser("sweep-summary", help="gather a sweep's results into one table")
    ss.add_argument("file")
    ss.add_argument("--out-root", default=None, help="as given to `seedflood sweep`")
    ss.add_argument("--format", choices=["table", "tsv", "json"], default="table")
    ss.set_defaults(fn=cmd_sweep_summary)

    from seedflood.experiments import compare

    compare.add_parser(sub)
    sub.add_parser("bench", help="measure the published figures (seedflood bench --help; benchmarks/README.md)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # bench has its own parser (options must not be eaten here)
        from seedflood.bench import cli as bench

        return bench.main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except _bad_input_errors() as e:
        print(f"seedflood: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except _run_errors() as e:
        print(f"seedflood: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("seedflood: interrupted", file=sys.stderr)
        return 130


def exit_process(code: int) -> None:
    """End the process with `code` (the console entry point's last act).

    A churn run can leave daemon threads (named seedflood-*: a store call to a host that went
    silent, a heartbeat or hop wait) blocked inside a torch.distributed C++ call. If such a call
    returns while the interpreter finalizes, CPython ends its thread with pthread_exit inside a
    C++ frame and the process aborts ("terminate called without an active exception", SIGABRT)
    instead of exiting with its status: a stopped client seen as a crash. So while one of them
    is alive the exit skips finalization: the atexit handlers run here (logging's flush, the
    edges' close), then stdio is flushed and os._exit ends the process. Otherwise: a plain exit."""
    if any(t.daemon and t.is_alive() and t.name.startswith("seedflood-") for t in threading.enumerate()):
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed or broken stream: nothing more to say on it
                pass
        os._exit(code)
    raise SystemExit(code)


EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what a shell reports for a coreutils command whose reader went away (`cat f | head`),
so `set -o pipefail` scripts see `seedflood ... | head` as they see any such pipeline."""


def _stdout_reader_gone() -> bool:
    """True when stdout is a pipe whose read end is closed (poll reports POLLERR on such a write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no fd (a replaced stdout) or no poll: not ours to judge
        return False


def console() -> None:
    """The `seedflood` console script (and `python -m seedflood`).

    A closed pipe ends quietly: when the reader of stdout goes away (`seedflood topology show
    ring:16 | head`) the write or the final flush raises BrokenPipeError; stdout is then pointed
    at /dev/null (so the interpreter's own flush at exit cannot raise again) and the process
    exits EXIT_BROKEN_PIPE with nothing on stderr (the documented recipe of Python's `signal`
    module, with the status a SIGPIPE death would have; the default SIGPIPE action is not
    restored, as it would kill a run mid-write of its files). A BrokenPipeError from anything
    else (a socket to a peer that died) is not a closed stdout and propagates as before."""
    try:
        code = main()
        sys.stdout.flush()  # the last buffered output fails here, inside the try, not at exit
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        code = EXIT_BROKEN_PIPE
    exit_process(code)
