"""The DiLoCo baseline's update rule (`algorithm: diloco`, its `-lora` variant on the adapters).

Owns: `DiLoCo`, a `baselines_core.Algorithm`: rounds of H = inner_steps AdamW steps (β =
0.9/0.999, ε = 1e-8, no weight decay; moments kept per client across rounds) from the global θ; each client's pseudo-gradient
Δ_i = θ − θ_i (DENSE, or INT8 with one absmax scale per tensor when compress = int8) is
flooded to every node along shortest-path routes (graph.Topology.routes: a node forwards origin
o's frame only to neighbours one hop further from o; origins one after another,
eccentricity(o) hops each), so every node averages the same decoded frames in origin order:
the exact average, identical everywhere. Outer step: Nesterov momentum (PyTorch SGD form)
b ← μ·b + Δ̄, θ ← θ − lr_o·(Δ̄ + μ·b). overlap = DiLoCoX's one-step delay: round r's average
is applied at the end of round r + 1 (its communication would run during round r + 1's inner
steps); the last one is applied after the last round (the drain).

Assumes: baselines_core's shared model (`Ctx`, `Flat`: fp32 client vectors, one process, updates
on one thread) and a topology (`Ctx.top`); frames are `tensorwire`'s, counted by the transport.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from seedflood.experiments import tensorwire
from seedflood.experiments.baselines_core import Algorithm, Ctx

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


class DiLoCo(Algorithm):
    """Inner AdamW per client for H steps, exact flooded average of pseudo-gradients, outer Nesterov."""

    identical = True

    def __init__(self, ctx: Ctx, x0: torch.Tensor) -> None:
        super().__init__(ctx, x0)
        assert ctx.top is not None
        a = ctx.cfg.algorithm
        self.theta = x0.clone()  # the global (outer) parameters every client starts a round from
        self.buf = torch.zeros_like(x0)  # outer Nesterov momentum
        self.m = [torch.zeros_like(x0) for _ in range(ctx.n)]
        self.v = [torch.zeros_like(x0) for _ in range(ctx.n)]
        self.adam_steps = [0] * ctx.n
        self.pending: torch.Tensor | None = None  # overlap: the average not applied yet
        self.routes = [ctx.top.routes(i) for i in range(ctx.n)]
        self.H, self.outer_lr, self.mu = a.inner_steps, a.outer_lr, a.outer_momentum
        self.drift = 0.0

    def clients(self) -> list[torch.Tensor]:
        return [self.theta]

    def average(self) -> torch.Tensor:
        return self.theta

    def extra(self) -> dict[str, Any]:
        return {"drift_rms": self.drift}

    @torch.no_grad()
    def adamw(self, i: int, x: torch.Tensor) -> None:
        g = self.ctx.flat.grad()
        self.ctx.flat.zero_grad()
        b1, b2 = ADAM_BETAS
        self.adam_steps[i] += 1
        k = self.adam_steps[i]
        self.m[i].mul_(b1).add_(g, alpha=1 - b1)
        self.v[i].mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (self.v[i].sqrt() / math.sqrt(1 - b2**k)).add_(ADAM_EPS)
        x.addcdiv_(self.m[i], denom, value=-self.ctx.lr / (1 - b1**k))

    def advance(self, t: int) -> int:
        ctx, n = self.ctx, self.ctx.n
        end = min(t + self.H, ctx.cfg.run.steps)
        acc = torch.zeros_like(self.theta)  # Σ_o decoded Δ_o, in origin order (fp32)
        sumsq = 0.0
        for i in range(n):
            x = self.theta.clone()
            for s in range(t, end):
                with torch.enable_grad():
                    ctx.backward(i, s, x)
                self.adamw(i, x)
            torch.sub(self.theta, x, out=x)  # Δ_i = θ − θ_i, in x's memory
            if ctx.cfg.algorithm.compress == "int8":
                frame = tensorwire.encode_int8(x, ctx.flat.sizes)
            else:
                frame = tensorwire.encode_dense(x)
            del x
            self.flood(i, frame, end - 1)
            delta = tensorwire.decode(frame, ctx.flat.device)
            sumsq += float(torch.linalg.vector_norm(delta.double())) ** 2
            acc.add_(delta)
            del delta, frame
        avg = acc.div_(n)
        self.drift = math.sqrt(max(0.0, sumsq / n - float(torch.linalg.vector_norm(avg.double())) ** 2))
        if ctx.cfg.algorithm.overlap:
            if self.pending is not None:
                self.outer(self.pending)
            self.pending = avg
        else:
            self.outer(avg)
        return end

    def finish(self, last_step: int) -> None:
        if self.pending is not None:
            self.outer(self.pending)
            self.pending = None

    @torch.no_grad()
    def outer(self, avg: torch.Tensor) -> None:
        """Nesterov: b ← μ·b + Δ̄; θ ← θ − lr_o·(Δ̄ + μ·b)."""
        self.buf.mul_(self.mu).add_(avg)
        self.theta.add_(avg, alpha=-self.outer_lr).add_(self.buf, alpha=-self.outer_lr * self.mu)

    def flood(self, origin: int, frame: bytes, step: int) -> None:
        """Deliver origin's frame to every node along shortest-path routes (eccentricity hops);
        every receiver checks it (header + CRC). Counted at `step`."""
        top = self.ctx.top
        assert top is not None
        holders = {origin}
        for hop in range(top.eccentricity(origin)):
            senders = [i for i in holders if top.distances[origin][i] == hop]
            got = self.ctx.exchange({i: {p: frame for p in self.routes[i][origin]} for i in senders}, step)
            for i, frames in enumerate(got):
                for f in frames.values():
                    if f:
                        tensorwire.read_header(f)
                        holders.add(i)
        if len(holders) != top.n:
            raise RuntimeError(f"diloco flood from node {origin} reached {len(holders)} of {top.n} nodes")
