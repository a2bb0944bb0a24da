"""The bytes of a frame on a gloo channel, shared by every gloo user (gloo, links, attach).

Owns the wire layout of one frame on a point-to-point channel: `[u32 LE length][payload]`,
sent as one message of at most `inline_bytes` (the length header and the first bytes) and, only
for longer frames, a second message with the rest; `END` in the length field ends a stream.
Also the tags every channel uses, one receive buffer (`HeadBuffer`), the gloo TCP device
(`device`, honouring GLOO_SOCKET_IFNAME) and `reason`, the first sentence of a gloo error.

Assumes: frames are CPU bytes shorter than 2**30 (MAX_FRAME_BYTES); both ends use one inline_bytes.
"""

from __future__ import annotations

import functools
import os
import re
import struct

import torch
import torch.distributed as dist

from seedflood.core.flood.transport import HEADER

# Gloo tags. monitored_barrier uses small counting tags in the same point-to-point namespace,
# so ours sit far away from 0, 1, 2, ...
TAG_HOP = 0x5EED_0000
TAG_EVAL = 0x5EED_0001
END = 0xFFFF_FFFF  # length header of the end-of-stream marker (u32; frames are < 2**30)
LENGTH = struct.Struct("<I")  # the HEADER-byte length before every frame


def encode(frame: bytes, inline_bytes: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """frame -> (head message, tail message or None) as CPU uint8 tensors owning a copy."""
    cut = inline_bytes - HEADER
    head = bytearray(LENGTH.pack(len(frame))) + frame[:cut]
    tail = bytearray(frame[cut:]) if len(frame) > cut else None
    return (
        torch.frombuffer(head, dtype=torch.uint8),
        torch.frombuffer(tail, dtype=torch.uint8) if tail is not None else None,
    )


def reason(e: BaseException) -> str:
    """First sentence of a gloo error, without its '[file.cc:123] ' prefix."""
    lines = str(e).strip().splitlines()
    text = re.sub(r"^\[[^\]]*\]\s*", "", lines[0]) if lines else ""
    return text.split(". ")[0] or type(e).__name__


class HeadBuffer:
    """One preallocated receive buffer (inline_bytes) and its decoding."""

    def __init__(self, inline_bytes: int) -> None:
        self.tensor = torch.empty(inline_bytes, dtype=torch.uint8)
        self._view = memoryview(self.tensor.numpy())  # slicing a memoryview is cheaper than numpy's

    def length(self) -> int:
        return int.from_bytes(self._view[:HEADER], "little")

    def payload(self, n: int) -> bytes:
        return self._view[HEADER : HEADER + n].tobytes()


class OutBuffer:
    """One preallocated send buffer (inline_bytes) for a channel whose sends are all waited for
    before it sends again (a hop): a frame that fits is copied in behind its length and sent as
    a cached view of the buffer, so a hop allocates no tensor per edge."""

    MAX_VIEWS = 256  # distinct message lengths kept as views (a run uses a handful)

    def __init__(self, inline_bytes: int) -> None:
        self.tensor = torch.empty(inline_bytes, dtype=torch.uint8)
        self._view = memoryview(self.tensor.numpy())
        self._views: dict[int, torch.Tensor] = {}  # message length -> tensor[:length]

    def fill(self, frame: bytes) -> torch.Tensor:
        """The head message of `frame` (at most inline_bytes - HEADER long), ready to send; valid
        until the next `fill`."""
        n = HEADER + len(frame)
        self._view[:HEADER] = LENGTH.pack(len(frame))
        self._view[HEADER:n] = frame
        t = self._views.get(n)
        if t is None:
            if len(self._views) >= self.MAX_VIEWS:
                self._views.clear()
            t = self._views[n] = self.tensor[:n]
        return t


@functools.cache
def device() -> object:
    """One gloo TCP device for every edge group of this process (one event loop thread, not one
    per edge); GLOO_SOCKET_IFNAME is honoured as torch does for its own groups."""
    ifname = os.environ.get("GLOO_SOCKET_IFNAME")
    if ifname:
        return dist.ProcessGroupGloo.create_device(interface=ifname.split(",")[0])
    return dist.ProcessGroupGloo.create_default_device()
