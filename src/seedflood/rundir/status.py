"""Live status records: what each process of a running run says about itself, for `seedflood status`.

Owns `Status` (one process's record: who it is, where it stands, what it sent and received, and
how it ended), its JSON form (`to_json`, `Status.from_json`), `write_status` (atomic, so a
reader sees a whole record or the one before) and `read_status` / `read_statuses` (a missing,
torn or foreign file is one line, `StatusError`, never a traceback). The records lie in
`RunDir.status` (layout.py), one file per process: `node-N.json` for client N,
`evaluator.json` for the evaluator (`status_name`).

A record's `digests` holds the last `DIGEST_WINDOW` (step, digest) pairs of the process's
committed chain (agreement.step_digest: H(prev, step, messages, joins), the churn commit chain,
which a strict client and the evaluator compute alike over the steps they apply), so a reader
can compare two processes at a step both hold even when their records were written at
different steps.

May import: rundir's atomic and layout (stdlib otherwise: `seedflood status` loads no torch).

Assumes: each file has one writer (the process it names); records are small (hundreds of
bytes) and written about once a second, so a rewrite is cheap.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from seedflood.rundir.atomic import atomic_write_text
from seedflood.rundir.layout import RunDir

VERSION = 1
"""The record format; a reader refuses another (one line)."""

DIGEST_WINDOW = 32
"""(step, digest) pairs a record keeps: the newest committed steps (32 × ~30 B of JSON)."""

RUNNING, FINISHED, STOPPED, FAILED = "running", "finished", "stopped", "failed"
STATES = (RUNNING, FINISHED, STOPPED, FAILED)
"""running: the process is at work; finished: it reached the end of the run; stopped: the churn
rules stopped it (`reason`: their one line); failed: an error ended it (`reason`: its first line)."""

EVALUATOR = "evaluator"
CLIENT = "client"

OPTIONAL = frozenset({"started", "reason", "state", "state_hash", "edges", "health"})
"""Fields a record may lack (added after the first records were written): their defaults."""


class StatusError(ValueError):
    """A status record that cannot be read (missing, torn, not a record): one line naming the file."""


def status_name(node: int | None) -> str:
    """The name of client `node`'s record (None: the evaluator's); its file is NAME.json."""
    return EVALUATOR if node is None else f"node-{node}"


@dataclass(frozen=True)
class Status:
    """One process's live record. Steps count from 0; -1: none yet."""

    role: str  # CLIENT or EVALUATOR
    node: int | None  # the client's node id; None for the evaluator
    incarnation: int  # which start of this node (churn: 1, then +1 per restart; strict: 1)
    pid: int
    host: str
    total: int  # steps of the run (protocol.steps): a finished process is at step `total`
    step: int  # a client's next local step; the evaluator's next step to log
    applied: int  # last step applied to the model
    committed: int  # last step committed (churn: agreed; strict and evaluator: applied or logged)
    digests: dict[int, str]  # step -> chain digest (16 hex digits), the newest DIGEST_WINDOW
    members: list[int] | None  # the roster it sees (a churn client's; the evaluator's); None: a strict client
    peers: list[int]  # neighbours whose edge is up now (the evaluator: [])
    neighbours: list[int]  # its topology neighbours (the evaluator: [])
    sent: int  # bytes handed to the transport so far (as summary.json counts them)
    received: int  # bytes of hop frames received so far (frame payloads; a client only)
    steps_per_s: float  # over the last few records (the whole run in a final record)
    sent_per_s: float  # likewise, bytes sent per second
    updated: float  # time.time() when written
    state: str = RUNNING  # one of STATES
    reason: str | None = None  # stopped or failed: why, one line
    started: float = 0.0  # time.time() when the process began writing records
    state_hash: str | None = None  # finished: the final state's hash (replay.state_hash), as reported
    edges: dict[int, tuple[int, int]] = field(default_factory=dict)
    """A client's bytes per edge: neighbour -> (sent to it, hop frames received from it); -1: the
    stream to the evaluator (sent only). Empty: the evaluator, or a record from before the field."""
    health: dict[str, int] = field(default_factory=dict)
    """A churn client's health counters (core/churn/health.py: commits, commit_hops, voted,
    ballots, drops, heals), summed by rundir/health.py for the sinks. Empty: not a churn client."""
    version: int = VERSION

    @property
    def name(self) -> str:
        return status_name(self.node)

    @property
    def digest(self) -> str | None:
        """The digest of the last committed step, if this record holds it."""
        return self.digests.get(self.committed)

    def to_json(self) -> str:
        d = asdict(self)
        d["digests"] = {str(s): h for s, h in sorted(self.digests.items())}
        d["edges"] = {str(p): list(n) for p, n in sorted(self.edges.items())}
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str = "status record") -> Status:
        """Parse a record; StatusError (one line naming `where`) for anything but a whole one."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise StatusError(
                f"{where}: not JSON ({e.msg} at character {e.pos}): torn or not a status record"
            ) from None
        if not isinstance(d, dict):
            raise StatusError(f"{where}: not a status record (a JSON {type(d).__name__})")
        if d.get("version") != VERSION:
            raise StatusError(f"{where}: status record version {d.get('version')!r}, this reader knows {VERSION}")
        names = {f.name for f in fields(cls)}
        if missing := sorted(names - set(d) - OPTIONAL):
            raise StatusError(f"{where}: status record lacks {', '.join(missing)}")
        try:
            d["digests"] = {int(s): str(h) for s, h in d["digests"].items()}
            d["edges"] = {int(p): (int(sent), int(got)) for p, (sent, got) in d.get("edges", {}).items()}
            d["health"] = {str(k): int(v) for k, v in d.get("health", {}).items()}
            status = cls(**{k: v for k, v in d.items() if k in names})
        except (AttributeError, TypeError, ValueError) as e:
            raise StatusError(f"{where}: malformed status record ({e})") from None
        if status.state not in STATES:
            raise StatusError(f"{where}: unknown state {status.state!r}")
        return status


def write_status(run: RunDir, status: Status) -> Path:
    """Replace this process's record in `run.status`, atomically; returns its path."""
    path = run.status / f"{status.name}.json"
    atomic_write_text(path, status.to_json())
    return path


def read_status(path: Path) -> Status:
    """The record at `path`; StatusError (one line) when it is missing, torn or not a record."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise StatusError(f"{path}: no status record") from None
    except (OSError, UnicodeDecodeError) as e:
        raise StatusError(f"{path}: unreadable ({e})") from None
    return Status.from_json(text, str(path))


def read_statuses(run: RunDir) -> tuple[list[Status], list[str]]:
    """Every record in `run.status` (sorted: clients by node, then the evaluator) and one line
    per file that could not be read. A run with no records yet: ([], [])."""
    if not run.status.is_dir():
        return [], []
    found: list[Status] = []
    problems: list[str] = []
    for path in sorted(run.status.glob("*.json")):
        try:
            found.append(read_status(path))
        except StatusError as e:
            problems.append(str(e))
    found.sort(key=lambda s: (s.node is None, s.node or 0))
    return found, problems
