"""Checkpoints: the set of step_N directories of a run, their verification, pruning and state files.

Owns checkpoints/step_NNNNNN/ (state.pt, meta.json with "step" and "state_sha256", a log.bin
prefix, hf/) and checkpoints/LATEST: listing (`checkpoints`, newest first), the pointer
(`latest`, `mark_latest`), `verify` (meta.json's step and state.pt's sha256), the newest usable
one (`usable_checkpoint`: a corrupt checkpoint is skipped, never loaded, never deleted),
`prune` and `save_state` / `load_state` (torch.save / torch.load, checked against the sha256).
Checkpoints only shorten catch-up: the log is the source of truth.

Assumes: directories are published whole by atomic.py's `atomic_dir`; one writer per run
directory. torch is imported only when a state file is written or read.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from seedflood.rundir.atomic import atomic_write_bytes, atomic_write_text, fsync_dir
from seedflood.rundir.layout import CheckpointError

_STEP_DIR = re.compile(r"step_(\d+)")


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
        raise ValueError(f"checkpoints.py: prune keep={keep} must be >= 0")
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
        fsync_dir(root)


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
