"""The baselines' machinery: the shared model as flat client vectors, and the algorithms' steps.

Owns what `baselines.train` drives (baselines.py owns the run, its scoring and its summary):
- `Flat`: one process, one model: N clients never need N models. Each client's trainable
  parameters are one flat fp32 vector; `Flat.bind(x)` points the shared model's parameters at
  views of x (no copy), so a forward, a backward or an in-place update of the parameters reads
  and writes that client's vector. Optimizer state (AdamW moments for diloco) is per client,
  flat as well. The trainable parameters are the `zo.trainable` matrices (as for SeedFlood), or
  for a `-lora` algorithm the LoRA adapters (lora.py) with the base weights frozen and shared.
- `Ctx`: what every algorithm shares (config, workload, flat view, graph, transport endpoints,
  lr) and the local steps (a MeZO step, a backprop SGD step).
- `Algorithm` and its subclasses, one per update rule (a `-lora` algorithm runs its base
  algorithm's class on the adapter vector: `Ctx.base` is the name without `-lora`):
  - dzsgd: per client a MeZO step (directions.Gaussian z from the seed SeedFlood's client would
    use, rng.derive(run seed, node, step, 0); two-point scalar on that client's batch
    `w.batch(node, t)`; θ ← θ − lr·f32(scalar)·z), then every `gossip_every` steps each client
    sends its whole vector (DENSE frame) to its neighbours and mixes x_i ← Σ_j W_ij x_j with
    Metropolis–Hastings weights.
  - dsgd: the same with a backprop SGD step (θ ← θ − lr·∇L) in place of the MeZO step.
  - choco: CHOCO-SGD (Koloskova et al. 2019): SGD step, q_i = top-k(x_i − x̂_i) (k = ⌈topk·d⌉,
    TOPK frame), x̂_j ← x̂_j + q_j, x_i ← x_i + γ Σ_j W_ij (x̂_j − x̂_i). The public copies start
    at the common initial model (x̂_j = x⁰, which every node has) rather than 0, so the
    compressed differences carry training progress, not the weights themselves. Every node that
    tracks x̂_j applies the same q_j in the same order, so one copy per node is held.
  - diloco: DiLoCo rounds (inner AdamW, flooded pseudo-gradients, outer Nesterov): diloco.py.
  - mezo: one client holding all the train data (batches of the whole train split: the batches
    a one-node SeedFlood client draws), Gaussian MeZO steps, no communication (0 bytes).

Every client's tensors travel as `tensorwire` frames through real `Transport` endpoints
(`memory.InMemoryNetwork`, one thread per node for each hop), so bytes are counted by the same
`ByteCounter` rule as SeedFlood's messages; with `algorithm.wire: counted` a gossip round reads
the neighbours' vectors in place and counts each edge's frame into the same counters
(`Gossip._mix_counted`).

Assumes: model.dtype float32 (client vectors are fp32 views); one process; updates and forwards
on one thread (the hop threads only move frames).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from seedflood.comm.memoryendpoint import MemoryTransport
from seedflood.core.config import rng
from seedflood.core.config.configerror import ConfigError
from seedflood.core.config.runconfig import Config
from seedflood.core.flood.transport import HEADER, ByteCounter
from seedflood.core.topology.graph import Topology
from seedflood.core.zo import estimate as zo
from seedflood.core.zo.directions import Gaussian
from seedflood.experiments import gossip, tensorwire
from seedflood.ml import objective
from seedflood.ml.workload import Workload


def _f32(x: float) -> float:
    """Round to the nearest float32: the scalar SeedFlood's messages carry (message.Message.make)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


# --- the shared model ------------------------------------------------------------------------


class Flat:
    """The trainable parameters of one shared model, seen as one flat fp32 vector per client."""

    def __init__(self, mdl: torch.nn.Module, names: Sequence[str]) -> None:
        params = dict(mdl.named_parameters())
        self.names = list(names)
        self.params = [params[n] for n in self.names]
        if any(p.dtype != torch.float32 for p in self.params):
            raise ConfigError("model.dtype: the baselines keep fp32 client vectors; use model.dtype=float32")
        self.sizes = [p.numel() for p in self.params]
        self.numel = sum(self.sizes)
        self.device = self.params[0].device

    def flat(self) -> torch.Tensor:
        """A new flat copy of the parameters as the model holds them now (d fp32)."""
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def bind(self, x: torch.Tensor) -> None:
        """Make the model compute with x: each parameter becomes a view of its slice of x, so
        in-place updates of the parameters write x (x must be contiguous, d fp32, on the device)."""
        for p, v in zip(self.params, x.split(self.sizes)):
            p.data = v.view(p.shape)

    def grad(self) -> torch.Tensor:
        """The flat gradient of the last backward (zeros where a tensor got none)."""
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params])

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


_scores_with_grad: Callable[..., torch.Tensor] = objective.candidate_scores_grad
"""objective.candidate_scores without its inference_mode decorator (the same computation, differentiable)."""


@dataclass
class Ctx:
    """What every algorithm shares: config, workload, flat view, graph, transport, lr."""

    cfg: Config
    name: str
    w: Workload
    flat: Flat
    direction: Gaussian
    top: Topology | None
    lr: float
    endpoints: list[MemoryTransport] = field(default_factory=list)
    pool: ThreadPoolExecutor | None = None
    train_losses: list[float] = field(default_factory=list)

    @property
    def base(self) -> str:
        """The update rule this algorithm runs ('dsgd-lora' runs 'dsgd' on the adapters)."""
        return self.name.removesuffix("-lora")

    @property
    def n(self) -> int:
        return self.top.n if self.top is not None else 1

    # -- local steps --------------------------------------------------------------------------
    def zo_step(self, node: int, step: int, x: torch.Tensor) -> None:
        """MeZO on x (in place): θ ← θ − lr·f32((L(θ+εz) − L(θ−εz)) / 2ε)·z(seed of (node, step))."""
        self.flat.bind(x)
        seed = rng.derive(self.cfg.run.seed, node, step, 0)
        seen: list[float] = []

        def loss() -> float:
            seen.append(self.w.loss(node, step))
            return seen[-1]

        scalar = zo.two_point(loss, self.direction, seed, step, self.cfg.zo.eps)
        scalar = _f32(zo.check_scalar(scalar, self.cfg.flood.max_scalar, step))
        self.direction.accumulate(step, seed, -self.lr * 1.0 * scalar)  # protocol.coefficient's form
        self.direction.commit(step)
        self.train_losses.append(sum(seen) / 2)

    def backward(self, node: int, step: int, x: torch.Tensor) -> None:
        """Gradient of client `node`'s loss on its batch of `step` at x, into the parameters' .grad."""
        self.flat.bind(x)
        batch = self.w.batch(node, step)
        for p in self.flat.params:
            p.requires_grad_(True)
        try:
            scores = _scores_with_grad(self.w.model, batch)
            loss = F.cross_entropy(scores, batch.labels.to(scores.device))
            loss.backward()
        finally:
            for p in self.flat.params:
                p.requires_grad_(False)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise zo.EstimateError(f"loss is not finite at step {step} on node {node}: lower algorithm.lr")
        self.train_losses.append(value)

    @torch.no_grad()
    def sgd_step(self, node: int, step: int, x: torch.Tensor) -> None:
        """θ ← θ − lr·∇L(θ) on x (in place)."""
        with torch.enable_grad():
            self.backward(node, step, x)
        for p in self.flat.params:
            p.data.add_(p.grad, alpha=-self.lr)
        self.flat.zero_grad()

    # -- communication ------------------------------------------------------------------------
    def exchange(self, frames: Mapping[int, Mapping[int, bytes]], step: int) -> list[dict[int, bytes]]:
        """One synchronous hop of every node (one thread each): frames[i][p] goes i → p."""
        assert self.pool is not None
        futures = [self.pool.submit(e.exchange, frames.get(e.node, {}), step) for e in self.endpoints]
        return [f.result() for f in futures]

    def counter(self) -> ByteCounter:
        return ByteCounter.merged([e.counter for e in self.endpoints])


# --- algorithms ----------------------------------------------------------------------------------


class Algorithm:
    """advance(t) runs steps t.. and returns the next step; clients() / average() are what is scored."""

    identical = False
    """True when every client holds the same vector at scoring points (nothing to compare)."""

    def __init__(self, ctx: Ctx, x0: torch.Tensor) -> None:
        self.ctx = ctx

    def advance(self, t: int) -> int:
        raise NotImplementedError

    def finish(self, last_step: int) -> None:
        """After the last step: anything still in flight (counted at `last_step`)."""

    def clients(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def average(self) -> torch.Tensor:
        return gossip.mean(self.clients())

    def extra(self) -> dict[str, Any]:
        """Fields added to each metrics record."""
        return {}


class Gossip(Algorithm):
    """dzsgd / dsgd (and their -lora variants): a local step per client, then (every gossip_every
    steps) dense MH mixing."""

    def __init__(self, ctx: Ctx, x0: torch.Tensor) -> None:
        super().__init__(ctx, x0)
        assert ctx.top is not None
        self.xs = [x0.clone() for _ in range(ctx.n)]
        self.rows = [gossip.mh_row(ctx.top, i) for i in range(ctx.n)]
        self.local = ctx.zo_step if ctx.base == "dzsgd" else ctx.sgd_step

    def clients(self) -> list[torch.Tensor]:
        return self.xs

    def advance(self, t: int) -> int:
        for i, x in enumerate(self.xs):
            self.local(i, t, x)
        if (t + 1) % self.ctx.cfg.algorithm.gossip_every == 0:
            self.mix(t)
        return t + 1

    def mix(self, step: int) -> None:
        """x_i ← Σ_j W_ij x_j, the vectors sent as frames (`algorithm.wire`: frames) or read in
        place with their frames' bytes counted (counted)."""
        if self.ctx.cfg.algorithm.wire == "counted":
            self._mix_counted(step)
        else:
            self._mix_frames(step)

    def _mix_counted(self, step: int) -> None:
        """Every x_j read where it lies; each directed edge counted HEADER + its DENSE frame, as
        the transport counts a frame it sends (at the sender, at this step). gossip.mix is the
        same arithmetic on the same values as over the frames (lossless), so on the CPU the bits
        are the same; peak 2N vectors (the old ones are read until every node has mixed)."""
        top, n = self.ctx.top, self.ctx.n
        assert top is not None
        sent = HEADER + tensorwire.size("dense", self.xs[0].numel())
        for i in range(n):
            for p in top.neighbors(i):
                self.ctx.endpoints[i].counter.add(step, i, p, sent)
        self.xs = [gossip.mix(self.xs[i], {j: self.xs[j] for j in top.neighbors(i)}, self.rows[i], i) for i in range(n)]

    def _mix_frames(self, step: int) -> None:
        """Send every x_i to the neighbours as a DENSE frame; x_i ← Σ_j W_ij x_j.

        The frame is lossless, so x_i itself is dropped once encoded and read back from its own
        frame; a frame is released once its node and all its neighbours have mixed (peak ≈ N + a
        few vectors on a ring instead of 2N).
        """
        top, n = self.ctx.top, self.ctx.n
        assert top is not None
        frames: list[bytes | None] = []
        for i in range(n):
            frames.append(tensorwire.encode_dense(self.xs[i]))
            self.xs[i] = torch.empty(0)
        got: list[dict[int, bytes] | None] = list(
            self.ctx.exchange({i: {p: frames[i] for p in top.neighbors(i)} for i in range(n)}, step)  # type: ignore[misc]
        )
        users = [1 + top.degree(j) for j in range(n)]
        for i in range(n):
            own = tensorwire.dense_view(frames[i])  # type: ignore[arg-type]
            received = {j: tensorwire.dense_view(f) for j, f in got[i].items()}  # type: ignore[union-attr]
            self.xs[i] = gossip.mix(own, received, self.rows[i], i).to(self.ctx.flat.device)
            del own, received
            got[i] = None
            for j in (i, *top.neighbors(i)):
                users[j] -= 1
                if users[j] == 0:
                    frames[j] = None


class Choco(Gossip):
    """CHOCO-SGD (and choco-lora) with top-k compression of x_i − x̂_i (see the module docstring)."""

    def __init__(self, ctx: Ctx, x0: torch.Tensor) -> None:
        super().__init__(ctx, x0)
        self.local = ctx.sgd_step
        self.hat = [x0.clone() for _ in range(ctx.n)]  # public copies x̂_j, one per node
        self.k = tensorwire.topk_count(x0.numel(), ctx.cfg.algorithm.topk)

    def mix(self, step: int) -> None:
        top, n, gamma = self.ctx.top, self.ctx.n, self.ctx.cfg.algorithm.gamma
        assert top is not None
        frames = []
        for i in range(n):
            idx, val = tensorwire.topk_select(self.xs[i] - self.hat[i], self.k)
            frames.append(tensorwire.encode_topk(self.xs[i].numel(), idx, val))
        got = self.ctx.exchange({i: {p: frames[i] for p in top.neighbors(i)} for i in range(n)}, step)
        updated: set[int] = set()
        for i in range(n):  # x̂_j += q_j, from the frames as received (each node checks each one)
            for j, f in sorted({**got[i], i: frames[i]}.items()):
                _, idx, val = tensorwire.decode_topk(f)
                if j not in updated:
                    updated.add(j)
                    self.hat[j].index_add_(0, idx.to(self.hat[j].device), val.to(self.hat[j].device))
        for i in range(n):  # x_i += γ Σ_{j≠i} W_ij (x̂_j − x̂_i): exactly 0 where the x̂ agree
            pull = gossip.pull(self.hat[i], {j: self.hat[j] for j in top.neighbors(i)}, self.rows[i], i)
            self.xs[i].add_(pull, alpha=gamma)


class Mezo(Algorithm):
    """One client, all the data, Gaussian MeZO steps; nothing is sent."""

    identical = True

    def __init__(self, ctx: Ctx, x0: torch.Tensor) -> None:
        super().__init__(ctx, x0)
        self.x = x0.clone()

    def clients(self) -> list[torch.Tensor]:
        return [self.x]

    def average(self) -> torch.Tensor:
        return self.x

    def advance(self, t: int) -> int:
        self.ctx.zo_step(0, t, self.x)
        return t + 1
