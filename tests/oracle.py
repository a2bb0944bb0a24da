"""An independent oracle for a run's state: base model + message log, applied the simplest way.

Owns: `oracle_hash(cfg, log_path)`, the state hash a run must end with according to the documented
log format and update rule, computed without the code paths under test: no Client, Flood,
Applier, Protocol (its lr schedule and coefficient), checkpoint reader, codec or transport. The
log is parsed here with `struct` from its documented layout (all little-endian):

  b"SEEDFLOOD-LOG 1\\n", u32 n, n bytes of JSON header (b"SEEDFLOOD-LOG 3\\n": then a u32 crc32 of
  u32 n + the JSON); then per step a record
  u32 step, u32 frame length, frame = 16-byte header (magic b"SFLD", u16 version = 1,
  u16 record size = 24, u32 count, u32 crc32 of the records) + count records `<IIQfHH`
  (origin, step, seed, scalar as float32, k, reserved = 0).

and every message is applied in canonical order (step, origin, k) with the update rule of the
README: θ ← θ − lr(step)·w·scalar·z(seed), w = 1 (zo.aggregate = sum) or 1/N (mean), lr(step) =
linear warmup lr·(step+1)/warmup for step < warmup, then constant lr, linear lr·(1 − f) or cosine
lr·½·(1 + cos πf) with f = min(1, (step − warmup) / max(1, steps − warmup)). With zo.clip > 0
(docs/trust.md) each scalar of a step is first clamped to ±clip × the median |scalar| of that
step (the mean of the two middle magnitudes when the step holds an even number of messages).
With zo.stride {node: m} (docs/churn.md, Unequal speeds) a listed node's messages are in step s
only when s % m == 0, and mean's N is the number of clients whose messages step s holds.

What it shares with the code under test, on purpose: the model builder (`seedflood.ml.model.load`,
which defines the base weights), the direction family (`seedflood.core.zo.family.build`: its
`accumulate`/`commit` define z(seed) and the merge schedule) and `seedflood.core.zo.replay.state_hash`
(the hash's definition). A bug there is not caught by this oracle; a bug in how steps travel,
complete, are ordered, logged, read back or weighted is.

Assumes: bit-identical results need the same float evaluation order as the run, which the formula
fixes when read left to right: the coefficient is (−lr·w)·scalar in float64, rounded to float32 by
the direction; torch ops are deterministic for a fixed thread count (run.threads is applied while
the oracle runs, then restored). The log is strict here: any malformed byte raises OracleError
(a finished or cleanly resumed run never holds a torn tail).
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from seedflood.core.config import runconfig as sf_config
from seedflood.core.config.runconfig import Config
from seedflood.core.zo import family
from seedflood.core.zo.replay import state_hash
from seedflood.ml import model as sf_model

LOG_MAGIC = b"SEEDFLOOD-LOG 1\n"
LOG_MAGIC_2 = b"SEEDFLOOD-LOG 2\n"
LOG_MAGIC_3 = b"SEEDFLOOD-LOG 3\n"  # v2 frames, and a u32 crc32 of (u32 n + JSON) after the header
FRAME_MAGIC_2 = b"SF"
WIDTH = (0, 1, 2, 4)  # v2 layout codes -> bytes
UINT = {0: "", 1: "B", 2: "H", 4: "I"}
FRAME_MAGIC = b"SFLD"
FRAME_VERSION = 1
U32 = struct.Struct("<I")
STEP_RECORD = struct.Struct("<II")  # step, frame length
FRAME_HEADER = struct.Struct("<4sHHII")  # magic, version, record size, count, crc32: 16 bytes
MESSAGE = struct.Struct("<IIQfHH")  # origin, step, seed, scalar (f32), k, reserved: 24 bytes


class OracleError(ValueError):
    """The log is malformed, incomplete or belongs to other base weights."""


@dataclass(frozen=True)
class LoggedMessage:
    origin: int
    step: int
    seed: int
    scalar: float  # the float32 value as a Python float
    k: int


def read_log(path: str | Path) -> tuple[dict, list[tuple[int, list[LoggedMessage]]]]:
    """The JSON header and every step record, strictly checked, in file order."""
    data = Path(path).read_bytes()
    if not data.startswith((LOG_MAGIC, LOG_MAGIC_2, LOG_MAGIC_3)):
        raise OracleError(f"{path}: bad log magic")
    v2 = data.startswith((LOG_MAGIC_2, LOG_MAGIC_3))
    pos = len(LOG_MAGIC)
    if len(data) < pos + 4:
        raise OracleError(f"{path}: truncated header length")
    (n,) = U32.unpack_from(data, pos)
    pos += 4
    if len(data) < pos + n:
        raise OracleError(f"{path}: truncated JSON header")
    header = json.loads(data[pos : pos + n])
    pos += n
    if data.startswith(LOG_MAGIC_3):
        if len(data) < pos + 4 or U32.unpack_from(data, pos)[0] != zlib.crc32(data[pos - n - 4 : pos]):
            raise OracleError(f"{path}: bad header CRC")
        pos += 4
    steps: list[tuple[int, list[LoggedMessage]]] = []
    while pos < len(data):
        if len(data) < pos + STEP_RECORD.size:
            raise OracleError(f"{path}: truncated record header at byte {pos}")
        step, length = STEP_RECORD.unpack_from(data, pos)
        pos += STEP_RECORD.size
        frame = data[pos : pos + length]
        pos += length
        if v2:
            steps.append((step, _frame_v2(path, frame, length, step, header["trajectory"]["run.seed"])))
            continue
        if len(frame) != length or length < FRAME_HEADER.size:
            raise OracleError(f"{path}: truncated or short frame of step {step}")
        magic, version, rsize, count, crc = FRAME_HEADER.unpack_from(frame)
        body = frame[FRAME_HEADER.size :]
        if magic != FRAME_MAGIC or version != FRAME_VERSION or rsize != MESSAGE.size:
            raise OracleError(f"{path}: step {step}: bad frame header {magic!r} v{version} size {rsize}")
        if len(body) != count * MESSAGE.size:
            raise OracleError(f"{path}: step {step}: frame holds {len(body)} bytes for {count} messages")
        if zlib.crc32(body) != crc:
            raise OracleError(f"{path}: step {step}: frame checksum mismatch")
        msgs = []
        for origin, mstep, seed, scalar, k, reserved in MESSAGE.iter_unpack(body):
            if mstep != step or reserved != 0:
                raise OracleError(f"{path}: step {step}: message of step {mstep} / reserved {reserved}")
            msgs.append(LoggedMessage(origin, mstep, seed, scalar, k))
        steps.append((step, msgs))
    return header, steps


def _frame_v2(path: str | Path, frame: bytes, length: int, step: int, run_seed: int) -> list[LoggedMessage]:
    """A v2 frame: b"SF", u8 version 2, u8 layout (2-bit width codes: step offset, origin, k,
    count), count, u32 base step, u32 crc32 of the header bytes after the magic and before the
    CRC plus the records; records (offset, origin, k, scalar f32). Seeds are derived."""
    from seedflood.core.config.rng import derive  # the documented derivation, not the codec

    if len(frame) != length or length < 4 or frame[:3] != FRAME_MAGIC_2 + b"\x02":
        raise OracleError(f"{path}: step {step}: truncated, short or not a v2 frame")
    w_off, w_org, w_k, w_cnt = (WIDTH[(frame[3] >> s) & 3] for s in (0, 2, 4, 6))
    head = 4 + w_cnt + 8
    if w_cnt == 0 or length < head:
        raise OracleError(f"{path}: step {step}: bad v2 header")
    count = int.from_bytes(frame[4 : 4 + w_cnt], "little")
    base, crc = struct.unpack_from("<II", frame, 4 + w_cnt)
    rec = struct.Struct("<" + UINT[w_off] + UINT[w_org] + UINT[w_k] + "f")
    body = frame[head:]
    if len(body) != count * rec.size or zlib.crc32(frame[2 : head - 4] + body) != crc:
        raise OracleError(f"{path}: step {step}: bad v2 frame length or checksum")
    msgs = []
    for row in rec.iter_unpack(body):
        it = iter(row[:-1])
        off, origin, k = (next(it) if w else 0 for w in (w_off, w_org, w_k))
        if base + off != step:
            raise OracleError(f"{path}: step {step}: message of step {base + off}")
        msgs.append(LoggedMessage(origin, step, derive(run_seed, origin, step, k), row[-1], k))
    return msgs


def learning_rate(step: int, lr: float, schedule: str, warmup: int, total_steps: int) -> float:
    """lr(step) as documented: warmup lr·(step+1)/warmup, then constant / linear / cosine."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    f = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    if schedule == "linear":
        return lr * (1.0 - f)
    if schedule == "cosine":
        return lr * 0.5 * (1.0 + math.cos(math.pi * f))
    raise OracleError(f"unknown lr schedule {schedule!r}")


def clip_bound(clip: float, scalars: list[float]) -> float:
    """clip × the median of |scalar| over one step (inf when clip is 0: nothing is clamped)."""
    if not clip:
        return math.inf
    mags = sorted(abs(x) for x in scalars)
    half = len(mags) // 2
    median = mags[half] if len(mags) % 2 else (mags[half - 1] + mags[half]) / 2
    return clip * median


def oracle_hash(cfg: Config | str | Path, log_path: str | Path, upto: int | None = None) -> tuple[int, str]:
    """(steps applied, state hash) of the base model of `cfg` after the log's steps <= `upto`
    (all when None). `cfg` is a Config or the path of a config YAML (e.g. a run's config.yaml)."""
    if not isinstance(cfg, Config):
        cfg = sf_config.load(cfg)
    header, records = read_log(log_path)
    n_clients, per_origin = cfg.topology.nodes, cfg.zo.perturbations
    threads = torch.get_num_threads()
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    try:
        loaded = sf_model.load(cfg.model)
        if "base_hash" in header and header["base_hash"] != loaded.base_hash:
            raise OracleError(f"{log_path}: log is of base {header['base_hash']}, config builds {loaded.base_hash}")
        direction = family.build(loaded.model, cfg.zo, cfg.subspace, cfg.run.seed)
        applied = 0
        for i, (step, msgs) in enumerate(records):
            if step != i:
                raise OracleError(f"{log_path}: record {i} holds step {step}; steps run 0, 1, 2, ...")
            if upto is not None and step > upto:
                break
            ids = sorted((m.origin, m.k) for m in msgs)
            due = [o for o in range(n_clients) if step % cfg.zo.stride.get(o, 1) == 0]
            if ids != [(o, k) for o in due for k in range(per_origin)]:
                raise OracleError(f"{log_path}: step {step} is not complete: holds (origin, k) {ids}")
            w = 1.0 if cfg.zo.aggregate == "sum" else 1.0 / len(due)
            lr = learning_rate(step, cfg.zo.lr, cfg.zo.schedule, cfg.zo.warmup_steps, cfg.run.steps)
            bound = clip_bound(cfg.zo.clip, [m.scalar for m in msgs])
            with torch.no_grad():
                for m in sorted(msgs, key=lambda m: (m.origin, m.k)):  # canonical order in a step
                    scalar = m.scalar if abs(m.scalar) <= bound else math.copysign(bound, m.scalar)
                    direction.accumulate(step, m.seed, -lr * w * scalar)
                direction.commit(step)
            applied += 1
        return applied, state_hash(loaded.model, direction)
    finally:
        torch.set_num_threads(threads)
