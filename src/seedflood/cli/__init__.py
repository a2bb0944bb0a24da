"""The `seedflood` command, its subcommands grouped by what a user is doing (`GROUPS`, `seedflood --help`):
run (launch, train, simulate, world-size, config), inspect (status, replay, check, topology), experiment
(compare, sweep, reproduce, bench, gpu-evidence), operate (store, serve-log, keys).

Owns: argument parsing and dispatch, turning every known bad input into one line on stderr and
exit status 2, `--version`, the old names kept for a release (`RENAMED`: each still works and,
once it succeeded, says its new spelling in one line on stderr, so a refusal stays one line;
`watch` stays an alias of `status --watch`), and the
console entry (`seedflood = seedflood.cli:console`, `python -m seedflood`).
The subcommands live by what they own: launch (every process of a run here, forked), runs (train, simulate, world-size, config), inspection
(replay, check, eval), status (the roster of a run, running or finished; `watch` redraws it) and
tools (topology show, sweep, sweep-summary, store, serve-log, keys); `bench` has its own parser.
"""

from __future__ import annotations

import argparse
import atexit
import os
import select
import sys
import threading

from seedflood.cli import status
from seedflood.cli.inspection import cmd_check, cmd_eval, cmd_replay
from seedflood.cli.runs import cmd_config, cmd_simulate, cmd_train, cmd_world_size, version_line
from seedflood.cli.tools import (
    cmd_keys,
    cmd_serve_log,
    cmd_store,
    cmd_sweep,
    cmd_sweep_summary,
    cmd_topology_show,
)

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1
JSON_HELP = "print the result as one JSON object (for scripts) instead of the summary lines"


def _raisable(*names: str) -> tuple[type[BaseException], ...]:
    """The exception classes "module.Class" whose module is already imported.

    An exception can only have been raised if its class's module was imported, so the others
    need not be caught, and not importing them keeps a refusal that comes before the model (a bad
    --set) from loading torch and transformers: a one-line answer in a fraction of a second.
    """
    found = []
    for name in names:
        module, _, cls = name.rpartition(".")
        if module in sys.modules:
            found.append(getattr(sys.modules[module], cls))
    return tuple(found)


def _bad_input_errors() -> tuple[type[BaseException], ...]:
    return _raisable(
        "seedflood.core.config.configerror.ConfigError",
        "seedflood.core.topology.graph.TopologyError",
        "seedflood.ml.datafiles.TaskError",
        "seedflood.ml.sources.ModelError",
        "seedflood.comm.world.WorldError",
        "seedflood.rundir.layout.CheckpointError",
        "seedflood.core.zo.precision.DirectionError",
        "seedflood.comm.identity.IdentityError",
        "seedflood.comm.listen.ListenError",
        "seedflood.roles.train.RunError",
        "seedflood.rundir.trackers.TrackerError",
    )


def _run_errors() -> tuple[type[BaseException], ...]:
    """Failures of a running process that are explained in one line (exit status 1)."""
    return _raisable(
        "seedflood.core.flood.transport.TransportError",
        "seedflood.core.flood.flooding.FloodError",
        "seedflood.core.wire.message.FrameError",
        "seedflood.roles.evaluator.EvaluatorError",
        "seedflood.core.zo.estimate.EstimateError",
        "seedflood.core.zo.replay.ReplayError",
        "seedflood.core.membership.roster.MembershipError",
    )


GROUPS: dict[str, tuple[str, ...]] = {
    "run": ("launch", "train", "simulate", "world-size", "config"),
    "inspect": ("status", "replay", "check", "topology"),
    "experiment": ("compare", "sweep", "reproduce", "bench", "gpu-evidence"),
    "operate": ("store", "serve-log", "keys"),
}
"""`seedflood --help` lists the commands under these headings, in this order."""

ALIASES = {"watch": "status --watch"}
"""Other spellings of a command, kept and listed beside it."""

RENAMED: dict[str, tuple[str, list[str]]] = {
    "eval": ("replay --score", ["replay", "--score"]),
    "sweep-summary": ("sweep FILE --summary", ["sweep", "--summary"]),
}
"""Old command -> (its new spelling, the argv it becomes): still accepted for one release, with
a one-line notice on stderr."""


def _grouped(helps: dict[str, str]) -> str:
    lines = []
    for group, names in GROUPS.items():
        lines.append(f"{group}:")
        for name in names:
            lines.append(f"  {name:<13} {helps.get(name, '')}")
            lines += [f"  {alias:<13} = {target}" for alias, target in ALIASES.items() if target.split()[0] == name]
    lines.append("")
    lines.append("old names, for one release: " + "; ".join(f"{o} = {n}" for o, (n, _) in RENAMED.items()))
    lines.append("seedflood COMMAND --help: that command's options.")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="seedflood",
        description="Decentralized zeroth-order fine-tuning of LLMs by flooding (seed, scalar) updates.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=version_line())
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    helps: dict[str, str] = {}
    add = sub.add_parser

    def add_parser(name: str, help: str | None = None, **kw: object) -> argparse.ArgumentParser:
        """A subcommand, its one line kept for the grouped listing (argparse's own list is off)."""
        if help is not None:
            helps[name] = help
            kw.setdefault("description", help)
        return add(name, **kw)  # type: ignore[arg-type]

    sub.add_parser = add_parser  # type: ignore[method-assign]

    def with_config(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", required=False, help="run config YAML (defaults when omitted)")
        sp.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE", help="override a config value")

    la = sub.add_parser(
        "launch",
        help="run every process of a run on this machine, forked from one interpreter that imported torch "
        "(the evaluator and each client; output prefixed [rankR]:)",
    )
    with_config(la)
    la.set_defaults(fn=_launch)

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
        ("replay", _replay, "rebuild the model from base + log and print its hash (--score: and score it)"),
        ("eval", cmd_eval, None),
    ):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("run_dir")
        sp.add_argument("--step", type=int, help="number of logged steps to apply (default: all)")
        if name == "replay":
            sp.add_argument("--out", help="also write a save_pretrained model directory here")
            sp.add_argument("--score", action="store_true", help="also score the rebuilt model (was `seedflood eval`)")
        sp.add_argument(
            "--exclude",
            type=int,
            action="append",
            metavar="ORIGIN",
            help="leave out this client's logged messages (repeat for more origins): un-training; "
            "the later scalars of the others were measured with them in",
        )
        sp.add_argument(
            "--from",
            dest="from_step",
            type=int,
            metavar="STEP",
            help="leave the --exclude origins out from this step on (default 0; earlier steps are kept)",
        )
        sp.add_argument("--json", action="store_true", help=JSON_HELP)
        sp.set_defaults(fn=fn)

    ck = sub.add_parser("check", help="verify a run directory: settings, every log record, every checkpoint")
    ck.add_argument("run_dir")
    ck.add_argument(
        "--roster",
        metavar="ROSTER",
        help="a signed run: the roster.json `seedflood keys` wrote (or its directory); refuse a log whose "
        "header records another (docs/trust.md)",
    )
    ck.add_argument("--json", action="store_true", help=JSON_HELP)
    ck.set_defaults(fn=cmd_check)

    status.add_parser(sub)

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

    sl = sub.add_parser(
        "serve-log",
        help="serve a churn run's decided steps read-only to newcomers (then set churn.log_server=HOST:PORT)",
    )
    sl.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (its log.bin) or a log file (a client's copy)")
    sl.add_argument("--host", default="0.0.0.0", help="address to listen on (default all)")
    sl.add_argument("--port", type=int, required=True)
    sl.set_defaults(fn=cmd_serve_log)

    ks = sub.add_parser("keys", help="write a key pair per node and the roster of public keys (trust.sign)")
    ks.add_argument("--nodes", type=int, required=True, help="clients of the run (node ids 0..N-1)")
    ks.add_argument("--out", required=True, help="directory for node-<i>.key and roster.json")
    ks.add_argument("--force", action="store_true", help="replace keys already there")
    ks.set_defaults(fn=cmd_keys)

    ws = sub.add_parser("world-size", help="check a config and print its process count (clients + evaluator)")
    with_config(ws)
    ws.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="GPUs per host to plan for and check model.device against (default: this machine's, counted "
        "when a GPU is used); the plan goes to stderr",
    )
    ws.add_argument(
        "--hosts", type=int, default=None, help="hosts the processes are split over (default: $NNODES, else 1)"
    )
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
        "--summary", action="store_true", help="gather the sweep's results into one table instead (was sweep-summary)"
    )
    sw.add_argument("--format", choices=["table", "tsv", "json"], default="table", help="--summary's format")
    sw.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override applied to every run of the sweep",
    )
    sw.set_defaults(fn=_sweep)

    from seedflood.experiments import compare

    compare.add_parser(sub)
    from seedflood.experiments import reproduce

    reproduce.add_parser(sub)
    from seedflood.experiments import gpuevidence

    gpuevidence.add_parser(sub)
    sub.add_parser("bench", help="measure the published figures (seedflood bench --help; docs/benchmarks.md)")

    cf = sub.add_parser(
        "config",
        help="print the resolved config of a run directory, or of CONFIG (or the defaults) with --set, as YAML",
    )
    cf.add_argument("source", nargs="?", metavar="CONFIG|RUN_DIR", help="a config YAML or a run directory")
    cf.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE", help="override a config value")
    cf.set_defaults(fn=cmd_config)
    p.epilog = _grouped(helps)
    return p


def _launch(args: argparse.Namespace) -> int:
    from seedflood.cli.launch import cmd_launch  # multiprocessing and ctypes only for a launch

    return cmd_launch(args)


def _replay(args: argparse.Namespace) -> int:
    return cmd_eval(args) if args.score else cmd_replay(args)


def _sweep(args: argparse.Namespace) -> int:
    return cmd_sweep_summary(args) if args.summary else cmd_sweep(args)


def _renamed(argv: list[str]) -> tuple[list[str], list[str]]:
    """An old command name as its new spelling, and the one-line notice that says so."""
    if argv[:1] and argv[0] in RENAMED:
        new, head = RENAMED[argv[0]]
        notice = f"seedflood: notice: `{argv[0]}` is now `{new}`; the old name goes in the next release"
        if head[0] == "sweep":  # FILE stays first: sweep FILE --summary
            return [head[0], *argv[1:], *head[1:]], [notice]
        return [*head, *argv[1:]], [notice]
    return argv, []


def _notices(said: list[str]) -> None:
    """The notices of a command that succeeded, on stderr (after it: a refusal stays one line)."""
    budget = sys.modules.get("seedflood.experiments.budget")
    for line in [*said, *(budget.NOTICES if budget is not None else [])]:
        print(line, file=sys.stderr)
    if budget is not None:
        budget.NOTICES.clear()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # bench has its own parser (options must not be eaten here)
        from seedflood.bench import cli as bench

        return bench.main(argv[1:])
    argv, said = _renamed(argv)
    args = build_parser().parse_args(argv)
    try:
        code = args.fn(args)
        if code == 0:
            _notices(said)
        return code
    except _bad_input_errors() as e:
        print(f"seedflood: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except _run_errors() as e:
        print(f"seedflood: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("seedflood: interrupted", file=sys.stderr)
        return 130


def exit_process(code: int, finalize: bool = True) -> None:
    """End the process with `code` (the console entry point's last act).

    A churn run can leave daemon threads (named seedflood-*: a store call to a host that went
    silent, a heartbeat or hop wait) blocked inside a torch.distributed C++ call. If such a call
    returns while the interpreter finalizes, CPython ends its thread with pthread_exit inside a
    C++ frame and the process aborts ("terminate called without an active exception", SIGABRT)
    instead of exiting with its status: a stopped client seen as a crash. So while one of them
    is alive the exit skips finalization: the atexit handlers run here (logging's flush, the
    edges' close), then stdio is flushed and os._exit ends the process.

    `finalize=False` (a launched `train` process) skips it too, after joining the other
    non-daemon threads as a plain exit would: finalizing a process that ran torch (its modules'
    and C++ statics' teardown) costs it 0.6-1.3 s of CPU and writes nothing a run keeps (every
    file of the run is closed before `train` returns). Otherwise: a plain exit."""
    if not finalize:
        for t in threading.enumerate():
            if t is not threading.current_thread() and not t.daemon:
                t.join()
    if not finalize or any(
        t.daemon and t.is_alive() and t.name.startswith("seedflood-") for t in threading.enumerate()
    ):
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
    exit_process(code, finalize=sys.argv[1:2] != ["train"])
