"""Stand-in for `python -m seedflood` that proves the launchers before the runtime exists.

Run as `python -m gloo_probe train --config FILE [--set k=v ...]` with tests/e2e on PYTHONPATH
(the launchers run it when SEEDFLOOD_MODULE=gloo_probe). It honours the same contract as
`seedflood train`: reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (torchrun, compose, netns) or
SLURM_PROCID/SLURM_NTASKS/SLURM_JOB_NODELIST (plain srun); rank 0 is the evaluator, ranks 1..N
are clients and WORLD_SIZE must be N+1; writes metrics.jsonl (last line "final": true),
log.bin, checkpoints/latest/ and summary.json ("client_hashes", "param_hash") to run.out_dir;
resumes from checkpoints/latest when checkpoint.resume is true.

What it does: every step each client makes a pseudo-message (origin, step, scalar) from a hash,
the messages travel N-1 hops along a directed ring of clients over gloo point-to-point sends,
client 1 forwards the complete step to the evaluator, and everyone applies the step's messages
in origin order to a small float32 vector. So the hashes agree exactly when every message got
through, in any network, and a resumed run equals an uninterrupted one.

Fault injection for restart tests: PROBE_FAIL=RANK:STEP makes that rank exit 1 before STEP the
first time (a marker file in out_dir keeps it from failing again after the restart).
Also implements `world-size`, `sweep` and `sweep-summary` the way the real CLI will.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from seedflood.core.config import runconfig as config_mod
from seedflood.core.config.configerror import ConfigError
from seedflood.experiments import sweep as sweep_mod

DIM = 64
HEADER = struct.Struct("<qqd")  # origin, step, scalar


def world_from_env() -> tuple[int, int, str, int]:
    """(rank, world size, master address, master port) from torchrun's or SLURM's variables."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return (
            int(env["RANK"]),
            int(env["WORLD_SIZE"]),
            env.get("MASTER_ADDR", "127.0.0.1"),
            int(env.get("MASTER_PORT", "29500")),
        )
    if "SLURM_PROCID" in env:
        addr = env.get("MASTER_ADDR")
        if not addr:
            hosts = subprocess.run(
                ["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], capture_output=True, text=True, check=True
            ).stdout.split()
            addr = hosts[0]
        port = int(env.get("MASTER_PORT", 29500 + int(env.get("SLURM_JOB_ID", "0")) % 1000))
        return int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), addr, port
    raise SystemExit("gloo_probe: no RANK/WORLD_SIZE (torchrun) or SLURM_PROCID (srun) in the environment")


def make_store(rank: int, world: int, addr: str, port: int, timeout_s: float) -> dist.Store:
    """The rendezvous store, with a prefix per torchrun restart.

    Under torchrun every attempt of a restarted group reuses the agent's store at MASTER_PORT,
    and plain env:// leaves the dead group's gloo addresses in it: the restarted group then fails
    in connectFullMesh ("Connection refused"). A prefix per TORCHELASTIC_RESTART_COUNT avoids that.
    Without torchrun (compose, netns, srun) rank 0 hosts the store.
    """
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(addr, port, world, is_master=(rank == 0 and not agent), timeout=timedelta(seconds=timeout_s))
    return dist.PrefixStore(f"seedflood/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def _seeded(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "little")


def scalar(seed: int, origin: int, step: int) -> float:
    return (_seeded("scalar", seed, origin, step) % 2_000_001 - 1_000_000) / 1_000_000


def direction(seed: int, origin: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(_seeded("z", seed, origin, step) % (2**63))
    return torch.randn(DIM, generator=g, dtype=torch.float32)


def param_hash(theta: torch.Tensor) -> str:
    return hashlib.sha256(theta.contiguous().numpy().tobytes()).hexdigest()


class Probe:
    def __init__(self, cfg: config_mod.Config, rank: int, world: int) -> None:
        self.cfg, self.rank, self.world = cfg, rank, world
        self.n = cfg.topology.nodes
        self.out = Path(cfg.run.out_dir)
        self.bytes_sent = 0
        g = torch.Generator().manual_seed(cfg.run.seed)
        self.theta = torch.randn(DIM, generator=g, dtype=torch.float32)
        self.start = 0
        ckpt = self.out / "checkpoints" / "latest" / "state.pt"
        if cfg.checkpoint.resume and ckpt.is_file():
            state = torch.load(ckpt)
            self.theta, self.start = state["theta"], int(state["step"])
            self.bytes_sent = int(state.get("bytes", {}).get(str(rank), 0))

    # -- transport -------------------------------------------------------------------------
    def _ring_hop(self, msg: torch.Tensor) -> torch.Tensor:
        """Send to the right neighbour, receive from the left, all posted together."""
        right = self.rank % self.n + 1
        left = (self.rank - 2) % self.n + 1
        buf = torch.empty_like(msg)
        reqs = [dist.isend(msg, right), dist.irecv(buf, left)]
        for r in reqs:
            r.wait()
        self.bytes_sent += msg.numel() * msg.element_size()
        return buf

    def _apply(self, msgs: torch.Tensor, step: int) -> None:
        for origin, _, s in sorted(msgs.tolist()):
            self.theta -= self.cfg.zo.lr / self.n * float(s) * direction(self.cfg.run.seed, int(origin), step)

    # -- roles -----------------------------------------------------------------------------
    def client_step(self, step: int) -> None:
        own = torch.tensor([[self.rank, step, scalar(self.cfg.run.seed, self.rank, step)]], dtype=torch.float64)
        got, cur = [own], own
        for _ in range(self.n - 1):
            cur = self._ring_hop(cur)
            got.append(cur)
        msgs = torch.cat(got)
        if self.rank == 1 + self.cfg.eval.attach:
            dist.send(msgs, 0)
            self.bytes_sent += msgs.numel() * msgs.element_size()
        self._apply(msgs, step)

    def evaluator_step(self, step: int, log) -> None:
        msgs = torch.empty(self.n, 3, dtype=torch.float64)
        dist.recv(msgs, 1 + self.cfg.eval.attach)
        for origin, st, s in sorted(msgs.tolist()):
            log.write(HEADER.pack(int(origin), int(st), s))
        log.flush()
        self._apply(msgs, step)
        done = step + 1
        if self.cfg.eval.every and done % self.cfg.eval.every == 0:
            self._metrics({"step": done})
        if self.cfg.checkpoint.every and done % self.cfg.checkpoint.every == 0:
            self._checkpoint(done)

    def _metrics(self, extra: dict) -> None:
        loss = float(self.theta.double().pow(2).mean())
        rec = {
            "step": extra["step"],
            "accuracy": 1.0 / (1.0 + loss),
            "auc": 0.5,
            "loss": loss,
            "param_hash": param_hash(self.theta),
            "time": time.time(),
            **extra,
        }
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")

    def _checkpoint(self, step: int) -> None:
        root = self.out / "checkpoints"
        tmp = root / f".tmp-{step}"
        tmp.mkdir(parents=True, exist_ok=True)
        torch.save({"theta": self.theta.clone(), "step": step}, tmp / "state.pt")
        (tmp / "step").write_text(f"{step}\n")
        latest = root / "latest"
        old = root / f".old-{step}"
        if latest.exists():
            latest.rename(old)
        tmp.rename(latest)
        if old.exists():
            for p in old.iterdir():
                p.unlink()
            old.rmdir()

    def _maybe_fail(self, step: int) -> None:
        spec = os.environ.get("PROBE_FAIL", "")
        if not spec:
            return
        rank, _, at = spec.partition(":")
        marker = self.out / f"probe-failed-{rank}-{at}"
        if int(rank) == self.rank and int(at) == step and not marker.exists():
            marker.write_text("1\n")
            print(f"gloo_probe: rank {self.rank} failing on purpose before step {step}", file=sys.stderr, flush=True)
            os._exit(1)

    def run(self) -> dict:
        delay = float(os.environ.get("PROBE_STEP_DELAY", "0"))
        log = open(self.out / "log.bin", "ab") if self.rank == 0 else None
        try:
            for step in range(self.start, self.cfg.run.steps):
                self._maybe_fail(step)
                if self.rank == 0:
                    self.evaluator_step(step, log)
                else:
                    self.client_step(step)
                if delay:
                    time.sleep(delay)
        finally:
            if log:
                log.close()
        # Final: every client reports its hash to the evaluator.
        mine = torch.frombuffer(bytearray(bytes.fromhex(param_hash(self.theta))), dtype=torch.uint8)
        if self.rank == 0:
            hashes = []
            for r in range(1, self.world):
                buf = torch.empty(32, dtype=torch.uint8)
                dist.recv(buf, r)
                hashes.append(bytes(buf.tolist()).hex())
            steps = self.cfg.run.steps
            self._checkpoint(steps)
            self._metrics({"step": steps, "final": True})
            summary = {
                "step": steps,
                "param_hash": param_hash(self.theta),
                "client_hashes": hashes,
                "world_size": self.world,
                "probe": True,
                "steps": steps,
                "bytes_per_edge_per_step": self.bytes_sent / max(1, steps),
            }
            tmp = self.out / "summary.json.tmp"
            tmp.write_text(json.dumps(summary, indent=1) + "\n")
            tmp.rename(self.out / "summary.json")
            return summary
        dist.send(mine, 0)
        return {}


def train(args: argparse.Namespace) -> int:
    cfg = config_mod.load(args.config, args.set)
    rank, world, addr, port = world_from_env()
    if world != cfg.topology.nodes + 1:
        print(
            f"gloo_probe: WORLD_SIZE={world} but topology.nodes={cfg.topology.nodes} needs {cfg.topology.nodes + 1}",
            file=sys.stderr,
        )
        return 2
    out = Path(cfg.run.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    dist.init_process_group(
        "gloo",
        store=make_store(rank, world, addr, port, cfg.transport.timeout_s),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=cfg.transport.timeout_s),
    )
    try:
        probe = Probe(cfg, rank, world)
        summary = probe.run()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print(
            f"gloo_probe: rank 0 done in {time.time() - t0:.1f}s from step {probe.start}: "
            f"param_hash {summary['param_hash'][:16]} clients agree: "
            f"{all(h == summary['param_hash'] for h in summary['client_hashes'])}",
            flush=True,
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gloo_probe")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("train", "world-size"):
        s = sub.add_parser(name)
        s.add_argument("--config", required=True)
        s.add_argument("--set", action="append", default=[])
    s = sub.add_parser("sweep")
    s.add_argument("file")
    s.add_argument("--index", default=None)
    s.add_argument("--out-root", default=None)
    s.add_argument("--set", action="append", default=[])
    s = sub.add_parser("sweep-summary")
    s.add_argument("file")
    s.add_argument("--out-root", default=None)
    s.add_argument("--format", default="table", choices=["table", "tsv", "json"])
    args = p.parse_args(argv)
    try:
        if args.cmd == "train":
            return train(args)
        if args.cmd == "world-size":
            print(config_mod.load(args.config, args.set).topology.nodes + 1)
            return 0
        if args.cmd == "sweep":
            os.environ.setdefault("SEEDFLOOD_MODULE", "gloo_probe")
            return sweep_mod.run_index(args.file, args.index, extra=args.set, out_root=args.out_root)
        rows = sweep_mod.summarize_sweep(sweep_mod.load(args.file, out_root=args.out_root))
        sys.stdout.write(sweep_mod.format_table(rows, args.format))
        return 0 if sweep_mod.all_done(rows) else 1
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
