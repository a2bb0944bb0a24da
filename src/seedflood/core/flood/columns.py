"""Complete steps held as arrays: what a log reads into, and what replay applies without a Python
object per message.

Owns `StepColumns`: R consecutive records (step, its messages in canonical (origin, k) order) as
one array per field over all their messages, plus per-record bounds. It is a read-only sequence
of (step, list[Message]) pairs (a record's messages are built only when it is indexed or
iterated), and a slice of it is another `StepColumns` sharing the arrays.

Assumes: whoever builds one has validated it (rundir/logrecords.py); the arrays are not written
after construction.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from seedflood.core.wire.message import Message


@dataclass(frozen=True, eq=False)
class StepColumns(Sequence[tuple[int, list[Message]]]):
    """Records lo..hi-1 of the arrays: steps (R,) int64, bounds (R+1,) int64 (record i's messages
    are bounds[i]:bounds[i+1] of the message arrays), origin and k (M,) int64, scalar (M,)
    float32, seed (M,) uint64."""

    steps: np.ndarray
    bounds: np.ndarray
    origin: np.ndarray
    k: np.ndarray
    scalar: np.ndarray
    seed: np.ndarray
    lo: int = 0
    hi: int = -1  # -1: every record
    seeded_by: int | None = None
    """The run seed the seeds were derived from (rng.derive_many; None: read from the frames)."""

    def __post_init__(self) -> None:
        if self.hi < 0:
            object.__setattr__(self, "hi", len(self.steps))

    @classmethod
    def empty(cls) -> StepColumns:
        i64 = np.zeros(0, np.int64)
        return cls(i64, np.zeros(1, np.int64), i64, i64, np.zeros(0, np.float32), np.zeros(0, np.uint64))

    def __len__(self) -> int:
        return self.hi - self.lo

    @property
    def record_steps(self) -> np.ndarray:
        """The step of each record (R,)."""
        return self.steps[self.lo : self.hi]

    @property
    def record_bounds(self) -> np.ndarray:
        """Bounds of each record's messages (R+1,), relative to `messages(...)`'s arrays."""
        b = self.bounds[self.lo : self.hi + 1]
        return b - b[0]

    def field(self, name: str) -> np.ndarray:
        """One message array ("origin", "k", "scalar", "seed") over these records only (a view)."""
        return getattr(self, name)[self.bounds[self.lo] : self.bounds[self.hi]]

    def messages(self, i: int) -> list[Message]:
        """Record i's messages (0 <= i < len)."""
        j = self.lo + i
        a, b = int(self.bounds[j]), int(self.bounds[j + 1])
        step = int(self.steps[j])
        return [
            Message(step=step, origin=o, k=k, seed=s, scalar=x)
            for o, k, s, x in zip(
                self.origin[a:b].tolist(), self.k[a:b].tolist(), self.seed[a:b].tolist(), self.scalar[a:b].tolist()
            )
        ]

    @overload
    def __getitem__(self, i: int) -> tuple[int, list[Message]]: ...
    @overload
    def __getitem__(self, i: slice) -> StepColumns: ...
    def __getitem__(self, i: int | slice) -> tuple[int, list[Message]] | StepColumns:
        n = len(self)
        if isinstance(i, slice):
            start, stop, stride = i.indices(n)
            if stride != 1:
                raise ValueError("StepColumns: only contiguous slices")
            return StepColumns(
                self.steps, self.bounds, self.origin, self.k, self.scalar, self.seed,
                self.lo + start, self.lo + max(start, stop), self.seeded_by,
            )  # fmt: skip
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("StepColumns index out of range")
        return int(self.steps[self.lo + i]), self.messages(i)

    def __iter__(self) -> Iterator[tuple[int, list[Message]]]:
        for i in range(len(self)):
            yield int(self.steps[self.lo + i]), self.messages(i)

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of the same (step, messages) pairs (a list of them included)."""
        if not isinstance(other, Sequence) or len(other) != len(self):
            return False
        return all((s, list(m)) == (t, list(n)) for (s, m), (t, n) in zip(self, other))

    __hash__ = None  # type: ignore[assignment]
