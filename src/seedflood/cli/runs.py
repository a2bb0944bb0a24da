"""The `seedflood` commands that start, size or resolve a run: train, simulate, world-size, config.

Owns: loading the config from `--config`/`--set`, the preflight (everything checkable without
loading weights, and that every tracker in eval.trackers is installed), and the end-of-run summaries they print.

Assumes: called by seedflood.cli's dispatch, which maps a known bad input to exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from seedflood.rundir.summary import FloodFigures, RunSummary


def load_config(args: argparse.Namespace):
    from seedflood.core.config import runconfig as config

    return config.load(args.config, args.set or [])


def preflight(cfg, full: bool = True, gpus: int | None = None) -> int:
    """Check everything that can be checked without loading weights; returns the world size.

    `full` (the launchers' `world-size`) also loads the task's data and checks the run
    directory a resume would continue (settings, log integrity, checkpoints), so a bad run stops
    here, before any process starts and before anything is written. `gpus`: the GPU count per
    host to check model.device against (None: this machine's, counted only for a cuda device).
    """
    from seedflood.core.config import runconfig as config

    config.check_run(cfg)  # before the imports below load torch: this refusal answers at once
    from seedflood.rundir import trackers
    from seedflood.rundir.layout import RunDir

    RunDir.of(cfg).check_writable()  # run.out_dir a file, or under one: refused before anything starts
    trackers.check_installed(cfg.eval.trackers)  # a tracker named but not installed: one line, before any process
    from seedflood.core.flood import protocol
    from seedflood.core.topology import resolve as topology
    from seedflood.core.zo import precision
    from seedflood.ml import modelcheck, sampling, tasks
    from seedflood.rundir import resume

    top = topology.topology_of(cfg)
    proto = protocol.Protocol.of(cfg, top.diameter)
    if cfg.trust.sign:  # the roster only: each node's private key lives on that node
        from seedflood.comm import identity

        roster = identity.load_roster(Path(cfg.trust.keys))
        # a key per founder, and per new id that may join (churn.max_nodes; one without a key is
        # refused when its process starts, as in process)
        if not top.n <= len(roster) <= proto.ids:
            opened = f" and takes new ids up to {proto.ids - 1} (churn.max_nodes)" if proto.ids > top.n else ""
            raise identity.IdentityError(
                f"trust.keys: the roster holds {len(roster)} public keys, the run has {top.n} clients{opened} "
                f"(seedflood keys --nodes {proto.ids} --out DIR)"
            )
        from seedflood.roles.identities import check_keys_here

        check_keys_here(Path(cfg.trust.keys), roster)  # a key file here that is not its node's: refused now
    tasks.get(cfg.task)
    modelcheck.check_source(cfg.model, gpus=gpus)
    if modelcheck.needs_gpus(cfg.model.device, cfg.eval.device):  # eval.device=own on one GPU, cuda:K past the last
        count = gpus if gpus is not None else modelcheck.local_gpus()
        modelcheck.plan(cfg.model.device, cfg.eval.device, topology.world_size(top), count)
    precision.check_precision(cfg.zo, cfg.model.dtype)
    if full:
        train = sampling.check(cfg.task, cfg.run.seed, top.n)
        trajectory = protocol.trajectory(cfg, proto, sampling.train_digest(train))
        run = RunDir.of(cfg)
        records = resume.resume_records(run, proto, trajectory, None, resume=cfg.checkpoint.resume)
        for note in resume.checkpoint_notes(run, len(records)):
            print(
                f"seedflood: warning: {note}; the run will fall back to an older checkpoint or the log", file=sys.stderr
            )
    return topology.world_size(top)


def cmd_train(args: argparse.Namespace) -> int:
    cfg = load_config(args)  # a bad config is refused before torch is imported
    preflight(cfg, full=False)  # the launcher's world-size ran the full preflight; rank 0 rechecks the run dir
    _threads_before_torch(cfg)
    from seedflood.roles import train

    summary = train.run(cfg)
    if summary is not None and summary.seedflood is not None:
        _print_summary(summary, summary.seedflood)
        if summary.seedflood.reports.consensus is False:  # None: no client report came (the store is gone)
            return 1
    return 0


def _threads_before_torch(cfg) -> None:
    """run.threads' count in the thread variables torch reads as it loads (ml/machine.py
    THREAD_VARS), from the launcher's local process count: a process that imports it later runs
    no pool sized to every core. A process that already imported torch (a fork of one) is left to
    machine.set_threads, which every process calls once its world is read."""
    if "torch" in sys.modules:
        return
    import os

    from seedflood.comm.world import World
    from seedflood.ml import machine

    machine.threads_env(cfg.run.threads, World.from_env(os.environ).local_world_size, os.environ)


def _consensus_line(f: FloodFigures) -> str:
    """How the clients' final hashes compare with the evaluator's (a client that left has none)."""
    consensus, hashes = f.reports.consensus, f.reports.client_hashes
    if consensus is None:
        return "unchecked (no client reported: the store is gone)"
    if not consensus:
        return "MISMATCH"
    reported = sum(h is not None for h in hashes)
    gone = len(hashes) - reported
    return f"all {reported} clients equal the evaluator" + (f" ({gone} more left the run)" if gone else "")


def cmd_simulate(args: argparse.Namespace) -> int:
    """The whole run of a config in this one process (sharedmodel: one model for every client;
    baselines.run for the other algorithms)."""
    cfg = load_config(args)
    if cfg.algorithm.name != "seedflood":
        preflight(cfg, full=False)
        from seedflood.experiments import baselines

        _print_run_summary(baselines.run(cfg, progress=True))
        return 0
    preflight(cfg, full=True)  # no launcher ran world-size first: check the data and the run dir here
    from seedflood.roles import sharedmodel

    _print_run_summary(sharedmodel.run(cfg, progress=True))
    return 0


def _print_run_summary(s: RunSummary) -> None:
    """A SeedFlood summary as the launched evaluator's; any other algorithm's by its contract keys."""
    if s.seedflood is not None:
        _print_summary(s, s.seedflood)
        return
    from seedflood.rundir.metrics import human_bytes

    final = s.final or {}

    def fmt(key: str) -> str:
        v = final.get(key)
        return "n/a" if v is None else f"{v:.3f}"

    print(f"{s.algorithm}: steps {s.steps}, {s.clients} clients on {s.topology}")
    print(
        f"final:      accuracy {fmt('accuracy')}  AUC {fmt('auc')}  "
        f"dev-threshold accuracy {fmt('threshold_accuracy')}  loss {fmt('loss')}"
    )
    distance = s.consensus_distance
    print(
        f"bytes per edge per run: {human_bytes(s.bytes_per_edge_run)}; consensus distance "
        f"{'n/a' if distance is None else f'{distance:.4g}'}; wall {s.wall_seconds:.1f} s"
    )


def _print_summary(s: RunSummary, f: FloodFigures) -> None:
    """A SeedFlood run's summary (`f`: its own figures, s.seedflood)."""
    from seedflood.rundir.metrics import human_bytes

    final, zero = s.final, s.zero_shot or {}

    def fmt(m: dict[str, Any], key: str) -> str:
        v = m.get(key)
        return "n/a" if v is None else f"{v:.3f}"

    print(f"steps {s.steps}, {s.clients} clients on {s.topology} (diameter {f.diameter})")
    if zero:
        print(
            f"zero-shot:  accuracy {fmt(zero, 'accuracy')}  AUC {fmt(zero, 'auc')}  "
            f"dev-threshold accuracy {fmt(zero, 'threshold_accuracy')}"
        )
    print(
        f"final:      accuracy {fmt(final, 'accuracy')}  AUC {fmt(final, 'auc')}  "
        f"dev-threshold accuracy {fmt(final, 'threshold_accuracy')}  loss {fmt(final, 'loss')}"
    )
    edges = f.bytes_per_edge  # topology edges only; bytes_total also has the evaluator's channel
    if f.reports.consensus is None:  # the clients count the bytes, and no report came
        print("bytes per edge per step: unknown (no client reported)")
    else:
        print(
            f"bytes per edge per step: {f.bytes_per_edge_per_step:.1f} "
            f"(total {human_bytes(sum(edges.values()))} over {len(edges)} directed edges)"
        )
    print(f"consensus: {_consensus_line(f)} (hash {f.param_hash[:16]})")
    if f.model_dir:
        print(f"model directory: {f.model_dir}")
    print(f"message log: {f.log}")


def cmd_world_size(args: argparse.Namespace) -> int:
    """The preflight; prints the process count (stdout: what the launchers read) and, when a
    GPU is used or `--gpus` is given, the GPU plan on stderr (modelcheck.plan: which rank on which
    device on which host, a notice where the evaluator shares a client's GPU, a warning where two
    clients share one that model.device did not pin)."""
    from seedflood.ml import modelcheck
    from seedflood.ml.sources import ModelError  # a bad count is one line, exit 2, as the plan's own errors

    if args.gpus is not None and args.gpus < 0:
        raise ModelError(f"--gpus must be >= 0, got {args.gpus}")
    hosts = args.hosts if args.hosts is not None else _env_hosts()
    if hosts < 1:
        raise ModelError(f"--hosts must be >= 1, got {hosts}")
    cfg = load_config(args)
    world = preflight(cfg, gpus=args.gpus)

    model, evaluator = cfg.model.device, cfg.eval.device
    if args.gpus is not None or modelcheck.needs_gpus(model, evaluator):
        gpus = args.gpus if args.gpus is not None else modelcheck.local_gpus()
        plan = modelcheck.plan(model, evaluator, world, gpus, hosts)
        for line in plan.lines():
            print(f"seedflood: {line}", file=sys.stderr)
    print(world)
    return 0


def _env_hosts() -> int:
    """NNODES (launch/torchrun.sh's host count, and SLURM's run.sbatch exports it), else 1."""
    import os

    from seedflood.ml.sources import ModelError

    text = os.environ.get("NNODES", "").strip() or "1"
    if not text.isdigit():
        raise ModelError(f"NNODES={text!r} is not a host count")
    return int(text)


def cmd_config(args: argparse.Namespace) -> int:
    """The resolved config as YAML: of a run directory (its config.yaml as recorded) or of a config
    file (or the defaults), with every `--set` applied and every default filled in."""
    from seedflood.core.config import runconfig as config
    from seedflood.rundir.layout import CheckpointError, RunDir

    source, recorded = args.source, False
    if source is not None and Path(source).is_dir():
        source, recorded = RunDir(Path(source)).config, True
        if not source.is_file():
            raise CheckpointError(f"{args.source}: a directory without config.yaml (not a run directory)")
    print(config.dump(config.load(source, args.set or [], recorded=recorded)), end="")
    return 0


def version_line() -> str:
    """`seedflood --version`: this package's version and the installed torch's (read from the
    installed metadata: no torch import)."""
    from importlib import metadata

    def of(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return f"seedflood {of('seedflood')} (torch {of('torch')}, Python {sys.version.split()[0]})"
