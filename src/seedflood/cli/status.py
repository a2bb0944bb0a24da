"""`seedflood status RUN [--watch] [--json] [--edges]` (and its alias `seedflood watch RUN
[--once]`): the roster of a run, running or finished, read from its run directory.

Owns the command: reading a run directory's status records (rundir/status.py) and its log's
roster history (rundir/logchanges.py, read-only: the evaluator appending to it is not
disturbed), merging them (rundir/liveview.py) and printing the view: a plain-text table, one row
per process (its step, incarnation, committed step and digest, agreement, members, links,
bytes), then the membership (the log's roster and its last joins and leaves, by step) and, with
`--edges`, one line per client of its bytes per link. `status` prints it once; `--watch` (and
`watch` without `--once`) redraws it in place with ANSI escapes on a terminal (successive
tables elsewhere) until the evaluator's record is final (finished or failed) and every other
record is final or stale, or Ctrl-C; `--json` prints one JSON object once. `--store HOST:PORT`
adds what the run's rendezvous store says (comm/storeview.py, read-only): each node's latest
registered incarnation, and the restarts and new ids waiting for a sponsor or sponsored, which
the store knows before their status records do.

Exit status: 0 when every record and the log could be read; 1 when one could not (each is one
line under the table, or in the JSON's "problems"); 2 (one line, from the CLI's dispatch) for a
path that is not a run directory (`RunDir.watched`).

Plain text rather than `rich`: a dozen columns need no layout engine, and the output stays
readable in a CI log or a pipe. Per-link bytes are a section of their own (`--edges`), not a
column: at 32 clients of degree 4 to 8 a column would push every row past a screen's width.
Imports only the stdlib, rundir and core.membership (no torch) unless `--store` is given:
it starts fast.

Assumes: called by seedflood.cli's dispatch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from seedflood.rundir.layout import CheckpointError, RunDir
from seedflood.rundir.liveview import STALE_S, Row, View, merge
from seedflood.rundir.logchanges import Membership, read_membership
from seedflood.rundir.metrics import human_bytes
from seedflood.rundir.status import EVALUATOR, RUNNING, read_statuses

if TYPE_CHECKING:
    from seedflood.comm.storeview import StoreView

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen
COLUMNS = (
    "NAME",
    "STATE",
    "STEP",
    "STEP/S",
    "COMMITTED",
    "DIGEST",
    "AGREE",
    "MEMBERS",
    "INC",
    "LINKS",
    "SENT/S",
    "SENT",
    "RECEIVED",
    "AGE",
    "HOST:PID",
)


CHANGES_SHOWN = 5
"""Roster changes the text shows (the newest); `--json` holds them all."""


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`status` (once; `--watch` to redraw) and `watch` (redraws; `--once` to print once): one
    command, two spellings."""
    st = sub.add_parser(
        "status",
        help="the roster of a run, running or finished: each process's step, incarnation, digest, links, "
        "bytes; joins and leaves",
    )
    st.add_argument("--watch", action="store_true", help="redraw the view until the run ends")
    w = sub.add_parser("watch", help="seedflood status --watch: the view of a running run, redrawn until it ends")
    w.add_argument("--once", action="store_true", help="print the view once and exit (seedflood status)")
    for p in (st, w):
        p.add_argument("run_dir")
        p.add_argument("--json", action="store_true", help="print the merged view once as one JSON object and exit")
        p.add_argument("--edges", action="store_true", help="also show each client's bytes sent/received per link")
        p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between redraws (default 1)")
        p.add_argument(
            "--store",
            metavar="HOST:PORT",
            help="also read the run's rendezvous store (SEEDFLOOD_STORE, or MASTER_ADDR:MASTER_PORT): each node's "
            "latest incarnation and the restarts and new ids waiting for a sponsor; read-only",
        )
        p.add_argument(
            "--stale",
            type=float,
            default=STALE_S,
            metavar="S",
            help=f"show a running process whose record is older than S seconds as stale (default {STALE_S:g})",
        )
    st.set_defaults(fn=cmd_status)
    w.set_defaults(fn=cmd_status, watch=None)


def view_of(run: RunDir, stale_s: float) -> View:
    statuses, problems = read_statuses(run)
    membership = None
    try:
        if run.log.is_file() and run.log.stat().st_size:  # an empty file: no header yet, nothing to show
            membership = read_membership(run.log)
    except CheckpointError as e:
        problems.append(str(e))
    except OSError as e:  # gone or unreadable between the look and the read
        problems.append(f"{run.log}: unreadable ({e})")
    return merge(statuses, problems, time.time(), stale_s, membership)


def store_of(address: str | None, view: View) -> StoreView | None:
    """What the store at `address` says of the view's nodes and of every id that knocked; None
    without `--store`, or when it cannot be read (then one line in the view's problems)."""
    if address is None:
        return None
    from seedflood.comm.storeview import StoreViewError, read_store  # torch: only with --store

    nodes = {r.status.node for r in view.rows if r.status.node is not None}
    if view.membership is not None:
        nodes |= {*view.membership.start, *view.membership.members}
    try:
        return read_store(address, nodes)
    except StoreViewError as e:
        view.problems.append(str(e))
        return None


def cmd_status(args: argparse.Namespace) -> int:
    from seedflood.core.config.configerror import ConfigError

    if args.interval <= 0 or args.stale <= 0:
        raise ConfigError("--interval and --stale take a number of seconds > 0")
    if args.store is not None:
        from seedflood.comm.storeview import StoreViewError, parse_address

        try:
            parse_address(args.store)
        except StoreViewError as e:
            raise ConfigError(str(e)) from None
    redraw = args.watch if args.watch is not None else not args.once  # `watch` redraws unless --once
    run = RunDir.watched(args.run_dir)
    if args.json:
        view = view_of(run, args.stale)
        store = store_of(args.store, view)
        seen = {"run": str(run.root), **view.to_dict()}
        if args.store is not None:
            seen["store"] = None if store is None else store.to_dict()
        print(json.dumps(seen, sort_keys=True))
        return 0 if view.readable else 1
    tty = sys.stdout.isatty()
    while True:
        view = view_of(run, args.stale)
        store = store_of(args.store, view)
        text = render(run, view, args.edges, store)
        print(CLEAR + text if tty and redraw else text, flush=True)
        if not redraw or over(view):
            return 0 if view.readable else 1
        time.sleep(args.interval)
        if not tty:
            print()


def over(view: View) -> bool:
    """The evaluator has written its final record, and every other process its own or nothing
    for longer than the stale bound (a killed process never writes a final record)."""
    rows = view.rows
    ended = [r for r in rows if r.name == EVALUATOR and r.status.state != RUNNING]
    return bool(ended) and all(r.status.state != RUNNING or r.stale for r in rows)


def render(run: RunDir, view: View, edges: bool = False, store: StoreView | None = None) -> str:
    """The view as text: a heading line (the run, the agreement), one line per process, the
    membership, the bytes per link (`edges`), what the store says (`store`), then the problems."""
    if view.agree is None:
        agreement = "agreement: nothing to compare yet"
    elif view.agree:
        at = "" if view.step is None else f" (step {view.step}, digest {view.digest})"
        agreement = f"agreement: all agree{at}"
    else:
        agreement = f"agreement: DISAGREE: {', '.join(view.odd)} differ from the majority"
    lines = [f"{run.root}  {time.strftime('%H:%M:%S')}  {agreement}"]
    if not view.rows and not view.problems:
        lines.append("no status records yet (they appear once the processes have started)")
    elif view.rows:
        table = [list(COLUMNS), *(cells(r) for r in view.rows)]
        widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
    if view.membership is not None:
        lines += membership_lines(view.membership, view.missing)
    if edges:
        lines += edge_lines(view.rows)
    if store is not None:
        lines += store_lines(store, view.rows)
    lines += [f"unreadable: {p}" for p in view.problems]
    lines += [f"{r.name}: {r.status.state}: {r.status.reason}" for r in view.rows if r.status.reason]
    return "\n".join(lines)


def membership_lines(m: Membership, missing: Sequence[int]) -> list[str]:
    """The log's roster after its last whole step, and its newest changes by step."""
    joins = f"{m.joins} join{'' if m.joins == 1 else 's'}"
    leaves = f"{m.leaves} leave{'' if m.leaves == 1 else 's'}"
    head = f"membership (log, {m.steps} steps): {len(m.members)} members {ids(m.members)}"
    head += f"; {joins}, {leaves}" if m.changes else "; no joins or leaves"
    if m.changes and m.start != m.members:
        head += f" (started with {ids(m.start)})"
    lines = [head]
    if len(m.changes) > CHANGES_SHOWN:
        lines.append(f"  ({len(m.changes) - CHANGES_SHOWN} earlier changes: --json lists them)")
    lines += [f"  {c.describe()}" for c in m.changes[-CHANGES_SHOWN:]]
    if missing:
        lines.append(f"  members without a status record: {ids(missing)}")
    return lines


def edge_lines(rows: Iterable[Row]) -> list[str]:
    """One line per client: each link's peer (! when its edge is down), bytes sent/received."""
    clients = [r for r in rows if r.status.node is not None]
    if not clients:
        return []
    lines = ["bytes per link (peer:sent/received, ! = edge down now; ev: sent to the evaluator)"]
    width = max(len(r.name) for r in clients)
    for r in clients:
        links = [f"{x.peer}{'' if x.up else '!'}:{short(x.sent)}/{short(x.received)}" for x in r.links]
        to_evaluator = r.status.edges.get(-1)
        if to_evaluator is not None:
            links.append(f"ev:{short(to_evaluator[0])}")
        lines.append(f"  {r.name.ljust(width)}  {' '.join(links) or '-'}")
    return lines


def store_lines(store: StoreView, rows: Iterable[Row]) -> list[str]:
    """The store's latest incarnation of each node, then a line for each life the status records
    do not show yet (a restart or a new id that registered after the record was written)
    and each one waiting for a sponsor."""
    shown = {r.status.node: r.status.incarnation for r in rows if r.status.node is not None}
    registered = [f"{p.node}:{p.incarnation}" for p in store.processes if p.incarnation]
    knocks = f"{store.knocks} knock{'' if store.knocks == 1 else 's'} of new ids"
    lines = [f"store {store.address}: latest incarnations {' '.join(registered) or 'none'}; {knocks}"]
    for p in store.processes:
        ahead = p.incarnation > shown.get(p.node, 0)
        if p.waiting or (ahead and (p.knocked or p.incarnation > 1)):
            lines.append(f"  {p.describe()}" + ("; no status record of it yet" if ahead else ""))
    return lines


def cells(row: Row) -> list[str]:
    s = row.status
    client = s.node is not None
    return [
        row.name,
        row.shown_state,
        f"{s.step}/{s.total}",
        f"{s.steps_per_s:.2f}",
        str(s.committed),
        s.digest or "-",
        {True: "yes", False: "NO", None: "-"}[row.agrees],
        "-" if s.members is None else members(s.members),
        str(s.incarnation) if client else "-",
        links(row) if client else "-",
        f"{human_bytes(s.sent_per_s)}/s" if client else "-",
        human_bytes(s.sent) if client else "-",
        human_bytes(s.received) if client else "-",
        f"{row.age_s:.0f}s",
        f"{s.host}:{s.pid}",
    ]


def links(row: Row) -> str:
    """Edges up / links, and which are down: "2/3 down:5"."""
    all_links = row.links
    down = [x.peer for x in all_links if not x.up]
    text = f"{len(all_links) - len(down)}/{len(all_links)}"
    return f"{text} down:{','.join(map(str, down))}" if down else text


def members(nodes: Sequence[int], width: int = 16) -> str:
    text = ",".join(map(str, nodes))
    return text if len(text) <= width else f"{len(nodes)} nodes"


def ids(nodes: Sequence[int]) -> str:
    """Sorted ids with runs folded: 0-3,5,7-9."""
    parts: list[str] = []
    for n in sorted(nodes):
        if parts and parts[-1].rpartition("-")[2] == str(n - 1):
            first = parts[-1].partition("-")[0]
            parts[-1] = f"{first}-{n}"
        else:
            parts.append(str(n))
    return ",".join(parts) or "none"


def short(n: float) -> str:
    """A byte count in at most 6 characters: 512B, 12.0K, 3.4M, 1.2G."""
    for unit in ("B", "K", "M"):
        if abs(n) < 1024:
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}G"
