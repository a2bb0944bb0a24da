"""The message log's header: magic line, settings fingerprint, frame version, seed derivation.

Owns the start of a log.bin (all integers little-endian):
  b"SEEDFLOOD-LOG 3\\n", u32 n, n bytes of JSON header ("base_identity", "base_hash",
  "trajectory": a flat {dotted key: value} of every setting that shapes the training trajectory,
  "config": the full config, informational), u32 crc32 of (u32 n + the n bytes); written once
  by temp-then-rename (`encode_header`). A header failing its CRC raises CheckpointError naming
  log.bin's header, before any of its settings is compared with config.yaml.
  The log is self-describing: v2 frames carry no seeds, and the reader derives each one as
  rng.derive(trajectory["run.seed"], origin, step, k), so a v2 log header must hold an integer
  "run.seed" in its trajectory (the writer refuses to create one without it; `LogFormat`).
  Logs with the magic b"SEEDFLOOD-LOG 1\\n" hold v1 frames (16-byte header, 24-byte messages with
  their seeds) and stay readable; one log holds one frame version, the one its magic names, so a
  writer resuming a v1 log keeps appending v1 frames. Logs with the magic b"SEEDFLOOD-LOG 2\\n"
  (v2 frames) were written before the header had a CRC: they are read as legacy, their header
  unchecked (`header_checked` says so; `seedflood check` notes it), and a resumed one keeps its
  format, as a v1 log does.
Also `log_header`: the header a run's log (and each client's copy of it) carries, and
`header_mismatch`: the log header's settings fingerprint against a resuming run's.

Assumes: the records after the header are logrecords.py's.
"""

from __future__ import annotations

import functools
import json
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from seedflood.core.wire import message
from seedflood.rundir.layout import CheckpointError

if TYPE_CHECKING:
    from seedflood.core.config.runconfig import Config

LOG_MAGIC = b"SEEDFLOOD-LOG 3\n"
"""What new logs begin with: a header with its own CRC; records hold message.py v2 frames."""
LOG_MAGIC_V2 = b"SEEDFLOOD-LOG 2\n"
"""Logs written before the header CRC (legacy): v2 frames, header read unchecked."""
LOG_MAGIC_V1 = b"SEEDFLOOD-LOG 1\n"
"""Logs written before frame v2 (legacy): v1 frames (read and appended to as v1), header unchecked."""
_FRAME_VERSION = {LOG_MAGIC: message.VERSION_2, LOG_MAGIC_V2: message.VERSION_2, LOG_MAGIC_V1: message.VERSION_1}
_U32 = struct.Struct("<I")


@dataclass(frozen=True)
class LogFormat:
    """How a log's records are encoded: frame version, and (v2) how seeds are derived."""

    version: int
    seed_of: message.SeedOf | None  # None for v1 (its frames carry their seeds)
    nodes: int | None = None  # trajectory "topology.nodes": the roster of membership records
    max_nodes: int = 0  # trajectory "churn.max_nodes" (open membership): ids 0..max_nodes-1 may join
    signed: bool = False  # the header records a roster ("trust"): its records have seal records

    @property
    def run_seed(self) -> int | None:
        """The run seed a v2 log's seeds derive from (None: v1, its frames carry their seeds)."""
        return self.seed_of.args[0] if isinstance(self.seed_of, functools.partial) else None

    @classmethod
    def of(cls, version: int, header: dict[str, Any], path: Path) -> LogFormat:
        traj = header.get("trajectory") or {}
        nodes, most = traj.get("topology.nodes"), traj.get("churn.max_nodes")
        return cls(
            version,
            _seed_of(header, path) if version == message.VERSION_2 else None,
            nodes if isinstance(nodes, int) else None,
            most if isinstance(most, int) and not isinstance(most, bool) else 0,
            bool(header.get("trust")),
        )


def _seed_of(header: dict[str, Any], path: Path) -> message.SeedOf:
    """The seed derivation of a v2 log: rng.derive(run seed from the header's trajectory, ...)."""
    traj = header.get("trajectory")
    run_seed = traj.get("run.seed") if isinstance(traj, dict) else None
    if not isinstance(run_seed, int) or isinstance(run_seed, bool) or run_seed < 0:
        raise CheckpointError(
            f'{path}: the log header has no integer trajectory "run.seed", needed to derive message seeds'
        )
    from seedflood.core.config import rng  # numpy + torch: imported only when a v2 log is read or written

    return functools.partial(rng.derive, run_seed)


def read_header_at(f: IO[bytes], path: Path) -> tuple[dict[str, Any], int, int]:
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
    end = len(magic) + 4 + n
    if magic == LOG_MAGIC:  # legacy magics have no header CRC
        crc = f.read(4)
        if len(crc) < 4:
            raise CheckpointError(f"{path}: truncated log header (no checksum)")
        if _U32.unpack(crc)[0] != zlib.crc32(raw + body):
            raise CheckpointError(f"{path}: the log header is corrupt (checksum mismatch)")
        end += 4
    try:
        header = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise CheckpointError(f"{path}: log header is not valid JSON") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: log header is not a JSON object")
    return header, end, _FRAME_VERSION[magic]


def log_header(cfg: Config, trajectory: dict[str, Any], base_identity: str, base_hash: str) -> dict[str, Any]:
    """The header of a run's log: the base model, the trajectory fingerprint
    (`protocol.trajectory`) and the whole config, for the record."""
    return {
        "base_identity": base_identity,
        "base_hash": base_hash,
        "trajectory": trajectory,
        "config": cfg.to_dict(),
    }


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of the log at `path` (records are not read)."""
    if not path.is_file():
        raise CheckpointError(f"message log {path} does not exist")
    with open(path, "rb") as f:
        return read_header_at(f, path)[0]


def header_checked(path: Path) -> bool:
    """Whether the log at `path` carries a header CRC (False: a legacy log, read unchecked)."""
    with open(path, "rb") as f:
        return f.read(len(LOG_MAGIC)) == LOG_MAGIC


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


def encode_header(header: dict[str, Any]) -> bytes:
    """The bytes a new log begins with: magic, u32 length, the JSON header (sorted keys), u32 crc32
    of the length and the JSON."""
    body = json.dumps(header, sort_keys=True).encode()
    sized = _U32.pack(len(body)) + body
    return LOG_MAGIC + sized + _U32.pack(zlib.crc32(sized))
