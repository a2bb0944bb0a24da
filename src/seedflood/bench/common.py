"""What the figure programs share: the plain-text table they print and a direction that costs nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any


def table(
    out: Any, title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]], notes: Sequence[str] = ()
) -> None:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = "  ".join("-" * w for w in widths)
    print(f"\n== {title}", file=out)
    for i, r in enumerate(cells):
        print("  ".join(c.rjust(w) if i and j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))), file=out)
        if i == 0:
            print(line, file=out)
    for n in notes:
        print(f"   {n}", file=out)
    out.flush()


class NullDirection:
    """A direction that costs nothing: isolates the flood (codec, state machine, transport)."""

    def perturbed(self, seed: int, step: int, scale: float) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def accumulate(self, step: int, seed: int, coef: float) -> None:
        pass

    def commit(self, step: int) -> None:
        pass

    def apply_steps(self, steps: Sequence[Any]) -> None:
        pass
