"""Who this process is in a launched run, read from the launcher's environment, without torch.

Owns:
- `World`: who this process is (rank, world size, local rank, rendezvous address) as read from
  SEEDFLOOD_RANK / SEEDFLOOD_WORLD_SIZE (launch/churn.sh: one torchrun agent per process, so each
  agent's own RANK is 0), else torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), else SLURM (SLURM_PROCID,
  SLURM_NTASKS, SLURM_LOCALID, the first host of SLURM_JOB_NODELIST), else a single process.
  Rank 0 is the evaluator; rank r >= 1 is client topology node r - 1. SEEDFLOOD_NODE=J, read
  before all of them, makes this process brand-new node id J joining a running churn run
  (docs/churn.md, a new node id joins): a client outside the launch's ranks, whatever RANK or
  WORLD_SIZE its own launcher set (a torchrun agent of its own sets RANK=0, WORLD_SIZE=1).
- `check_world`: a one-line WorldError when the launch does not fit the topology (or a new id
  does not fit the run's open ids).

Why apart from comm/runtime.py (the process group, which imports torch; it re-exports these): a
`train` process reads its local process count here to set torch's threads before torch is
imported (cli/runs.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from seedflood.core.topology.resolve import node_of

Launcher = Literal["torchrun", "slurm", "env", "single"]
DEFAULT_PORT = 29500  # torch's own default


class WorldError(ValueError):
    """The launch environment is malformed or does not fit the run; one line."""


@dataclass(frozen=True)
class World:
    rank: int
    world_size: int
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    """0 = pick a free port at init (single process only)."""
    launcher: Launcher = "single"
    local_world_size: int = 1
    """Processes the launcher starts on this machine (LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE; 1
    when it does not say): run.threads = 0 shares the machine's cores among them."""
    node: int | None = None
    """A brand-new node id this process joins a running churn run as (SEEDFLOOD_NODE), None for a
    rank of the launch. Such a process has no rank slot: its rank is node + 1 (never 0, so it
    neither evaluates nor hosts a store) and `world_size` 0, as the run's is not its to know;
    every edge it gets is a gloo pair of its own through the run's store (links.py)."""

    def __post_init__(self) -> None:
        if self.node is not None:
            if self.node < 0 or self.rank != self.node + 1 or self.world_size != 0:
                raise WorldError(f"SEEDFLOOD_NODE={self.node} is not a node id")
        elif not 0 <= self.rank < self.world_size:
            raise WorldError(f"rank {self.rank} is outside world size {self.world_size}")
        if not 0 <= self.master_port <= 65535:
            raise WorldError(f"master port {self.master_port} is not a TCP port")
        if self.world_size > 1 and self.master_port == 0:
            raise WorldError(f"world size {self.world_size} needs MASTER_PORT")
        if self.local_world_size < 1:
            raise WorldError(f"local world size {self.local_world_size} is not a process count")

    @property
    def is_evaluator(self) -> bool:
        return self.rank == 0

    @property
    def client_node(self) -> int:
        """Node id of this client (the evaluator gets -1 = transport.EVALUATOR)."""
        if self.node is not None:
            return self.node
        return -1 if self.is_evaluator else node_of(self.rank)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> World:
        env = environ
        if "SEEDFLOOD_NODE" in env:  # a new id joining a running run: its store is SEEDFLOOD_STORE or MASTER_*
            node = _int(env, "SEEDFLOOD_NODE")
            if node < 0:
                raise WorldError(f"SEEDFLOOD_NODE={node} is not a node id")
            return cls(
                rank=node + 1,
                world_size=0,
                local_rank=_int(env, "LOCAL_RANK", 0),
                master_addr=_str(env, "MASTER_ADDR", "127.0.0.1"),
                master_port=_int(env, "MASTER_PORT", DEFAULT_PORT),
                launcher="torchrun" if "TORCHELASTIC_RUN_ID" in env else "env",
                local_world_size=_int(env, "LOCAL_WORLD_SIZE", 1),
                node=node,
            )
        if "SEEDFLOOD_RANK" in env:  # launch/churn.sh: one agent per process, each its own world of 1
            return cls(
                rank=_int(env, "SEEDFLOOD_RANK"),
                world_size=_int(env, "SEEDFLOOD_WORLD_SIZE"),
                local_rank=_int(env, "SEEDFLOOD_RANK"),
                master_addr=_str(env, "MASTER_ADDR", "127.0.0.1"),
                master_port=_int(env, "MASTER_PORT", DEFAULT_PORT),
                launcher="torchrun" if "TORCHELASTIC_RUN_ID" in env else "env",
                local_world_size=_int(env, "SEEDFLOOD_LOCAL_WORLD_SIZE", 1),
            )
        if "RANK" in env or "WORLD_SIZE" in env:  # torchrun, or any launcher that sets them
            single = _int(env, "WORLD_SIZE") == 1
            return cls(
                rank=_int(env, "RANK"),
                world_size=_int(env, "WORLD_SIZE"),
                local_rank=_int(env, "LOCAL_RANK", 0),
                master_addr=_str(env, "MASTER_ADDR", "127.0.0.1" if single else None),
                master_port=_int(env, "MASTER_PORT", 0 if single else None),
                launcher="torchrun" if "TORCHELASTIC_RUN_ID" in env else "env",
                local_world_size=_int(env, "LOCAL_WORLD_SIZE", 1),
            )
        if "SLURM_PROCID" in env:
            nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
            host = expand_nodelist(nodelist)[0] if nodelist else "127.0.0.1"
            # Without MASTER_PORT every task derives the same port from the job id
            # (20000..39999, below the usual ephemeral range).
            job = _int(env, "SLURM_JOB_ID", -1)
            port = 20000 + job % 20000 if job >= 0 else DEFAULT_PORT
            ntasks = "SLURM_NTASKS" if "SLURM_NTASKS" in env else "SLURM_NPROCS"
            return cls(
                rank=_int(env, "SLURM_PROCID"),
                world_size=_int(env, ntasks),
                local_rank=_int(env, "SLURM_LOCALID", 0),
                master_addr=_str(env, "MASTER_ADDR", host),
                master_port=_int(env, "MASTER_PORT", port),
                launcher="slurm",
                local_world_size=_int(env, "SLURM_NTASKS_PER_NODE", 1),
            )
        return cls(rank=0, world_size=1)


def _str(env: Mapping[str, str], name: str, default: str | None = None) -> str:
    if name in env and env[name]:
        return env[name]
    if default is None:
        raise WorldError(f"{name} is not set (a multi-process launch needs it)")
    return default


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = _str(env, name, None if default is None else str(default))
    try:
        return int(text)
    except ValueError:
        raise WorldError(f"{name}={text!r} is not an integer") from None


def expand_nodelist(text: str) -> list[str]:
    """SLURM hostlist -> hosts: 'node[1-3,5]' -> node1 node2 node3 node5, 'a,b' -> a b,
    'n[01-02]-ib' -> n01-ib n02-ib (zero padding kept; several bracket groups multiply)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):  # split on commas outside brackets
        depth += (ch == "[") - (ch == "]")
        if depth < 0 or (ch == "," and depth == 0 and i == start):
            raise WorldError(f"malformed SLURM nodelist {text!r}")
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if depth != 0:
        raise WorldError(f"malformed SLURM nodelist {text!r}")
    return [host for part in parts for host in _expand(part, text)]


def _expand(pattern: str, text: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", pattern)
    if m is None:
        return [pattern]
    head, tail = pattern[: m.start()], pattern[m.end() :]
    hosts = []
    for item in m.group(1).split(","):
        lo, dash, hi = item.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()) or (dash and int(hi) < int(lo)):
            raise WorldError(f"malformed SLURM nodelist {text!r}")
        for v in range(int(lo), int(hi) + 1) if dash else [int(lo)]:
            hosts += _expand(f"{head}{v:0{len(lo)}d}{tail}", text)
    return hosts


def check_world(world: World, n_clients: int, ids: int | None = None) -> None:
    """Raise WorldError unless the launch has exactly n_clients clients + 1 evaluator, or, for
    a new id (SEEDFLOOD_NODE), unless it is one the run is open to: n_clients..ids-1 (`ids`:
    `Protocol.ids` of a churn run, None or n_clients where no new id may join)."""
    if world.node is not None:
        if ids is None or ids <= n_clients:
            raise WorldError(
                f"SEEDFLOOD_NODE={world.node}: this run takes no new node ids (a churn run, churn.settle >= 1, "
                f"with churn.max_nodes above its {n_clients} clients does)"
            )
        if not n_clients <= world.node < ids:
            raise WorldError(
                f"SEEDFLOOD_NODE={world.node}: the run's new node ids are {n_clients}..{ids - 1} "
                f"(churn.max_nodes={ids}; ids 0..{n_clients - 1} start as ranks 1..{n_clients})"
            )
        return
    need = n_clients + 1
    if world.world_size != need:
        how = {
            "slurm": f"srun --ntasks {need}",
            "env": f"WORLD_SIZE={need}",
        }.get(world.launcher, f"torchrun --nproc-per-node {need}")
        raise WorldError(
            f"world size {world.world_size} does not match topology: {n_clients} clients + 1 "
            f"evaluator = {need} processes (launch with {how})"
        )
