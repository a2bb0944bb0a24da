"""What a churn run's rendezvous store says of its processes, read without writing: `read_store`.

Owns the read-only look `seedflood status RUN --store HOST:PORT` takes (docs/status.md, The
store): each node's latest registered incarnation (a restarted process registers before it asks
for a sponsor, so the store knows it before its status record does), which neighbour claimed
each restart's and each knock's catch-up (or none yet: waiting for a sponsor), and the knocks of
brand-new ids. Every call is a `peek` (a compare-and-set that never matches, so it writes
nothing), each bounded (`bounded.BoundedStore`): a store that is down or hung costs
one line, never a hang.

Assumes: the run's processes keep their keys under `RUN_PREFIX` of the store at the address
(`runtime.store_group`: `seedflood store`'s, or the one rank 0 or torchrun's agent hosts at
MASTER_ADDR:MASTER_PORT); launched processes number their lives from 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import timedelta

import torch.distributed as dist

from seedflood.comm.bounded import BoundedStore, StoreGone
from seedflood.comm.rendezvous import KNOCKS_KEY, inc_key, knock_key, parse_greeting, peek, sponsor_key
from seedflood.comm.runtime import RUN_PREFIX
from seedflood.core.config.hostport import host_port

READ_TIMEOUT_S = 5.0  # the bound on connecting and on each read (s)


class StoreViewError(RuntimeError):
    """The store could not be read (one line: its address and why)."""


@dataclasses.dataclass(frozen=True)
class Process:
    """A node's latest life as the store has it: its incarnation and who sponsors it."""

    node: int
    incarnation: int  # 0: never registered
    sponsor: int | None  # the neighbour that claimed this life's catch-up; None: none (yet)
    knocked: bool  # a brand-new id's life: it knocked for a sponsor

    @property
    def waiting(self) -> bool:
        """Registered after its first life (or knocked) and not claimed by a sponsor yet."""
        return self.sponsor is None and (self.knocked or self.incarnation > 1)

    def describe(self) -> str:
        what = "knocked (a new id)" if self.knocked else "restarted"
        state = "waiting for a sponsor" if self.sponsor is None else f"sponsored by node {self.sponsor}"
        return f"node {self.node}: incarnation {self.incarnation} {what}, {state}"


@dataclasses.dataclass(frozen=True)
class StoreView:
    address: str
    processes: tuple[Process, ...]  # by node id
    knocks: int  # knocks of brand-new ids so far

    def to_dict(self) -> dict[str, object]:
        return {
            "address": self.address,
            "knocks": self.knocks,
            "processes": [dataclasses.asdict(p) | {"waiting": p.waiting} for p in self.processes],
        }


def parse_address(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port); StoreViewError for anything else."""
    if (address := host_port(text)) is None:
        raise StoreViewError(f"--store {text!r}: not HOST:PORT")
    return address


def read_store(address: str, nodes: Iterable[int], timeout_s: float | None = None) -> StoreView:
    """The latest life of each of `nodes` and of every id that knocked, as the store at `address`
    holds them. Raises StoreViewError (one line) when it cannot be reached or read in time."""
    host, port = parse_address(address)
    timeout_s = READ_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        raw = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
    except (RuntimeError, ValueError) as e:  # DistNetworkError and DistStoreError are RuntimeErrors
        raise StoreViewError(f"store {address}: unreachable ({str(e).splitlines()[0]})") from None
    store = BoundedStore(dist.PrefixStore(RUN_PREFIX, raw), timeout_s)
    try:
        knocks = int(peek(store, KNOCKS_KEY) or 0)
        knocked: dict[int, int] = {}  # brand-new id -> its latest knocking incarnation
        for seq in range(1, knocks + 1):
            if (text := peek(store, knock_key(seq))) is not None:  # None: its writer is between its two calls
                node, inc = parse_greeting(text)
                knocked[node] = max(inc, knocked.get(node, 0))
        processes = []
        for node in sorted(set(nodes) | set(knocked)):
            inc = int(peek(store, inc_key(node)) or 0)
            sponsor = peek(store, sponsor_key(node, inc)) if inc else None
            processes.append(Process(node, inc, int(sponsor) if sponsor else None, knocked.get(node) == inc > 0))
    except (StoreGone, RuntimeError, ValueError) as e:
        raise StoreViewError(f"store {address}: unreadable ({str(e).splitlines()[0]})") from None
    return StoreView(address, tuple(processes), knocks)
