"""The launcher environment and the process group.

Owns:
- `World`, `WorldError`, `check_world`: comm/world.py's (torch-free), re-exported here.
- `process_group`: a gloo process group with the configured timeout, torn down in `finally`
  without anything that can block on a dead peer; it yields a `Group` for the run's only
  collective steps (the resume broadcast, the final reports).
- `check_store_port`: rank 0 that hosts the rendezvous store refuses a MASTER_PORT another
  process holds before its model loads (one line, comm/listen.py); `serve_store` (`seedflood
  store`) the same for its --port.
- `free_port`. (CPUs, threads and memory of this host are `ml.machine`'s.)
- `quiet_cpp_warnings`: torch's C++ warnings off in a launched role (each failure is one line).

Assumes: every process of a run sees the same MASTER_ADDR/MASTER_PORT (under SLURM without
MASTER_PORT the port derives from SLURM_JOB_ID, so all tasks of a job agree without talking).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import pickle
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from seedflood.comm.bounded import BoundedStore
from seedflood.comm.listen import listen_error
from seedflood.comm.world import World, WorldError  # used here; runtime.World, runtime.WorldError for callers
from seedflood.comm.world import check_world as check_world  # re-exported: runtime.check_world as before
from seedflood.comm.world import expand_nodelist as expand_nodelist
from seedflood.core.config.hostport import host_port
from seedflood.core.config.systemsections import TransportConfig

log = logging.getLogger(__name__)

REPORT_POLL_S = 0.1  # how often the evaluator looks for the clients' final reports (s)
REPORT_S = 10.0  # how often a start-up wait says on screen what it waits for (s)


CPP_LOG_ERROR = 2
"""c10's log level ERROR (0 INFO, 1 WARNING: torch's default, 2 ERROR, 3 FATAL), as TORCH_CPP_LOG_LEVEL names them."""


def quiet_cpp_warnings() -> bool:
    """Raise torch's C++ log level to ERROR, as TORCH_CPP_LOG_LEVEL=ERROR would, unless that
    variable is set (then the user's level stands: WARNING brings the C++ warnings back).
    Returns whether it raised the level.

    Why: c10d's TCPStore client logs a WARNING holding the C++ exception's whole text (a 12-22
    frame backtrace) before it raises the same error to Python, where it is said in one line
    (bounded.StoreGone, a TransportError, a WorldError): a dead store put two such backtraces on
    the evaluator's stderr. The variable is read once, when torch is imported, which has happened
    by the time a role starts (and in the test harness's forked processes before any seedflood
    code runs), so this writes what it sets: libc10's exported FLAGS_caffe2_log_level, which
    c10d's log calls read each time. A torch build without that symbol is left as it is."""
    if os.environ.get("TORCH_CPP_LOG_LEVEL"):
        return False
    try:
        c10 = ctypes.CDLL(str(next((Path(torch.__file__).parent / "lib").glob("libc10.*"))))
        level = ctypes.c_int.in_dll(c10, "FLAGS_caffe2_log_level")
    except (StopIteration, OSError, ValueError):  # no libc10 beside torch, or no such symbol in it
        return False
    level.value = max(level.value, CPP_LOG_ERROR)
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now (another process may still take it before we bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Group:
    """The collective side of a run, over the process group's store and gloo.

    Only start-up and the end of a run use it, never a hop: `broadcast` (rank 0's resume log to
    every rank) and `post` / `collect` (each client leaves its final report in the rendezvous
    store and exits; the evaluator reads them when it has finished, however long its scoring
    took, so finishing never waits on the slowest role as a collective would).
    """

    def __init__(self, world: World, store: dist.Store, timeout: timedelta) -> None:
        self.world = world
        self._store: dist.Store | BoundedStore = store
        self._timeout = timeout

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """`obj` from rank `src` on every rank (pickled; only for trusted peers of one run)."""
        box = [obj if self.world.rank == src else None]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    @staticmethod
    def report_key(key: str) -> str:
        """The store key `post` leaves `key`'s value under."""
        return f"report/{key}"

    def post(self, key: str, value: Any) -> None:
        """Leave a JSON value under `key` for `collect` (returns at once)."""
        self._store.set(self.report_key(key), json.dumps(value))

    def collect(self, keys: Sequence[str], timeout_s: float | None = None) -> dict[str, Any]:
        """The values posted under `keys`, waiting at most timeout_s (default: the group's).
        Raises WorldError naming who did not report, or bounded.StoreGone when the store is.
        Polls (`check`, one round trip, every REPORT_POLL_S) rather than one long store wait, so
        a store that went silent is found within its call bound, not at the end of timeout_s."""
        names = [self.report_key(k) for k in keys]
        bound = timeout_s if timeout_s is not None else self._timeout.total_seconds()
        deadline = time.monotonic() + bound
        while not self._store.check(names):
            if time.monotonic() > deadline:
                missing = [k for k, n in zip(keys, names) if not self._store.check([n])]
                raise WorldError(f"no final report from {', '.join(missing)} within {bound:g} s")
            time.sleep(REPORT_POLL_S)
        return {k: json.loads(self._store.get(n)) for k, n in zip(keys, names)}


class StoreGroup(Group):
    """A churn run's collective side: the store alone, no process group (a static world could
    never take a restarted client back). `broadcast` is rank `src` setting a key the others wait
    for; `store` is what links.EdgeTransport connects edges through."""

    def __init__(self, world: World, store: dist.Store, timeout: timedelta, base: dist.Store) -> None:
        super().__init__(world, store, timeout)
        self.store: dist.Store | BoundedStore = store
        self._base = base

    def started(self, timeout_s: float) -> None:
        """After start-up: every store call is bounded by the hop timeout, not the start-up bound, so a
        client cut off from the store's host finds out (and stops) in timeout_s: `store` becomes
        a bounded.BoundedStore (TCPStore's own timeout does not bound a call to a host that went
        silent). Waits that must be long (`collect`) pass their own bound."""
        self._base.set_timeout(timedelta(seconds=timeout_s))
        self.store = self._store = BoundedStore(self._store, timeout_s)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank `src` sets the key; the others wait for it within the group's (start-up) timeout,
        saying on screen every REPORT_S that they wait (rank 0 may still be loading its model)."""
        key = f"broadcast/{src}"
        if self.world.rank == src:
            self._store.set(key, pickle.dumps(obj))
            return obj
        bound = self._timeout.total_seconds()
        start = time.monotonic()
        report = start + REPORT_S
        while not self._store.check([key]):
            now = time.monotonic()
            if now - start > bound:
                raise WorldError(
                    f"rank {src} did not start within {bound:g} s (transport.startup_timeout_s): nothing to resume from"
                )
            if now >= report:
                log.warning("waiting for rank %d (the evaluator) to start (%.0f s of %g)", src, now - start, bound)
                report = now + REPORT_S
            time.sleep(REPORT_POLL_S)
        return pickle.loads(self._store.get(key))  # only for trusted peers of one run


def _hosts_store(world: World) -> bool:
    """Whether this process hosts the rendezvous store: rank 0, unless torchrun's agent already
    does (TORCHELASTIC_USE_AGENT_STORE)."""
    return world.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"


def check_store_port(world: World, churn: bool) -> None:
    """ListenError (one line) now, before the model loads, when this process is to host the
    rendezvous store on MASTER_PORT (`_hosts_store`; a churn run with SEEDFLOOD_STORE has its
    store elsewhere) and another process already listens there. The test bind is let go at once
    (SO_REUSEADDR, as TCPStore binds): the store binds the port for good later."""
    if not world.master_port or not _hosts_store(world) or (churn and store_address() is not None):
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", world.master_port))
        except OSError as e:
            raise listen_error(STORE_HOST, "", world.master_port, e, "MASTER_PORT") from None


STORE_HOST = "rank 0 (the rendezvous store's host)"


def _rendezvous_store(world: World, port: int, timeout: timedelta, **options: Any) -> dist.TCPStore:
    """The TCPStore at master_addr:port: rank 0 hosts it, unless torchrun's agent already does
    (`_hosts_store`)."""
    host = _hosts_store(world)
    try:
        return dist.TCPStore(
            world.master_addr,
            port,
            world.world_size or None,  # a new id (world_size 0) is a client of the store, never its host
            is_master=host,
            timeout=timeout,
            **options,
        )
    except dist.DistNetworkError as e:
        if host and "listen" in str(e):  # a port another process holds: one line, not a C++ trace
            raise listen_error(STORE_HOST, "", port, e, "MASTER_PORT") from None
        raise


def serve_store(host: str, port: int) -> None:
    """Host a TCPStore on host:port until the process is killed (`seedflood store`): a store
    that outlives every role, so the evaluator may die and restart, and rejoins keep working.

    It listens on `host` only: TCPStore's server alone listens on every interface whatever its
    host says, so the socket is bound here and handed to it (`master_listen_fd`); 0.0.0.0 is
    every IPv4 interface. A port that cannot be had is a ListenError (one line naming it)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.create_server((host, port), family=family, backlog=4096)
    except OSError as e:
        raise listen_error("seedflood store", host, port, e, "--port") from None
    store = dist.TCPStore(
        host,
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(days=365),
        master_listen_fd=listener.fileno(),
    )
    print(f"seedflood store listening on {host}:{store.port}", flush=True)
    while True:
        time.sleep(3600)
    del store  # pragma: no cover


RUN_PREFIX = "seedflood/run"  # a churn run's keys in its store (rendezvous.py lists them; storeview.py reads them)


def store_address(environ: Mapping[str, str] = os.environ) -> tuple[str, int] | None:
    """SEEDFLOOD_STORE=HOST:PORT: the external store of a churn run (None: rank 0 hosts it)."""
    text = environ.get("SEEDFLOOD_STORE", "").strip()
    if not text:
        return None
    if (address := host_port(text)) is None:
        raise WorldError(f"SEEDFLOOD_STORE={text!r} is not HOST:PORT")
    return address


@contextmanager
def store_group(world: World, cfg: TransportConfig) -> Iterator[StoreGroup]:
    """The rendezvous store of a churn run; no process group. With SEEDFLOOD_STORE set, every
    process connects to that store (`seedflood store`); otherwise rank 0, the evaluator, hosts it
    (unless a launcher serves one at MASTER_ADDR:MASTER_PORT, as torchrun's agent does)."""
    # Start-up waits for the slowest process to load its model (the store's host included), so
    # it gets transport.startup_timeout_s, whatever transport.timeout_s says (that one bounds hops).
    timeout = timedelta(seconds=max(cfg.timeout_s, cfg.startup_timeout_s))
    quiet_cpp_warnings()  # a dead store is one line (bounded.StoreGone), not two C++ backtraces
    external = store_address()
    if external is not None:
        log.info("connecting to the store at %s:%d (up to %g s)", *external, timeout.total_seconds())
        store = dist.TCPStore(external[0], external[1], is_master=False, timeout=timeout)
        yield StoreGroup(world, dist.PrefixStore(RUN_PREFIX, store), timeout, store)
        return
    port = world.master_port or free_port()
    if world.rank:
        log.info(
            "connecting to the store at %s:%d (rank 0 hosts it; up to %g s)",
            world.master_addr,
            port,
            timeout.total_seconds(),
        )
    store = _rendezvous_store(world, port, timeout, wait_for_workers=False)
    yield StoreGroup(world, dist.PrefixStore(RUN_PREFIX, store), timeout, store)


@contextmanager
def process_group(world: World, cfg: TransportConfig) -> Iterator[Group]:
    """Initialise the default gloo process group for `world`; destroy it on the way out.

    The rendezvous is an explicit TCPStore on master_addr:master_port hosted by rank 0. The
    group timeout (cfg.timeout_s) bounds every wait on a silent peer. Teardown is
    destroy_process_group only (no final barrier: a dead peer would make it hang); failures
    there are logged, never raised over the error that is already leaving the block.
    """
    quiet_cpp_warnings()  # a peer's or the store's failure is one line, not a C++ backtrace
    port = world.master_port or free_port()
    timeout = timedelta(seconds=cfg.timeout_s)
    # The rendezvous waits for the slowest process to load its model: transport.startup_timeout_s,
    # not the hop timeout (a slow loader on a busy machine must not fail the start).
    # Under torchrun the store at MASTER_PORT is the agent's (TORCHELASTIC_USE_AGENT_STORE) and it
    # outlives a --max-restarts restart: without a per-attempt prefix the restarted group would
    # read the dead group's gloo addresses and fail in connectFullMesh ("Connection refused").
    store = _rendezvous_store(world, port, timedelta(seconds=max(cfg.timeout_s, cfg.startup_timeout_s)))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"seedflood/attempt-{attempt}", store)
    dist.init_process_group("gloo", store=store, rank=world.rank, world_size=world.world_size, timeout=timeout)
    log.debug("rank %d/%d: process group up via %s:%d", world.rank, world.world_size, world.master_addr, port)
    try:
        yield Group(world, store, timeout)
    finally:
        try:
            dist.destroy_process_group()
        except Exception as e:  # a dead peer may have broken the group already
            log.warning("rank %d: process group teardown failed: %s", world.rank, e)
