"""`python tests/liar.py NODE KIND ARG [seedflood arguments]`: the `seedflood` command in which
client NODE sends `roles.lying.Lie(KIND, ARG)`'s scalars in place of its honest ones.

A launched liar for the trust tests, patched in from outside the product: every process of a
world runs this script and only the client of node NODE lies (a well-formed, signed if the run
signs, wrong scalar: docs/trust.md); the rest is the real `seedflood` entry point.
"""

from __future__ import annotations

import sys

from seedflood.cli import console
from seedflood.core.flood.message import Message
from seedflood.roles.client import Client
from seedflood.roles.lying import Lie


def install(node: int, lie: Lie) -> None:
    honest = Client.estimate

    def estimate(self: Client, t: int) -> list[Message]:
        own = honest(self, t)
        if self.node != node:
            return own
        return [Message.make(m.origin, m.step, m.seed, lie.scalar(self, m), m.k) for m in own]

    Client.estimate = estimate  # type: ignore[method-assign]


if __name__ == "__main__":
    node, kind, arg, *rest = sys.argv[1:]
    install(int(node), Lie(kind, float(arg)))
    sys.argv = ["seedflood", *rest]
    console()
