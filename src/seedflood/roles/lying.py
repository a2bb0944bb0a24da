"""A lying origin, for the in-process runs (`inprocess.simulate(lies=...)`) and the audit bench.

Owns `Lie` (what a lying origin sends in place of its honest scalar: ×F, the honest scalar plus
a set amount, a random draw, or an estimate with another zo.eps, on every step or on a fraction
of them) and `LyingClient`, a
`Client` whose own messages carry the lie. The lie is made before the flood seals the message,
so in a signed run the liar signs it: a well-formed, authentic, wrong scalar (docs/trust.md).

Assumes: nothing but `Client`: the liar runs the real loop otherwise (it floods, votes, audits).
"""

from __future__ import annotations

import hashlib
import random
import struct
from dataclasses import dataclass

from seedflood.core.wire.message import Message
from seedflood.core.zo import estimate as zo
from seedflood.roles.client import Client

KINDS = ("scale", "shift", "random", "eps")
_KEY = struct.Struct("<III")


@dataclass(frozen=True)
class Lie:
    kind: str
    """scale: F × the honest scalar; shift: the honest scalar + arg (a liar hiding inside an audit
    tolerance: docs/trust.md, Mixed hardware); random: uniform in ±arg; eps: the estimate with
    zo.eps = arg."""
    arg: float
    rate: float = 1.0
    """The fraction of its steps it lies on: a deterministic draw per (origin, step)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown lie {self.kind!r}: one of {', '.join(KINDS)}")

    def _draw(self, origin: int, step: int, k: int) -> random.Random:
        return random.Random(hashlib.blake2b(_KEY.pack(origin, step, k), digest_size=8).digest())

    def lies_at(self, origin: int, step: int) -> bool:
        return self.rate >= 1.0 or self._draw(origin, step, 1 << 31).random() < self.rate

    def scalar(self, client: Client, m: Message) -> float:
        """What `client` (the liar) sends for its honest message `m`."""
        if self.kind == "scale":
            return self.arg * m.scalar
        if self.kind == "shift":
            return m.scalar + self.arg
        if self.kind == "random":
            return self._draw(m.origin, m.step, m.k).uniform(-self.arg, self.arg)
        return zo.two_point(lambda: client.loss_at(m.step), client.direction, m.seed, m.step, self.arg)


class LyingClient(Client):
    """A client whose own scalars are `lie`'s (set after construction; None = honest)."""

    lie: Lie | None = None

    def estimate(self, t: int) -> list[Message]:
        own = super().estimate(t)
        lie = self.lie
        if lie is None or not lie.lies_at(self.node, t):
            return own
        return [Message.make(m.origin, m.step, m.seed, lie.scalar(self, m), m.k) for m in own]
