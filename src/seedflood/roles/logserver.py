"""`seedflood serve-log`: a run's decided prefix, served read-only, and a newcomer's fetch of it.

Owns (docs/churn-design.md, Rejoin across processes: a log server):
- `LogSource`: the prefix (core/churn/prefix.py) of an agreed log on disk — the evaluator's
  log.bin of a run directory, or a client's own copy (eval.client_logs) — read again whenever
  the file changed, so a log another process is still appending to is served as far as its
  whole records go (a torn last record is not served yet); with each step its roster change
  and, where the log holds them (a signed run), its seals;
- `serve`: the process that serves it (`comm.logserve.LogServer`), which never trains and never
  joins the flood;
- `fetched`: a restarted or brand-new client's fetch and check of a prefix before it asks for a
  sponsor (churn.log_server): what it holds and what it tells its sponsor (`prefix.Have`), or
  nothing, in one line, when the server is down, slow, or serves another run's or a broken
  prefix (the sponsor then sends the whole log, as without a server).

May import: seedflood.core, comm (logserve), rundir.

Assumes: the log has one writer, which appends whole records and flushes each (rundir/logfile.py).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from seedflood.comm import logserve
from seedflood.core.churn import prefix
from seedflood.core.churn.prefix import Have
from seedflood.core.flood import stepstream
from seedflood.core.flood.protocol import Protocol
from seedflood.core.membership.roster import MembershipError
from seedflood.core.wire.message import FrameError
from seedflood.rundir.layout import CheckpointError, RunDir
from seedflood.rundir.logfile import LogReader
from seedflood.rundir.logheader import header_mismatch

log = logging.getLogger(__name__)

Steps = list[tuple[int, bytes]]
"""Decided steps as (step, step payload: stepstream.encode_step)."""


class LogSource:
    """The prefix of the log at `path` (a file, or a run directory's log.bin), re-read when the
    file's size or modification time changed since the last read (one stat per request). Either
    may not exist yet (a server started before the run): which it is, is decided at each read."""

    def __init__(self, path: str | Path) -> None:
        self.given = Path(path)
        self._lock = threading.Lock()  # the server answers on one thread per request
        self._key: tuple[int, int] | None = None
        self._blob = b""
        self.steps = 0  # whole step records served now
        self.torn = 0  # bytes of a torn tail left out (a record being written)
        self.signed = False  # the log holds seals (a signed run): served with each step

    @property
    def path(self) -> Path:
        """The log file served: the run directory's log.bin, or the file given."""
        return RunDir(self.given).log if self.given.is_dir() else self.given

    def __call__(self) -> bytes:
        with self._lock:
            try:
                st = os.stat(self.path)
            except OSError:
                raise logserve.Unavailable(f"no log at {self.path} yet") from None
            key = (st.st_size, st.st_mtime_ns)
            if key != self._key:
                self._blob = self._read()
                self._key = key
            return self._blob

    def _read(self) -> bytes:
        reader = LogReader(self.path)
        try:
            header, records = reader.read()
        except CheckpointError as e:
            raise logserve.Unavailable(f"cannot serve {self.path}: {e}") from None
        steps: Steps = []
        for s, msgs in records:
            change, seals = reader.changes.get(s), reader.seals.get(s)
            if seals is None:
                steps.append((s, stepstream.encode_step(msgs, change)))
                continue
            signed, certificate = stepstream.decode_seals(seals, msgs)
            steps.append((s, stepstream.encode_step(signed, change, certificate)))
        self.steps, self.torn, self.signed = len(steps), reader.torn, bool(reader.seals)
        return prefix.encode(header, steps)

    def describe(self) -> str:
        """One line: what is served now."""
        try:
            self()
        except logserve.Unavailable as e:
            return str(e)
        held = f"steps 0..{self.steps - 1}" if self.steps else "no step yet"
        return (
            f"{self.path}: {held}"
            + (" with their seals" if self.signed else "")
            + (f" ({self.torn} bytes of a record being written left out)" if self.torn else "")
        )


def serve(path: str | Path, host: str, port: int) -> None:
    """Serve the prefix of the log at `path` until killed, saying on screen what it serves."""
    source = LogSource(path)
    server = logserve.LogServer(source, source.describe, host, port)
    print(f"serve-log: http://{server.address}{logserve.PATH} (read only; never trains)", flush=True)
    print(f"serve-log: {source.describe()}", flush=True)
    reach = f"{socket.gethostname()}:{server.address.rpartition(':')[2]}" if host in ("", "0.0.0.0") else server.address
    print(f"serve-log: newcomers take it with --set churn.log_server={reach}", flush=True)
    try:
        server.serve()
    except KeyboardInterrupt:  # Ctrl-C: the way to stop it in a terminal
        pass
    finally:
        server.http.server_close()


def fetched(
    node: int, address: str, protocol: Protocol, header: Mapping[str, Any], attach: int, timeout_s: float
) -> tuple[Steps, Have]:
    """A newcomer's prefix from the log server at `address` and what it tells its sponsor: the
    steps from 0 it checked (`prefix.check`, within `timeout_s` s for the fetch) and their `Have`,
    or ([], `prefix.NOTHING`) with one line saying why not (the sponsor then sends everything).
    `header`: this process's log header; a prefix of another run (trajectory, base model) is
    refused before a step of it is replayed."""
    start = time.monotonic()
    try:
        served, steps = prefix.decode(logserve.fetch(address, timeout_s))
        if wrong := header_mismatch(served, prefix.identity(header)):
            raise FrameError(f"it is another run's log ({', '.join(wrong[:3])})")
        have = prefix.check(steps, protocol, attach)
        if not steps:
            raise FrameError("it holds no step yet")
    except (OSError, ValueError, FrameError, MembershipError) as e:
        log.warning(
            "node %d: no prefix from the log server at %s (%s): its sponsor sends the whole log", node, address, e
        )
        return [], prefix.NOTHING
    log.warning(
        "node %d: fetched steps 0..%d from the log server at %s in %.2f s; its sponsor sends the rest",
        node,
        have.step,
        address,
        time.monotonic() - start,
    )
    return steps, have
