"""A message log that ends in a torn record, and what in its run directory disagrees with it.

Owns `torn_tail_line`: the one line `seedflood replay`, `eval` and `check` say about a log.bin
that ends `torn` bytes past its last whole record (logfile.LogReader.torn; a crash mid-append:
readers skip those bytes, a resuming writer cuts them off), naming what disagrees with the
whole steps: summary.json's step count (or its final hash, when the caller replayed the whole
log) and the checkpoints past the log's end (checkpoints/step_N holds the state after N steps,
so N > whole steps lies past it). A torn tail is legitimate after a crash; a run directory that
holds one is still not whole, which is why `check` refuses it with this line. Also owns
`short_log_line`: the line for a log that ends whole but short of what the directory says the
run did (cut on a record boundary: summary.json counts more steps, or a checkpoint lies past
its end), which `check` refuses as well.

Assumes: summary.json as a finished run writes it ("steps": the run's steps, "param_hash": the
final state's hash); a missing or unreadable one says nothing (a crashed run has none).
"""

from __future__ import annotations

import json

from seedflood.rundir import checkpoints as ckpt
from seedflood.rundir.layout import SUMMARY, RunDir

HASH_CHARS = 12  # hex digits of a hash shown in the line (the full one is in summary.json)


def torn_tail_line(run: RunDir, logged: int, torn: int, param_hash: str | None = None) -> str:
    """One line: `run`'s log ends `torn` bytes past its `logged` whole steps, and what disagrees.

    `param_hash`: the hash of the state after all `logged` steps (a whole replay), compared
    with summary.json's; None (check, a partial replay) compares the step count only."""
    where = f"after step {logged - 1}, its last whole record" if logged else "before step 0 (no whole record)"
    head = f"{run.log} ends in a torn record: {torn} bytes {where} (a crash mid-append; resuming the run cuts them off)"
    found = disagreements(run, logged, param_hash)
    if not found:
        return f"{head}; no summary.json or checkpoint disagrees with its {logged} whole steps"
    return f"{head}; disagreeing with its {logged} whole steps: {', '.join(found)}"


def short_log_line(run: RunDir, logged: int) -> str | None:
    """One line if `run`'s whole log of `logged` steps is shorter than the run it belongs to
    (records lost at its end); None if nothing says the run went further. A summary.json that
    counts fewer steps is not a loss: a resumed run that crashed keeps its earlier summary."""
    summary = _summary(run)
    steps = summary.get("steps") if summary is not None else None
    found = [f"{SUMMARY} says {steps} steps"] if isinstance(steps, int) and steps > logged else []
    found += [d for d in disagreements(run, logged) if not d.startswith(SUMMARY)]
    if not found:
        return None
    return f"{run.log} ends after {logged} whole steps, short of the run: {', '.join(found)} (records lost at its end)"


def disagreements(run: RunDir, logged: int, param_hash: str | None = None) -> list[str]:
    """What in `run` disagrees with a log of `logged` whole steps (see the module docstring)."""
    found: list[str] = []
    summary = _summary(run)
    if summary is not None:
        said = []
        steps = summary.get("steps")
        if steps != logged:
            said.append(f"{steps} steps")
        theirs = summary.get("param_hash")
        if param_hash is not None and theirs != param_hash:
            said.append(f"param hash {str(theirs)[:HASH_CHARS]} (the replay's: {param_hash[:HASH_CHARS]})")
        if said:
            found.append(f"{SUMMARY} says {' and '.join(said)}")
    past = [c.name for c in reversed(ckpt.checkpoints(run.root)) if int(c.name.removeprefix("step_")) > logged]
    if len(past) == 1:
        found.append(f"checkpoint {past[0]} lies past the log's end")
    elif past:
        found.append(f"checkpoints {', '.join(past)} lie past the log's end")
    return found


def _summary(run: RunDir) -> dict | None:
    try:
        value = json.loads(run.summary.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
