"""A signed run's log verified step by step: what `seedflood replay` and `seedflood check` run.

Owns `unproven`: the first step of a log whose seals (logrecords.py, seal records: its messages'
signatures and, under churn, the certificate of its commit) do not prove it against the roster
the log's header records, as one line; None when every step is proven or the run is unsigned.
The check is the evaluator's own (`certificate.StepVerifier`, built by `identities.verifier_of`),
so a log proves exactly what its evaluator verified before it logged each step.

May import: seedflood.core, seedflood.rundir, roles.identities.

Assumes: the log reads whole (the caller read it with the run's checks first, so any corruption
was reported as such); a torn tail is not a step and is not verified.
"""

from __future__ import annotations

from pathlib import Path

from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.stepstream import decode_seals
from seedflood.core.wire.message import FrameError
from seedflood.roles.identities import UnsignedLogError, verifier_of
from seedflood.rundir.logfile import LogReader


def unproven(path: Path, protocol: Protocol, certified: bool) -> str | None:
    """One line naming the first step of the log at `path` that its seals do not prove (and how
    many steps before it were proven); None when the run is unsigned or every step is proven.
    `certified`: the run's steps are committed by votes (churn) and need their certificates."""
    reader = LogReader(path)
    header, records = reader.read(check=protocol.check_step)
    try:
        verifier = verifier_of(header, protocol, certified)
    except UnsignedLogError as e:
        return f"{path}: {e}: its signatures cannot be verified"
    if verifier is None:
        return None
    roster = protocol.roster()
    for s, msgs in records:
        change = reader.changes.get(s)
        seals = reader.seals.get(s)
        if seals is None:
            return f"{path}: step {s} has no seal record: a signed run logs every step with its signatures ({s} steps proven before it)"
        try:
            signed, certificate = decode_seals(seals, msgs)
        except FrameError as e:
            return f"{path}: step {s}'s seal record is malformed: {e} ({s} steps proven before it)"
        refusal = verifier.check(s, signed, change, certificate, roster)
        if refusal is not None:
            return f"{path}: step {s} fails its signatures: {refusal.reason} ({s} steps proven before it)"
        if change:
            roster.apply(change)
    return None
