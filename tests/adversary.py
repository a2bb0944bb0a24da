"""`python tests/adversary.py NODE KIND ARG [seedflood arguments]`: the `seedflood` command in
which client NODE does not follow the protocol.

KIND is a `roles.lying.Lie` kind (scale, random, eps: it sends that lie's scalars in place of
its honest ones, with ARG; a well-formed, signed if the run signs, wrong scalar: docs/trust.md)
or `garbage` (from step ARG on, every frame it sends is 64 random bytes).

Launched adversaries for the trust tests, patched in from outside the product: every process of
a world runs this script and only the client of node NODE misbehaves; the rest is the real
`seedflood` entry point.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from seedflood.cli import console
from seedflood.core.flood.message import Message
from seedflood.roles.client import Client
from seedflood.roles.lying import Lie


def lie(node: int, lie: Lie) -> None:
    honest = Client.estimate

    def estimate(self: Client, t: int) -> list[Message]:
        own = honest(self, t)
        if self.node != node:
            return own
        return [Message.make(m.origin, m.step, m.seed, lie.scalar(self, m), m.k) for m in own]

    Client.estimate = estimate  # type: ignore[method-assign]


def garbage(node: int, from_step: int) -> None:
    honest = Client.hop

    def hop(self: Client, t: int) -> None:
        if self.node == node and t >= from_step and not hasattr(self, "_honest_exchange"):
            self._honest_exchange = exchange = self.transport.exchange  # type: ignore[attr-defined]

            def bad(frames: Mapping[int, bytes], step: int) -> dict[int, bytes]:
                return exchange({p: os.urandom(64) for p in frames}, step)

            self.transport.exchange = bad  # type: ignore[method-assign]
        honest(self, t)

    Client.hop = hop  # type: ignore[method-assign]


if __name__ == "__main__":
    node, kind, arg, *rest = sys.argv[1:]
    if kind == "garbage":
        garbage(int(node), int(arg))
    else:
        lie(int(node), Lie(kind, float(arg)))
    sys.argv = ["seedflood", *rest]
    console()
