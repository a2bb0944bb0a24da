"""The `seedflood` tool commands: topology show, sweep, sweep-summary, store, serve-log, keys.

Owns: turning their arguments into calls of the modules that do the work, and printing results.

Assumes: called by seedflood.cli's dispatch, which maps a known bad input to exit status 2.
"""

from __future__ import annotations

import argparse


def cmd_topology_show(args: argparse.Namespace) -> int:
    from seedflood.core.topology import resolve as topology

    cfg = topology.parse_spec(args.spec)
    print(topology.describe(topology.build(cfg)))
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


def _port(port: int) -> int:
    """`--port` as given, or ConfigError (one line) when it is no TCP port (0 = any free one)."""
    from seedflood.core.config.configerror import ConfigError

    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port}: not a TCP port (0..65535)")
    return port


def cmd_store(args: argparse.Namespace) -> int:
    """Host a churn run's rendezvous store until killed (launch/README.md, The store); a port
    another process holds is refused in one line (comm.listen.ListenError)."""
    _port(args.port)
    from seedflood.comm import runtime

    runtime.serve_store(args.host, args.port)
    return 0


def cmd_serve_log(args: argparse.Namespace) -> int:
    """Serve a churn run's decided prefix read-only until killed (launch/README.md, A log server);
    a port another process holds is refused in one line (comm.listen.ListenError)."""
    _port(args.port)
    from seedflood.roles import logserver

    logserver.serve(args.run_dir, args.host, args.port)
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    from pathlib import Path

    from seedflood.comm import identity

    out = Path(args.out)
    roster = identity.write_keys(out, args.nodes, force=args.force)
    print(f"roster:   {roster} ({args.nodes} public keys: every participant gets this file)")
    print(f"keys:     {out}/node-<i>.key (mode 600: node i's private key goes to node i only)")
    print(f"sign with: --set trust.sign=true --set trust.keys={out}")
    return 0
