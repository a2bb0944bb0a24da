"""Atomic writes: files and directories that readers see whole or not at all.

Owns `atomic_write_bytes` / `atomic_write_text` (temp file in the same directory, fsynced, renamed
over the target, parent directory fsynced), `atomic_dir` (a temporary sibling directory renamed
into place on success, every file in it fsynced first) and `fsync_dir`.

Assumes: a POSIX filesystem where rename within a directory is atomic; where a directory
cannot be opened for fsync the rename is still atomic, only its durability is the OS's.
Stdlib only at import time (metrics, compare and baselines import it without torch).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def fsync_dir(path: Path) -> None:
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
    fsync_dir(path.parent)


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
        fsync_dir(Path(dirpath))


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
        fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
