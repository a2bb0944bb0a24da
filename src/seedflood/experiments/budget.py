"""`--budget`, one unit for every command that plans against a clock (reproduce, gpu-evidence): seconds.

Owns `seconds`: a budget as written — `90m`, `1.5h`, `5400s` or a bare number of seconds —
in seconds. For one release, a bare number where a command used to read minutes (reproduce)
is still read as minutes, with a one-line notice saying how to write it now (`NOTICES`: the
CLI prints them on stderr once the command succeeded, so a refusal stays one line).

Assumes nothing: pure Python.
"""

from __future__ import annotations

import math
import re

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_BUDGET = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([smh]?)\s*$")


NOTICES: list[str] = []
"""One line per old-unit budget read, for the CLI to print after the command (and clear)."""


class BudgetError(ValueError):
    """A --budget that is not a positive duration: one line."""


def seconds(text: str | float, bare_minutes: bool = False, command: str = "") -> float:
    """`text` in seconds; `bare_minutes`: a number without a unit is minutes (the old unit of
    `command`), with a line in NOTICES."""
    match = _BUDGET.match(str(text))
    if match is None:
        raise BudgetError(f"--budget must be a duration such as 1800s, 30m or 0.5h, got {text!r}")
    value, unit = float(match.group(1)), match.group(2)
    if not unit and bare_minutes:
        NOTICES.append(
            f"seedflood: notice: {command} --budget {text} is read as minutes, as before; write "
            f"{text}m (or {value * 60:g}s): a bare number will be seconds from the next release"
        )
        unit = "m"
    out = value * UNITS[unit or "s"]
    if not math.isfinite(out) or out <= 0:
        raise BudgetError(f"--budget must be > 0, got {text}")
    return out
