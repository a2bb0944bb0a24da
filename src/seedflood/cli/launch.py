"""`seedflood launch`: every process of a run on this machine (the evaluator and each client),
forked from one interpreter that imported torch and seedflood once.

Owns: the preflight (`world-size`'s), the fork server (Python's multiprocessing forkserver,
preloaded with cli/preload.py, plus transformers for a hub model), one forked `seedflood train`
per rank with the variables torchrun would set (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR=127.0.0.1, MASTER_PORT a free port; no TORCHELASTIC_RUN_ID, so rank 0 hosts the
store as under compose), each rank's stdout and stderr streamed to ours line by line, prefixed
`[rankR]: `, and the ending: the first rank to fail (non-zero exit or a signal) ends the others
(SIGTERM, then SIGKILL after GRACE_S) and the launch exits 1; SIGINT or SIGTERM to the launch
does the same and it exits 128 + the signal. A rank killed mid-step leaves a torn tail that a
resume (`checkpoint.resume`) continues from, as under torchrun.

Why: a fresh interpreter's `import torch` is about 160 MiB PSS, 143 MiB of it private; a child
forked from one that imported it shares those pages (tiny model: about 25 MiB a process,
docs/benchmarks.md, Many processes on one machine). torch.distributed's elastic launcher cannot
do this for 129 ranks: with start_method forkserver it hands every rank every rank's result
queue and fails past about 126 ("too many fds"), and with fork it forks its own agent after the
rendezvous store's threads started.

Assumes: Linux (fork; prctl names each rank `seedflood-rR` and ends it with its fork server);
one machine. The server starts from a fresh interpreter (fork + exec) that imports only the
preload, so no thread exists when a rank is forked; each rank sets its torch threads from
run.threads and LOCAL_WORLD_SIZE (machine.set_threads), the server's environment carries the
same count for OpenMP's load.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import multiprocessing
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from multiprocessing import forkserver
from multiprocessing.connection import Connection

from seedflood.cli.runs import load_config, preflight

PRELOAD = ["seedflood.cli.preload", "seedflood.cli.launch"]
HUB_PRELOAD = ["transformers", "seedflood.ml.model"]
"""Added for a model other than `tiny`: transformers' imports are about 109 MiB a process."""
GRACE_S = 30.0
"""Seconds between SIGTERM and SIGKILL when the launch ends its ranks (torchrun's default)."""
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15


def cmd_launch(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    world = preflight(cfg)  # the full one: a bad run stops here with its one line, exit 2
    from seedflood.ml import machine

    # OpenMP reads its thread count as torch loads in the server; each rank sets torch's too.
    machine.threads_env(cfg.run.threads, world, os.environ)
    context: multiprocessing.context.ForkServerContext = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD + (HUB_PRELOAD if cfg.model.name != "tiny" else []))
    argv = [
        "train",
        *(["--config", args.config] if args.config else []),
        *(a for s in args.set or [] for a in ("--set", s)),
    ]
    port = _free_port()
    base = {
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PYTHONUNBUFFERED": "1",
    }
    print(
        f"seedflood launch: {world} processes (evaluator + {world - 1} clients), store 127.0.0.1:{port}",
        file=sys.stderr,
    )
    return Ranks(context, world, base, argv).run()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Ranks:
    """The forked ranks of one launch, their output and their ending."""

    def __init__(
        self, context: multiprocessing.context.ForkServerContext, world: int, base: dict[str, str], argv: Sequence[str]
    ) -> None:
        self.context, self.world, self.base, self.argv = context, world, base, list(argv)
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.selector = selectors.DefaultSelector()
        self.partial: dict[int, bytes] = {}
        self.stop_signal: int | None = None
        self.failed: tuple[int, int] | None = None  # (rank, exit code) of the first to fail

    def run(self) -> int:
        handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for rank in range(self.world):
                self._start(rank)
                if self.stop_signal is not None:
                    break
            self._wait()
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
            self._end(kill_now=True)
        if self.stop_signal is not None:
            print(f"seedflood launch: stopped by {signal.Signals(self.stop_signal).name}", file=sys.stderr)
            return 128 + self.stop_signal
        if self.failed is not None:
            rank, code = self.failed
            print(f"seedflood launch: rank {rank} {_how(code)}; the others were ended", file=sys.stderr)
            return 1
        return 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum

    def _start(self, rank: int) -> None:
        pipes = [self.context.Pipe(duplex=False) for _ in (1, 2)]  # (read, write) for stdout, stderr
        env = {**self.base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        p = self.context.Process(target=_rank, args=(rank, env, self.argv, pipes[0][1], pipes[1][1]), daemon=False)
        p.start()
        for (r, w), fd in zip(pipes, (1, 2), strict=True):
            w.close()
            self.selector.register(r, selectors.EVENT_READ, (rank, fd))
        self.selector.register(p.sentinel, selectors.EVENT_READ, (rank, 0))
        self.procs.append(p)

    def _wait(self) -> None:
        """Stream output until every rank exited and every pipe is drained; on the first failure
        or a signal, end the rest (SIGTERM, SIGKILL after GRACE_S)."""
        ending_since: float | None = None
        while self.selector.get_map():
            for key, _ in self.selector.select(timeout=0.5):
                rank, fd = key.data
                if fd == 0:  # the rank exited
                    self.selector.unregister(key.fileobj)
                    code = self.procs[rank].exitcode
                    if code and self.failed is None:
                        self.failed = (rank, code)
                else:
                    assert isinstance(key.fileobj, Connection)
                    self._pump(key.fileobj, rank, fd)
            if (self.failed is not None or self.stop_signal is not None) and ending_since is None:
                ending_since = time.monotonic()
                self._end(kill_now=False)
            if ending_since is not None and time.monotonic() - ending_since > GRACE_S:
                self._end(kill_now=True)

    def _pump(self, conn: Connection, rank: int, fd: int) -> None:
        key = 2 * rank + fd
        try:
            data = os.read(conn.fileno(), 1 << 16)
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(conn)
            conn.close()
            data = self.partial.pop(key, b"")
            if data:
                _write(fd, b"[rank%d]: " % rank + data + b"\n")
            return
        *lines, rest = (self.partial.pop(key, b"") + data).split(b"\n")
        if rest:
            self.partial[key] = rest
        if lines:
            _write(fd, b"".join(b"[rank%d]: " % rank + line + b"\n" for line in lines))

    def _end(self, kill_now: bool) -> None:
        for p in self.procs:
            if p.exitcode is None and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL if kill_now else signal.SIGTERM)
        if kill_now:
            for p in self.procs:
                p.join()


def _write(fd: int, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]


def _how(code: int) -> str:
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"


def _rank(rank: int, env: dict[str, str], argv: list[str], out: Connection, err: Connection) -> None:
    """Runs in the forked child: become rank `rank`'s `seedflood train`, then exit as it would."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NAME, f"seedflood-r{rank}".encode(), 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the fork server goes when the launch goes
    if os.getppid() == 1:  # the server went before the prctl
        os._exit(1)
    # Each forked child holds the write end of the server's "alive" pipe, and the server exits only
    # once every holder closed it: a rank does not start processes, so it lets go, and a killed
    # launch takes the server, and so (the prctl) every rank, with it.
    server = getattr(forkserver, "_forkserver", None)
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        with contextlib.suppress(OSError):
            os.close(alive)
        server._forkserver_alive_fd = None  # type: ignore[union-attr]
    os.environ.update(env)
    for conn, fd in ((out, 1), (err, 2)):
        os.dup2(conn.fileno(), fd)
        conn.close()
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(  # type: ignore[misc]  # as the interpreter's own
        io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(  # type: ignore[misc]
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
    )
    sys.argv = ["seedflood", *argv]
    from seedflood.cli import exit_process, main

    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    exit_process(code, finalize=False)
