"""`seedflood watch RUN [--once] [--json] [--interval S] [--stale S]`: a live table of a run.

Owns the command: reading a run directory's status records (rundir/status.py), merging them
(rundir/liveview.py) and printing the view — a plain-text table redrawn in place with ANSI
escapes on a terminal (successive tables elsewhere), or one JSON object (`--json`). It ends
by itself once the evaluator's record is final (finished or failed) and every other record is
final or stale, or with Ctrl-C.

Exit status: 0 when every record could be read; 1 when one could not (each is one line under
the table, or in the JSON's "problems"); 2 (one line, from the CLI's dispatch) for a path that
is not a run directory (`RunDir.watched`).

Plain text rather than `rich`: a dozen columns need no layout engine, and the output stays
readable in a CI log or a pipe. Imports only the stdlib and rundir (no torch): it starts fast.

Assumes: called by seedflood.cli's dispatch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from seedflood.rundir.layout import RunDir
from seedflood.rundir.liveview import STALE_S, Row, View, merge
from seedflood.rundir.status import EVALUATOR, RUNNING, read_statuses

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
    "EDGES",
    "SENT/S",
    "SENT",
    "RECEIVED",
    "AGE",
    "HOST:PID",
)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    w = sub.add_parser("watch", help="a live table of a running run: each process's step, digest, members, bytes")
    w.add_argument("run_dir")
    w.add_argument("--once", action="store_true", help="print the table once and exit")
    w.add_argument("--json", action="store_true", help="print the merged view once as one JSON object and exit")
    w.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between redraws (default 1)")
    w.add_argument(
        "--stale",
        type=float,
        default=STALE_S,
        metavar="S",
        help=f"show a running process whose record is older than S seconds as stale (default {STALE_S:g})",
    )
    w.set_defaults(fn=cmd_watch)


def view_of(run: RunDir, stale_s: float) -> View:
    statuses, problems = read_statuses(run)
    return merge(statuses, problems, time.time(), stale_s)


def cmd_watch(args: argparse.Namespace) -> int:
    from seedflood.core.config.configerror import ConfigError

    if args.interval <= 0 or args.stale <= 0:
        raise ConfigError("--interval and --stale take a number of seconds > 0")
    run = RunDir.watched(args.run_dir)
    if args.json:
        view = view_of(run, args.stale)
        print(json.dumps({"run": str(run.root), **view.to_dict()}, sort_keys=True))
        return 0 if view.readable else 1
    tty = sys.stdout.isatty()
    while True:
        view = view_of(run, args.stale)
        text = render(run, view)
        print(CLEAR + text if tty and not args.once else text, flush=True)
        if args.once or over(view):
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


def render(run: RunDir, view: View) -> str:
    """The table: a heading line (the run, the agreement), one line per process, then the problems."""
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
    else:
        table = [list(COLUMNS), *(cells(r) for r in view.rows)]
        widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines += [f"unreadable: {p}" for p in view.problems]
    lines += [f"{r.name}: {r.status.state}: {r.status.reason}" for r in view.rows if r.status.reason]
    return "\n".join(lines)


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
        f"{len(s.peers)}/{len(s.neighbours)}" if client else "-",
        f"{size(s.sent_per_s)}/s" if client else "-",
        size(s.sent) if client else "-",
        size(s.received) if client else "-",
        f"{row.age_s:.0f}s",
        f"{s.host}:{s.pid}",
    ]


def members(nodes: Sequence[int], width: int = 16) -> str:
    text = ",".join(map(str, nodes))
    return text if len(text) <= width else f"{len(nodes)} nodes"


def size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
