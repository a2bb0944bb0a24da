"""A small churn message log written with the project's own writer, for tests that read one
(rundir/logchanges.py, `seedflood status`): 4 clients open to 5 ids; node 3 leaves at step 2,
comes back (incarnation 2) and new id 4 joins (incarnation 1) at step 4. Milliseconds.
"""

from __future__ import annotations

from pathlib import Path

from seedflood.core.config import rng
from seedflood.core.membership.roster import Change
from seedflood.core.wire.message import Message
from seedflood.rundir.logfile import LogWriter

SEED = 7
CHANGES = {2: Change(2, leave=(3,)), 4: Change(4, join=((3, 2), (4, 1)))}


def write_log(path: Path, steps: int = 6) -> Path:
    """The log's first `steps` steps at `path` (each member's one message a step)."""
    writer = LogWriter(path, {"trajectory": {"run.seed": SEED, "topology.nodes": 4, "churn.max_nodes": 5}})
    members = {0, 1, 2, 3}
    for s in range(steps):
        if s in CHANGES:
            members = (members - set(CHANGES[s].leave)) | {o for o, _ in CHANGES[s].join}
        msgs = [Message.make(o, s, rng.derive(SEED, o, s, 0), 0.5) for o in sorted(members)]
        writer.append(s, msgs, CHANGES.get(s))
    writer.close()
    return path
