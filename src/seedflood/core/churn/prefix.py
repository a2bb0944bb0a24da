"""The decided prefix a log server hands a newcomer, and what the newcomer tells its sponsor.

Owns (docs/churn-design.md, Rejoin across processes: a log server):
- the prefix's bytes (`encode` / `decode`): steps 0..p of a run's agreed log as step payloads
  (stepstream.encode_step: messages, the step's roster change, in a signed run its seals), with
  the log header's run identity (`IDENTITY`: the trajectory fingerprint and the base model's
  hash) so a newcomer can refuse another run's log before it replays a byte of it;
- `check`: the newcomer's replay of a prefix into a chain of its own — steps contiguous from 0,
  each a complete step of its roster (`Protocol.check_step`) — ending on the digest of step p;
- `Have`: the newcomer's word to its sponsor, (p, the digest its replayed chain has at p); the
  sponsor sends only the steps after p when its own chain has that digest at p, else its whole
  log (roles/churn.py, `Churn.catch_up`).

Nothing here trusts the server: a prefix that decodes and checks is only internally consistent;
whether it is the run's history is decided by the sponsor's chain (`Have`) and, as for any
rejoin, by the first commit, which needs a quorum's votes naming the digest the newcomer's
replayed chain (prefix and catch-up) ends on.

Assumes: pure Python (the core); the log header's layout is rundir/logheader.py's (a dict with
"trajectory" and "base_hash").
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from seedflood.core.churn.agreement import Agreement
from seedflood.core.flood import stepstream
from seedflood.core.flood.protocol import Protocol
from seedflood.core.wire.message import FrameError

MAGIC = b"SL\x01"  # then u32 CRC-32 of the rest, u32 identity length, identity JSON, encode_pushes(steps)
_U32 = struct.Struct("<I")
IDENTITY = ("trajectory", "base_hash")
"""The log header's keys a prefix carries: what makes two logs the same run's."""


def identity(header: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a log header a prefix carries (`IDENTITY`)."""
    return {k: header[k] for k in IDENTITY if k in header}


def encode(header: Mapping[str, Any], steps: Sequence[tuple[int, bytes]]) -> bytes:
    """A prefix: the run identity of `header`, then `steps` (step, step payload) in order."""
    head = json.dumps(identity(header), sort_keys=True).encode()
    body = _U32.pack(len(head)) + head + stepstream.encode_pushes(steps)
    return MAGIC + _U32.pack(zlib.crc32(body)) + body


def decode(blob: bytes) -> tuple[dict[str, Any], list[tuple[int, bytes]]]:
    """(run identity, steps) of `encode`; FrameError on any defect."""
    at = len(MAGIC) + 4
    if not blob.startswith(MAGIC) or len(blob) < at + 4:
        raise FrameError("log prefix: bad magic or truncated")
    if _U32.unpack_from(blob, len(MAGIC))[0] != zlib.crc32(blob[at:]):
        raise FrameError("log prefix fails its CRC")
    (n,) = _U32.unpack_from(blob, at)
    try:
        head = json.loads(blob[at + 4 : at + 4 + n])
    except ValueError:
        raise FrameError("log prefix: its run identity is not JSON") from None
    if not isinstance(head, dict):
        raise FrameError("log prefix: its run identity is not a JSON object")
    return head, stepstream.decode_pushes(blob[at + 4 + n :])


_HAVE_MAGIC = b"SH\x01"
_HAVE = struct.Struct("<qQ")  # last step held (-1: none), its digest


@dataclass(frozen=True)
class Have:
    """What a newcomer holds already: steps 0..`step` (-1: none), its chain's `digest` at `step`."""

    step: int = -1
    digest: int = 0

    def to_bytes(self) -> bytes:
        return _HAVE_MAGIC + _HAVE.pack(self.step, self.digest)

    @classmethod
    def from_bytes(cls, data: bytes) -> Have:
        """FrameError unless `data` is a `to_bytes`."""
        if len(data) != len(_HAVE_MAGIC) + _HAVE.size or not data.startswith(_HAVE_MAGIC):
            raise FrameError(f"a newcomer's word of what it holds: {len(data)} bytes that are not one")
        step, digest = _HAVE.unpack_from(data, len(_HAVE_MAGIC))
        if step < -1:
            raise FrameError(f"a newcomer's word of what it holds names step {step}")
        return cls(step, digest)


NOTHING = Have()
"""A newcomer without a prefix: its sponsor sends every decided step (what a rejoin always did)."""


def check(steps: Sequence[tuple[int, bytes]], protocol: Protocol, attach: int = 0) -> Have:
    """Replay `steps` into a fresh chain (the roster before step 0, `attach` its attach node):
    FrameError unless they run 0, 1, ... and each decodes to exactly its roster's complete step;
    the `Have` of the last (`NOTHING` for none)."""
    chain = Agreement(-1, protocol.ids, protocol.perturbations, 0, protocol.roster(attach=attach), due=protocol.due)
    for s, payload in steps:
        if s != chain.through + 1:
            raise FrameError(f"log prefix jumps from step {chain.through} to step {s}")
        msgs, change = stepstream.decode_step(payload, s, seed_of=protocol.seed)
        chain.extend(s, msgs, change)
        protocol.check_step(s, msgs, members=chain.roster.members)
    return Have(chain.through, chain.prev) if steps else NOTHING
