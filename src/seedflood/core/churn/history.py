"""Every decided step from 0, kept packed: what a sponsor hands a rejoining neighbour.

Owns `History`, a read-only sequence of (step, messages) whose entries are stored as each step's
wire frame (`message.encode`), plus, in a signed run, the messages' signatures (64 B each). A
step is decoded again when it is read; the newest `RECENT` steps are also kept decoded, since
those are what a member reads at once (a newcomer's owed steps, the client log's append, the
evaluator's push). Measured with tracemalloc at 16 origins a step: 8.5 B a message packed (the
frame's 5.8 and the bytes object's header) against 143 B as `Message` objects, so 10⁵ steps cost
a client 14 MB rather than 230 MB. The whole log stays in memory because a sponsor may have to
send a newcomer every step from 0 (no log server, no client log on disk).

Assumes: every appended message's seed is `seed_of(origin, step, k)` and its scalar a float32
(true of every committed message: `Protocol.check_step` checked both), so decoding the frame
gives the same messages back, in the order appended; steps are appended in order from 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import overload

from seedflood.core.wire import message
from seedflood.core.wire.message import Message, SeedOf

Step = tuple[int, list[Message]]
RECENT = 64
"""Newest steps kept decoded too (a newcomer is owed at most 2·delay + 1 steps)."""
SIG = 64  # an Ed25519 signature's bytes; a message without one is stored as zeros
_NO_SIG = bytes(SIG)


class History(Sequence[Step]):
    """Decided steps 0..len−1, packed (see the module doc). Equal to any sequence of the same
    (step, messages) pairs."""

    def __init__(self, seed_of: SeedOf, steps: Iterable[tuple[int, Sequence[Message]]] = ()) -> None:
        self._seed_of = seed_of
        self._frames: list[bytes] = []
        self._sigs: dict[int, bytes] = {}  # step -> its messages' signatures, in frame order (signed runs)
        self._recent: dict[int, list[Message]] = {}
        for s, msgs in steps:
            self.append(s, msgs)

    def append(self, s: int, msgs: Sequence[Message]) -> None:
        if s != len(self._frames):
            raise ValueError(f"history: step {s} appended after step {len(self._frames) - 1}")
        msgs = list(msgs)
        self._frames.append(message.encode(msgs))
        if any(m.sig for m in msgs):
            self._sigs[s] = b"".join(m.sig or _NO_SIG for m in msgs)
        self._recent[s] = msgs
        self._recent.pop(s - RECENT, None)

    def __len__(self) -> int:
        return len(self._frames)

    @overload
    def __getitem__(self, i: int) -> Step: ...
    @overload
    def __getitem__(self, i: slice) -> list[Step]: ...
    def __getitem__(self, i: int | slice) -> Step | list[Step]:
        if isinstance(i, slice):
            return [self._step(s) for s in range(*i.indices(len(self)))]
        s = i + len(self) if i < 0 else i
        if not 0 <= s < len(self):
            raise IndexError(f"history: no step {i} (it holds {len(self)})")
        return self._step(s)

    def _step(self, s: int) -> Step:
        got = self._recent.get(s)
        if got is None:
            got = message.decode(self._frames[s], seed_of=self._seed_of)
            if (sigs := self._sigs.get(s)) is not None:
                got = [replace(m, sig=sig) for m, sig in zip(got, _split(sigs))]
        return s, got

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def packed_bytes(self) -> int:
        """Bytes held by the packed steps (frames and signatures), the decoded window left out."""
        return sum(map(len, self._frames)) + sum(map(len, self._sigs.values()))


def _split(sigs: bytes) -> list[bytes]:
    return [b"" if (sig := sigs[i : i + SIG]) == _NO_SIG else sig for i in range(0, len(sigs), SIG)]
