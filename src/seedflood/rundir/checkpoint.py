"""Run directories on disk: the append-only message log, checkpoints, atomic writes.

Owns the layout of a run directory:
  config.yaml                       the run's config (written once, atomically)
  log.bin                           append-only message log, one record per complete step
  metrics.jsonl                     evaluator metrics (see metrics.py)
  checkpoints/step_000050/          state.pt (trainable tensors + direction state), meta.json
                                    (step, hashes, "state_sha256" of state.pt), log.bin (the log
                                    prefix), hf/ (save_pretrained model + tokenizer)
  checkpoints/LATEST                name of the newest complete checkpoint (atomic pointer)
  summary.json                      final figures and hashes

Log format (all integers little-endian):
  b"SEEDFLOOD-LOG 2\\n", u32 n, n bytes of JSON header ("base_identity", "base_hash",
  "trajectory": a flat {dotted key: value} of every setting that shapes the training trajectory,
  "config": the full config, informational), written once by temp-then-rename; then per step
  a record: u32 step, u32 frame length, frame (message.py frame v2: magic, version, layout,
  count, base step = the record's step, crc32 over header and messages; one record of
  origin/k/scalar per message, in canonical (origin, k) order; never empty). Steps run 0, 1, 2...
  The log is self-describing: v2 frames carry no seeds, and the reader derives each one as
  rng.derive(trajectory["run.seed"], origin, step, k), so a v2 log header must hold an integer
  "run.seed" in its trajectory (the writer refuses to create one without it).
  Logs with the magic b"SEEDFLOOD-LOG 1\\n" hold v1 frames (16-byte header, 24-byte messages with
  their seeds) and stay readable; one log holds one frame version, the one its magic names, so a
  writer resuming a v1 log keeps appending v1 frames.
  The log is the source of truth: a run is a pure function of base weights + settings + log.
  Membership (churn runs, docs/design.md §13): a step whose roster changed is preceded by a
  membership record: u32 (CHANGE_FLAG | step), u32 length, membership.Change bytes (CRC-checked
  JSON: leave, join, audit). The members of every step are a pure function of these records
  (all N before the first), and each step record must hold exactly its members' messages.

Torn tail vs corruption: only an incomplete FINAL record is a torn tail (a crash mid-append):
fewer bytes remain than the record needs and every field that is present agrees (the step is
the next one, the length is a valid frame length, the frame header's magic/version/count agree
with the length; v1: whole messages present carry that step; v2: the base step is that step, the
layout has no step offsets, whole messages present are in strictly increasing (origin, k)
order). Readers ignore a torn tail and writers cut it off before appending. Anything else (a complete record failing its CRC, even the last
one; a bad magic; a step out of sequence; a length that disagrees with the frame header;
trailing garbage; a record the caller's `check` rejects) raises CheckpointError naming the
record's byte offset and step, and a writer raises before changing a byte of the file.

What is verified: every log record structurally (above) and, through `check`, with the same
limits as frames from the wire; the log header's settings fingerprint against the resuming run
(`header_mismatch`); each checkpoint's state.pt against the sha256 in its meta.json (`verify`,
`load_state(sha256=...)`), so a corrupt checkpoint is skipped, never loaded, never deleted.

Durability: every file or directory readers may see is written temp-then-rename, fsynced, and
its parent directory fsynced. Log appends are flushed per step (a process crash loses at most
the record being written: a torn tail) and fsynced by `LogWriter.sync` (at each checkpoint) and
`close`. After a power loss the steps since the last sync may be missing; on a filesystem that
then shows them as zeros or garbage the reader reports corruption, and the checkpoint's own
log.bin copy is the synced prefix to fall back to.

Assumes: one writer per run directory (the evaluator); readers may run at any time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from seedflood.core import message
from seedflood.core.membership import Change, Roster
from seedflood.core.message import Message

LOG_MAGIC = b"SEEDFLOOD-LOG 2\n"
"""What new logs begin with: their records hold message.py v2 frames."""
LOG_MAGIC_V1 = b"SEEDFLOOD-LOG 1\n"
"""Logs written before frame v2: their records hold v1 frames (read and appended to as v1)."""
_FRAME_VERSION = {LOG_MAGIC: message.VERSION_2, LOG_MAGIC_V1: message.VERSION_1}
_U32 = struct.Struct("<I")
_REC = struct.Struct("<II")  # step, frame length
CHANGE_FLAG = 0x8000_0000  # a record's step with this bit set: the membership record of that step
MAX_CHANGE_BYTES = 1 << 20
# Sanity bound on one record: 2**22 messages (~100 MB) per step is far beyond any real N*K.
MAX_FRAME_BYTES = message.HEADER_SIZE + message.RECORD_SIZE * 2**22
_STEP_DIR = re.compile(r"step_(\d+)")

# (step, messages) of one whole record from disk; raises ValueError to reject it. After a
# membership record it is called with members= (the step's members) as a keyword too.
RecordCheck = Callable[..., None]


class CheckpointError(ValueError):
    """A run directory, log or checkpoint is missing or malformed (one line, names the file)."""


# -- atomic writes --------------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; run files are meant to be shared
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root` (before it is renamed into view)."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                continue
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces `path` in one rename.

    If the body raises, the temporary directory is removed and `path` is untouched.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    tmp.chmod(0o755)  # mkdtemp makes 0700
    try:
        yield tmp
        _fsync_tree(tmp)
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# -- the log header and the settings fingerprint -------------------------------------------------
@dataclass(frozen=True)
class _Format:
    """How a log's records are encoded: frame version, and (v2) how seeds are derived."""

    version: int
    seed_of: message.SeedOf | None  # None for v1 (its frames carry their seeds)
    nodes: int | None = None  # trajectory "topology.nodes": the roster of membership records

    @classmethod
    def of(cls, version: int, header: dict[str, Any], path: Path) -> _Format:
        nodes = (header.get("trajectory") or {}).get("topology.nodes")
        return cls(
            version,
            _seed_of(header, path) if version == message.VERSION_2 else None,
            nodes if isinstance(nodes, int) else None,
        )


def _seed_of(header: dict[str, Any], path: Path) -> message.SeedOf:
    """The seed derivation of a v2 log: rng.derive(run seed from the header's trajectory, ...)."""
    traj = header.get("trajectory")
    run_seed = traj.get("run.seed") if isinstance(traj, dict) else None
    if not isinstance(run_seed, int) or isinstance(run_seed, bool) or run_seed < 0:
        raise CheckpointError(
            f'{path}: the log header has no integer trajectory "run.seed", needed to derive message seeds'
        )
    from seedflood.core import rng  # numpy + torch: imported only when a v2 log is read or written

    return functools.partial(rng.derive, run_seed)


def _read_header(f: IO[bytes], path: Path) -> tuple[dict[str, Any], int, int]:
    """The JSON header, the byte offset where the first record starts, and its frame version."""
    magic = f.read(len(LOG_MAGIC))
    if magic not in _FRAME_VERSION:
        raise CheckpointError(f"{path}: not a SeedFlood message log (bad magic)")
    raw = f.read(4)
    if len(raw) < 4:
        raise CheckpointError(f"{path}: truncated log header")
    (n,) = _U32.unpack(raw)
    body = f.read(n)
    if len(body) < n:
        raise CheckpointError(f"{path}: truncated log header ({len(body)} of {n} bytes)")
    try:
        header = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise CheckpointError(f"{path}: log header is not valid JSON") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: log header is not a JSON object")
    return header, len(magic) + 4 + n, _FRAME_VERSION[magic]


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of the log at `path` (records are not read)."""
    if not path.is_file():
        raise CheckpointError(f"message log {path} does not exist")
    with open(path, "rb") as f:
        return _read_header(f, path)[0]


_ABSENT = object()


def _same(a: Any, b: Any) -> bool:
    # 10 == 10.0 counts as equal; NaN equals NaN through its JSON text.
    return a == b or json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _show(v: Any) -> str:
    return "absent" if v is _ABSENT else json.dumps(v, sort_keys=True)


def header_mismatch(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One "key (old -> new)" per trajectory setting (or base_hash) that differs, sorted by key.

    Both headers are compared as JSON would store them (tuples == lists); a key present on one
    side only counts ("absent" on the other). A side without a "trajectory" dict (a log written
    by an older SeedFlood) gives the single entry "trajectory (absent -> present: ...)" instead.
    """
    old, new = json.loads(json.dumps(old)), json.loads(json.dumps(new))
    out: list[str] = []
    ob, nb = old.get("base_hash", _ABSENT), new.get("base_hash", _ABSENT)
    if not _same(ob, nb):
        out.append(f"base_hash ({_show(ob)} -> {_show(nb)})")
    ot, nt = old.get("trajectory"), new.get("trajectory")
    if not isinstance(ot, dict) or not isinstance(nt, dict):
        if isinstance(nt, dict):
            out.append("trajectory (absent -> present: the log was written by an older SeedFlood)")
        elif isinstance(ot, dict):
            out.append("trajectory (present -> absent)")
        return out
    for key in sorted(set(ot) | set(nt)):
        a, b = ot.get(key, _ABSENT), nt.get(key, _ABSENT)
        if a is _ABSENT or b is _ABSENT or not _same(a, b):
            out.append(f"{key} ({_show(a)} -> {_show(b)})")
    return out


# -- the message log records ---------------------------------------------------------------------
@dataclass
class _Scan:
    records: list[tuple[int, list[Message]]]
    ends: list[int]  # ends[i]: byte offset just past record i
    start: int  # byte offset of record 0
    torn: int  # bytes of an incomplete final record (0: none)
    changes: dict[int, Change] = field(default_factory=dict)  # step -> membership change


def _scan(f: IO[bytes], path: Path, start: int, fmt: _Format, check: RecordCheck | None) -> _Scan:
    """Every whole record from `start`, validated; a torn final record is measured, not returned."""
    size = os.fstat(f.fileno()).st_size
    f.seek(start)
    scan = _Scan(records=[], ends=[], start=start, torn=0)
    off = start
    roster: Roster | None = None  # from the first membership record on
    change_at: int | None = None  # byte offset of a membership record awaiting its step record
    while off < size:
        step = len(scan.records)  # the step this record must hold

        def bad(reason: str) -> CheckpointError:
            return CheckpointError(f"{path}: record at byte offset {off} (step {step}) is corrupt: {reason}")

        remaining = size - off
        head = f.read(min(_REC.size, remaining))
        if len(head) < _REC.size:  # torn inside the 8-byte record header
            got = head[:4]
            if got != _U32.pack(step)[: len(got)]:
                raise bad(f"incomplete record header does not start with step {step}")
            scan.torn = remaining
            break
        rstep, n = _REC.unpack(head)
        if rstep & CHANGE_FLAG:
            if rstep & ~CHANGE_FLAG != step or change_at is not None or n > MAX_CHANGE_BYTES:
                raise bad(f"membership record for step {rstep & ~CHANGE_FLAG} out of sequence or too long")
            data = f.read(min(n, remaining - _REC.size))
            if len(data) < n:
                scan.torn = remaining
                break
            if roster is None:
                if fmt.nodes is None:
                    raise bad("membership record in a log whose header has no topology.nodes")
                roster = Roster(fmt.nodes)
            try:
                change = Change.from_bytes(step, data)
                roster.apply(change)
            except (message.FrameError, ValueError) as e:
                raise bad(str(e)) from None
            scan.changes[step] = change
            change_at = off
            off += _REC.size + n
            continue
        if rstep != step:
            raise bad(f"holds step {rstep}, expected {step} (out of sequence)")
        frame = f.read(min(n, remaining - _REC.size)) if n <= MAX_FRAME_BYTES else b""
        whole_frame = _check_v1 if fmt.version == message.VERSION_1 else _check_v2
        reason = whole_frame(frame, n, step)
        if reason:
            raise bad(reason)
        if len(frame) < n:  # torn inside the frame, and every byte present agrees
            scan.torn = remaining
            break
        try:
            msgs = message.decode(frame, seed_of=fmt.seed_of) if fmt.seed_of else message.decode(frame)
        except message.FrameError as e:
            raise bad(str(e)) from None
        if any(m.step != step for m in msgs):
            raise bad("holds messages of another step")
        if msgs != sorted(msgs):
            raise bad("messages are not in canonical (origin, k) order")
        if check is not None:
            try:
                check(step, msgs) if roster is None else check(step, msgs, members=roster.members)
            except ValueError as e:
                raise bad(f"rejected: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        off += _REC.size + n
        scan.records.append((step, msgs))
        scan.ends.append(off)
        change_at = None
    if change_at is not None:  # a membership record without (all of) its step record: torn
        scan.torn = size - change_at
        del scan.changes[len(scan.records)]
    return scan


def _check_v1(frame: bytes, n: int, step: int) -> str | None:
    """Why the v1 frame prefix `frame` of a record of length `n` for `step` is corrupt, or None."""
    if n < message.HEADER_SIZE or (n - message.HEADER_SIZE) % message.RECORD_SIZE or n > MAX_FRAME_BYTES:
        return f"length field {n} is not a valid frame length"
    if len(frame) >= message.HEADER_SIZE:
        magic, version, rsize, count, _crc = message.HEADER.unpack_from(frame)
        if magic != message.MAGIC:
            return f"bad frame magic {magic!r}"
        if version != message.VERSION_1 or rsize != message.RECORD_SIZE:
            return f"unsupported frame version {version} / record size {rsize}"
        if message.HEADER_SIZE + count * message.RECORD_SIZE != n:
            return f"length field {n} disagrees with the frame header ({count} messages)"
    elif frame[:4] != message.MAGIC[: len(frame[:4])]:
        return f"bad frame magic {frame[:4]!r}"
    if len(frame) < n:  # torn: whole messages present must still fit
        body = frame[message.HEADER_SIZE :]
        whole = len(body) // message.RECORD_SIZE * message.RECORD_SIZE
        for origin, mstep, _seed, _scalar, _k, reserved in message.RECORD.iter_unpack(body[:whole]):
            if mstep != step or reserved != 0:
                return f"incomplete record holds a message of step {mstep} from origin {origin}"
    return None


def _check_v2(frame: bytes, n: int, step: int) -> str | None:
    """Why the v2 frame prefix `frame` of a record of length `n` for `step` is corrupt, or None.

    A log frame holds one step, so its base step is `step` and its layout has no offsets."""
    if not message.V2_MIN_FRAME <= n <= MAX_FRAME_BYTES:
        return f"length field {n} is not a valid frame length"
    if frame[:2] != message.MAGIC_2[: len(frame[:2])]:
        return f"bad frame magic {frame[:2]!r}"
    if len(frame) > 2 and frame[2] != message.VERSION_2:
        return f"unsupported frame version {frame[2]}"
    if len(frame) < message.V2_PREFIX:
        return None
    try:
        lay = message.Layout.of_byte(frame[3])
    except message.FrameError as e:
        return str(e)
    if lay.offset:
        return f"layout byte {frame[3]:#04x} has step offsets (a log frame holds one step)"
    if len(frame) >= message.V2_PREFIX + lay.count:
        count = int.from_bytes(frame[message.V2_PREFIX : message.V2_PREFIX + lay.count], "little")
        if count == 0 or lay.header_size + count * lay.record_size != n:
            return f"length field {n} disagrees with the frame header ({count} messages)"
    if len(frame) >= lay.header_size - 4:
        (base,) = _U32.unpack_from(frame, message.V2_PREFIX + lay.count)
        if base != step:
            return f"frame header holds step {base}"
    if len(frame) < n and len(frame) > lay.header_size:  # torn: whole messages present must be in order
        body = frame[lay.header_size :]
        ids = [row[:-1] for row in lay.record.iter_unpack(body[: len(body) // lay.record_size * lay.record_size])]
        if any(a >= b for a, b in zip(ids, ids[1:])):
            return "incomplete record holds messages out of canonical (origin, k) order"
    return None


@dataclass
class LogReader:
    """Reads a message log; `torn` is set by `read` to the bytes of an ignored torn tail."""

    path: Path
    torn: int = field(default=0, init=False)
    changes: dict[int, Change] = field(default_factory=dict, init=False)
    """Set by `read`: the membership change of each step that has one."""

    def read(self, check: RecordCheck | None = None) -> tuple[dict[str, Any], list[tuple[int, list[Message]]]]:
        """The header and every whole step record (steps 0, 1, ...); a torn tail is ignored.

        `check(step, messages)` is called for each whole record; a ValueError from it, or any
        corruption, raises CheckpointError naming the record's byte offset and step.
        """
        if not self.path.is_file():
            raise CheckpointError(f"message log {self.path} does not exist")
        with open(self.path, "rb") as f:
            header, start, version = _read_header(f, self.path)
            scan = _scan(f, self.path, start, _Format.of(version, header, self.path), check)
        self.torn = scan.torn
        self.changes = scan.changes
        return header, scan.records


class LogWriter:
    """Appends one record per complete step: flushed per step, fsynced by `sync` and `close`.

    On an existing log it first checks the settings fingerprint and every record (with `check`)
    and raises CheckpointError without touching the file if either fails; then it cuts off a
    torn tail (`dropped_tail` bytes) and continues at step `next_step`, in the log's own frame
    version (`version`: 1 for a log begun before frame v2). A new log is v2; its header must hold
    the integer trajectory "run.seed" the reader derives seeds from.
    """

    def __init__(self, path: Path, header: dict[str, Any], check: RecordCheck | None = None) -> None:
        self.path = path
        self.dropped_tail = 0
        if path.exists():
            with open(path, "rb") as f:
                old, start, version = _read_header(f, path)
                if "trajectory" not in old:
                    raise CheckpointError(
                        f"{path} was written by an older SeedFlood (its header has no settings fingerprint); "
                        "use a new run.out_dir or delete the directory"
                    )
                if not isinstance(header.get("trajectory"), dict):
                    raise CheckpointError(f"{path}: the header to resume with has no 'trajectory' dict of settings")
                diffs = header_mismatch(old, header)
                if diffs:
                    raise CheckpointError(
                        f"{path} belongs to a different run: settings differ: {', '.join(diffs)}; "
                        "use a new run.out_dir or delete the directory"
                    )
                self._fmt = _Format.of(version, old, path)
                scan = _scan(f, path, start, self._fmt, check)
            self._start, self._ends = scan.start, scan.ends
            self.changes = scan.changes
            end = self._ends[-1] if self._ends else self._start
            self._f: IO[bytes] = open(path, "r+b")
            if scan.torn:
                self._f.truncate(end)  # drop the torn tail a crash left mid-append
                os.fsync(self._f.fileno())
                self.dropped_tail = scan.torn
            self._f.seek(end)
        else:
            self._fmt = _Format.of(message.VERSION_2, header, path)  # refuses a header without run.seed
            path.parent.mkdir(parents=True, exist_ok=True)
            body = json.dumps(header, sort_keys=True).encode()
            atomic_write_bytes(path, LOG_MAGIC + _U32.pack(len(body)) + body)
            self._start, self._ends = len(LOG_MAGIC) + 4 + len(body), []
            self.changes = {}
            self._f = open(path, "r+b")
            self._f.seek(0, os.SEEK_END)

    @property
    def next_step(self) -> int:
        """The step the next `append` must carry (= records in the log)."""
        return len(self._ends)

    @property
    def version(self) -> int:
        """The frame version of this log's records."""
        return self._fmt.version

    def append(self, step: int, msgs: list[Message], change: Change | None = None) -> int:
        """Write step `step` (must be the next one), preceded by its membership record when it
        has a change; flushed not fsynced; returns the bytes written."""
        if step != self.next_step:
            raise CheckpointError(f"{self.path}: appending step {step}, expected {self.next_step}")
        seed_of = self._fmt.seed_of
        if seed_of is not None:  # v2 stores no seeds: refuse what the reader would not reproduce
            if not msgs:
                raise CheckpointError(f"{self.path}: appending step {step} with no messages")
            for m in msgs:
                if m.step != step or seed_of(m.origin, m.step, m.k) != m.seed:
                    raise CheckpointError(
                        f"{self.path}: appending step {step}: message {m.id} is of another step or its seed "
                        "is not the run's derivation"
                    )
        frame = message.encode(sorted(msgs), version=self._fmt.version)
        rec = _REC.pack(step, len(frame)) + frame
        if change:
            if change.step != step:
                raise CheckpointError(f"{self.path}: appending step {step} with the change of step {change.step}")
            data = change.to_bytes()
            rec = _REC.pack(CHANGE_FLAG | step, len(data)) + data + rec
            self.changes[step] = change
        self._f.write(rec)  # one write: a crash leaves at most a torn tail
        self._f.flush()
        self._ends.append((self._ends[-1] if self._ends else self._start) + len(rec))
        return len(rec)

    def sync(self) -> None:
        """fsync what was appended (called at each checkpoint)."""
        self._f.flush()
        os.fsync(self._f.fileno())

    def truncate_to(self, steps: int) -> None:
        """Keep only the first `steps` records (used when resuming from an older checkpoint)."""
        if steps < 0:
            raise ValueError(f"{self.path}: truncate_to({steps}): steps must be >= 0")
        if steps >= len(self._ends):
            return
        end = self._ends[steps - 1] if steps else self._start
        self._f.flush()
        self._f.truncate(end)
        self._f.seek(end)
        os.fsync(self._f.fileno())
        del self._ends[steps:]
        self.changes = {s: c for s, c in self.changes.items() if s < steps}

    def close(self) -> None:
        if self._f.closed:
            return
        self.sync()
        self._f.close()


# -- checkpoints ---------------------------------------------------------------------------------
def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}"


def _step_of(ckpt: Path) -> int | None:
    m = _STEP_DIR.fullmatch(ckpt.name)
    return int(m.group(1)) if m else None


def checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint directories (step_*/meta.json), newest (highest step) first."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = [(s, p) for p in root.iterdir() if (s := _step_of(p)) is not None and (p / "meta.json").is_file()]
    return [p for _, p in sorted(found, key=lambda t: t[0], reverse=True)]


def latest(run_dir: Path) -> Path | None:
    """The checkpoint LATEST points at, or None (not verified: see `usable_checkpoint`)."""
    pointer = run_dir / "checkpoints" / "LATEST"
    if not pointer.is_file():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    if not (path / "meta.json").is_file():
        raise CheckpointError(f"{pointer} points at {path.name}, which is not a complete checkpoint")
    return path


def read_meta(ckpt: Path) -> dict[str, Any]:
    try:
        return json.loads((ckpt / "meta.json").read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{ckpt} is not a checkpoint (no meta.json)") from None
    except ValueError:
        raise CheckpointError(f"{ckpt}/meta.json is not valid JSON") from None


def mark_latest(run_dir: Path, ckpt: Path) -> None:
    atomic_write_text(run_dir / "checkpoints" / "LATEST", ckpt.name + "\n")


def find_run_dir(path: str | Path) -> Path:
    p = Path(path)
    if not (p / "log.bin").is_file():
        raise CheckpointError(f"{p} is not a run directory (no log.bin)")
    return p


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(ckpt_dir: Path) -> str | None:
    """None if the checkpoint is complete and intact, else a one-line reason naming the file.

    Intact: meta.json parses to an object with an integer "step" (equal to the directory's
    step_NNNNNN) and a "state_sha256", and state.pt exists with that sha256.
    """
    meta_path, state_path = ckpt_dir / "meta.json", ckpt_dir / "state.pt"
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        return f"{meta_path} is missing"
    except (ValueError, UnicodeDecodeError):
        return f"{meta_path} is not valid JSON"
    except OSError as e:
        return f"{meta_path} cannot be read ({e.strerror})"
    if not isinstance(meta, dict):
        return f"{meta_path} is not a JSON object"
    step = meta.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return f'{meta_path} has no integer "step"'
    named = _step_of(ckpt_dir)
    if named is not None and named != step:
        return f"{meta_path}: step {step} does not match the directory name {ckpt_dir.name}"
    sha = meta.get("state_sha256")
    if not isinstance(sha, str):
        return f'{meta_path} has no "state_sha256" (written by an older SeedFlood)'
    if not state_path.is_file():
        return f"{state_path} is missing"
    try:
        if _sha256_file(state_path) != sha:
            return f"{state_path}: checksum mismatch (file corrupt)"
    except OSError as e:
        return f"{state_path} cannot be read ({e.strerror})"
    return None


def usable_checkpoint(run_dir: Path, max_step: int) -> tuple[Path | None, list[str]]:
    """The newest checkpoint with step <= max_step that verifies, and one line per corrupt one skipped.

    Checkpoints above `max_step` are passed over silently; corrupt ones are reported and left
    on disk untouched (the caller logs the lines and falls back to an older state or to replay).
    """
    skipped: list[str] = []
    for c in checkpoints(run_dir):
        step = _step_of(c)
        if step is None or step > max_step:
            continue
        reason = verify(c)
        if reason is None:
            return c, skipped
        skipped.append(f"skipping corrupt checkpoint {c.name}: {reason}")
    return None, skipped


def prune(run_dir: Path, keep: int) -> None:
    """Remove all but the newest `keep` complete checkpoints, never the one LATEST points at.

    Each is renamed to a hidden name first, so a crash mid-removal never leaves a half-deleted
    step_* directory that looks like a corrupt checkpoint.
    """
    if keep < 0:
        raise ValueError(f"checkpoint.py: prune keep={keep} must be >= 0")
    root = run_dir / "checkpoints"
    pointer = root / "LATEST"
    protected = pointer.read_text().strip() if pointer.is_file() else None
    for stale in root.glob(".step_*.prune") if root.is_dir() else ():
        shutil.rmtree(stale, ignore_errors=True)  # left by a crash inside an earlier prune
    for c in checkpoints(run_dir)[keep:]:
        if c.name == protected:
            continue
        gone = c.with_name(f".{c.name}.prune")
        shutil.rmtree(gone, ignore_errors=True)
        os.replace(c, gone)
        shutil.rmtree(gone, ignore_errors=True)
    if root.is_dir():
        _fsync_dir(root)


def save_state(path: Path, tensors: dict[str, Any]) -> str:
    """torch.save to a temp file, then rename; returns the sha256 hex of the bytes written."""
    import torch

    buf = io.BytesIO()
    torch.save(tensors, buf)
    data = buf.getvalue()
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def load_state(path: Path, sha256: str | None = None) -> dict[str, Any]:
    """torch.load of a state file (CPU, weights only), checked against `sha256` when given."""
    import torch

    if not path.is_file():
        raise CheckpointError(f"checkpoint state {path} does not exist")
    data = path.read_bytes()
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise CheckpointError(f"{path}: checksum mismatch (file corrupt)")
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file
        raise CheckpointError(f"{path}: cannot be loaded ({type(e).__name__}: {str(e).splitlines()[0]})") from None
