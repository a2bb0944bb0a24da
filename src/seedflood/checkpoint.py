"""Run directories on disk: the append-only message log, checkpoints, atomic writes.

Owns the layout of a run directory:
  config.yaml                       the run's config (written once, atomically)
  log.bin                           append-only message log, one record per complete step
  metrics.jsonl                     evaluator metrics (see metrics.py)
  checkpoints/step_000050/          state.pt (trainable tensors + direction state), meta.json,
                                    hf/ (save_pretrained model + tokenizer)
  checkpoints/LATEST                name of the newest complete checkpoint (atomic pointer)
  summary.json                      final figures and hashes

Log format: a header line b"SEEDFLOOD-LOG 1\\n", a u32 length and a JSON header (run seed, clients,
base identity and hash), then per step a record: u32 step, u32 frame length, frame (message.py;
its CRC covers the messages). A crash can leave a torn last record: the reader stops at the last
whole record and the writer truncates the tail before appending, so nothing half-written is ever
replayed. Every write of a file or directory that readers may see is temp-then-rename.

Assumes: one writer per run directory (the evaluator); readers may run at any time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seedflood import message
from seedflood.message import Message

LOG_MAGIC = b"SEEDFLOOD-LOG 1\n"
_U32 = struct.Struct("<I")
_REC = struct.Struct("<II")  # step, frame length


class CheckpointError(ValueError):
    """A run directory, log or checkpoint is missing or malformed (one line, names the file)."""


# -- atomic writes --------------------------------------------------------------------------------
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


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces `path` in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    tmp.chmod(0o755)  # mkdtemp makes 0700
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# -- the message log ------------------------------------------------------------------------------
def _read_header(f) -> tuple[dict[str, Any], int]:
    magic = f.read(len(LOG_MAGIC))
    if magic != LOG_MAGIC:
        raise CheckpointError(f"{f.name}: not a SeedFlood message log (bad magic)")
    raw = f.read(4)
    if len(raw) < 4:
        raise CheckpointError(f"{f.name}: truncated log header")
    (n,) = _U32.unpack(raw)
    body = f.read(n)
    try:
        header = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise CheckpointError(f"{f.name}: log header is not valid JSON") from None
    return header, len(LOG_MAGIC) + 4 + n


def _records(f, start: int) -> Iterator[tuple[int, list[Message], int]]:
    """(step, messages, end offset) of each whole, valid record; stops at a torn tail."""
    f.seek(start)
    while True:
        head = f.read(_REC.size)
        if len(head) < _REC.size:
            return
        step, n = _REC.unpack(head)
        frame = f.read(n)
        if len(frame) < n:
            return
        try:
            msgs = message.decode(frame)
        except message.FrameError:
            return  # a torn or corrupt tail: everything before it stands
        if any(m.step != step for m in msgs):
            raise CheckpointError(f"{f.name}: record of step {step} holds messages of another step")
        yield step, msgs, f.tell()


@dataclass
class LogReader:
    path: Path

    def read(self) -> tuple[dict[str, Any], list[tuple[int, list[Message]]]]:
        """The header and every whole step record, checked to be consecutive from step 0."""
        if not self.path.is_file():
            raise CheckpointError(f"message log {self.path} does not exist")
        with open(self.path, "rb") as f:
            header, start = _read_header(f)
            steps = [(s, msgs) for s, msgs, _ in _records(f, start)]
        for i, (s, _) in enumerate(steps):
            if s != i:
                raise CheckpointError(f"{self.path}: record {i} is step {s}; steps must be consecutive from 0")
        return header, steps


class LogWriter:
    """Appends one record per complete step; flushed and fsynced per step."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.next_step = 0
        if path.exists():
            with open(path, "rb") as f:
                old, start = _read_header(f)
                end = start
                for s, _, end in _records(f, start):
                    if s != self.next_step:
                        raise CheckpointError(f"{path}: step {s} out of order in existing log")
                    self.next_step += 1
            for key in ("run_seed", "n_clients", "base_hash"):
                if old.get(key) != header.get(key):
                    raise CheckpointError(
                        f"{path}: existing log belongs to another run ({key} {old.get(key)!r} != {header.get(key)!r}); "
                        "use a new run.out_dir or delete the directory"
                    )
            self._f = open(path, "r+b")
            self._f.truncate(end)  # drop a torn tail left by a crash
            self._f.seek(end)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            body = json.dumps(header, sort_keys=True).encode()
            atomic_write_bytes(path, LOG_MAGIC + _U32.pack(len(body)) + body)
            self._f = open(path, "r+b")
            self._f.seek(0, os.SEEK_END)

    def append(self, step: int, msgs: list[Message]) -> int:
        """Write step `step` (must be the next one); returns the record's size in bytes."""
        if step != self.next_step:
            raise CheckpointError(f"{self.path}: appending step {step}, expected {self.next_step}")
        frame = message.encode(sorted(msgs))
        self._f.write(_REC.pack(step, len(frame)) + frame)
        self._f.flush()
        os.fsync(self._f.fileno())
        self.next_step += 1
        return _REC.size + len(frame)

    def truncate_to(self, steps: int) -> None:
        """Keep only the first `steps` records (used when resuming from an older checkpoint)."""
        with open(self.path, "rb") as f:
            _, start = _read_header(f)
            end = start
            for s, _, off in _records(f, start):
                if s >= steps:
                    break
                end = off
        self._f.truncate(end)
        self._f.seek(end)
        self.next_step = min(self.next_step, steps)

    def close(self) -> None:
        self._f.close()


# -- checkpoints ---------------------------------------------------------------------------------
def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}"


def latest(run_dir: Path) -> Path | None:
    """The newest complete checkpoint directory, or None."""
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


def save_state(path: Path, tensors: dict[str, Any]) -> None:
    """torch.save to a temp file, then rename (the canonical state of one step)."""
    import io

    import torch

    buf = io.BytesIO()
    torch.save(tensors, buf)
    atomic_write_bytes(path, buf.getvalue())


def load_state(path: Path) -> dict[str, Any]:
    import torch

    if not path.is_file():
        raise CheckpointError(f"checkpoint state {path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file
        raise CheckpointError(f"{path}: cannot be loaded ({type(e).__name__}: {str(e).splitlines()[0]})") from None
