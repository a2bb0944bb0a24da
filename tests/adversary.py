"""`python tests/adversary.py NODE KIND ARG [seedflood arguments]`: the `seedflood` command in
which client NODE does not follow the protocol.

KIND is a `roles.lying.Lie` kind (scale, random, eps: it sends that lie's scalars in place of
its honest ones, with ARG; a well-formed, signed if the run signs, wrong scalar: docs/trust.md)
or, from step ARG on, a rewrite of every frame it sends:
- `garbage`: 64 random bytes;
- `bogus-ids`: 64 well-formed messages of its own under ids no run holds (steps a million ahead,
  outside every receiver's window);
- `oversize`: 1 MiB of random bytes;
- `equivocate`: its own messages reach its lowest neighbour with twice their scalar (two
  different messages under one id; unsigned runs: the copy is unsigned);
- `forge`: its own messages carry 64 random bytes as their signature (a signed run);
- `replay`: each neighbour gets again the last frame it got before step ARG, in place of every
  frame it is owed (an old frame: what it carries was seen, what it withholds never comes);
or `impersonate` (a signed run), where ARG is a file: if it exists when the process starts, node
NODE's process holds a fresh key, not node NODE's, and signs everything (its messages, votes and
its answer to a sponsor's rejoin challenge) with it — a process without that node's key acting as
that node, from its start or, created before a restart, from its rejoin.

Launched adversaries for the trust tests, patched in from outside the product: every process of
a world runs this script and only the client of node NODE misbehaves; the rest is the real
`seedflood` entry point.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from seedflood.cli import console
from seedflood.core.flood.hop import decode_hop, encode_hop
from seedflood.core.flood.signing import Signing
from seedflood.core.wire.message import Message
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


Rewrite = Callable[[Client, int, int, bytes], bytes]  # (client, peer, step, frame) -> frame


def rewrite_frames(node: int, from_step: int, rewrite: Rewrite) -> None:
    """Node `node`'s frames from step `from_step` on pass through `rewrite` before they leave."""
    honest = Client.exchange  # every hop's wire, strict (Client.hop) and churn (core/churn/loop.py)

    def exchange(self: Client, t: int) -> dict[int, bytes]:
        if self.node == node and t >= from_step and not hasattr(self, "_honest_exchange"):
            self._honest_exchange = wire = self.transport.exchange  # type: ignore[attr-defined]

            def bad(frames: Mapping[int, bytes], step: int) -> dict[int, bytes]:
                return wire({p: rewrite(self, p, step, f) for p, f in frames.items()}, step)

            self.transport.exchange = bad  # type: ignore[method-assign]
        return honest(self, t)

    Client.exchange = exchange  # type: ignore[method-assign]


def _own(change: Callable[[Message], Message]) -> Rewrite:
    """A rewrite of the sender's own messages in a frame (the notes and the others' messages kept)."""

    def rewrite(client: Client, peer: int, step: int, frame: bytes) -> bytes:
        signed = client.flood.signing is not None
        msgs, notes = decode_hop(frame, client.protocol.wire_limits(step))
        msgs = [change(m) if m.origin == client.node else m for m in msgs]
        return encode_hop(msgs, notes, signed)

    return rewrite


def _equivocate(client: Client, peer: int, step: int, frame: bytes) -> bytes:
    if peer != min(client.flood.peers):
        return frame
    return _own(lambda m: Message.make(m.origin, m.step, m.seed, 2 * m.scalar, m.k))(client, peer, step, frame)


def replay_from(from_step: int) -> Rewrite:
    """From step `from_step` on, each peer gets again the last frame it got before (rewrites from step 0)."""
    last: dict[int, bytes] = {}  # peer -> the last frame sent to it before from_step

    def rewrite(client: Client, peer: int, step: int, frame: bytes) -> bytes:
        if step < from_step:
            last[peer] = frame
            return frame
        return last.get(peer, frame)

    return rewrite


def impersonate(node: int, flag: Path) -> None:
    """If `flag` exists now, node `node`'s process signs with a fresh Ed25519 key, not its own."""
    if not flag.exists():
        return
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from seedflood.roles import train

    honest = train.signing_of
    key = Ed25519PrivateKey.generate()

    def signing_of(cfg: Any, trajectory: Any, n: int) -> Signing | None:
        own = honest(cfg, trajectory, n)
        return own if own is None or n != node else dataclasses.replace(own, sign=key.sign)

    train.signing_of = signing_of


def _bogus_ids(client: Client, peer: int, step: int, frame: bytes) -> bytes:
    far = [10**6 + k for k in range(64)]
    msgs = [Message.make(client.node, s, client.protocol.seed(client.node, s), 0.5) for s in far]
    return encode_hop(msgs, [])


REWRITES: dict[str, Rewrite] = {
    "garbage": lambda client, peer, step, frame: os.urandom(64),
    "bogus-ids": _bogus_ids,
    "oversize": lambda client, peer, step, frame: os.urandom(1 << 20),
    "equivocate": _equivocate,
    "forge": _own(lambda m: dataclasses.replace(m, sig=os.urandom(64))),
}


if __name__ == "__main__":
    node, kind, arg, *rest = sys.argv[1:]
    if kind in REWRITES:
        rewrite_frames(int(node), int(arg), REWRITES[kind])
    elif kind == "replay":
        rewrite_frames(int(node), 0, replay_from(int(arg)))
    elif kind == "impersonate":
        impersonate(int(node), Path(arg))
    else:
        lie(int(node), Lie(kind, float(arg)))
    sys.argv = ["seedflood", *rest]
    console()
