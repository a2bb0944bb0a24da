"""rundir log and checkpoint modules: torn tail vs corruption in the message log, the check hook, the settings
fingerprint, durability, and checkpoint integrity (sha256, fallback, prune, atomic_dir).

Every test works on a few hundred bytes under tmp_path and runs in milliseconds.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from seedflood.core.config import rng
from seedflood.core.wire import message
from seedflood.core.wire.message import Limits, Message
from seedflood.rundir import checkpoints as ckpt
from seedflood.rundir.atomic import atomic_dir, atomic_write_text
from seedflood.rundir.layout import CheckpointError
from seedflood.rundir.logfile import LogReader, LogWriter
from seedflood.rundir.logheader import (
    LOG_MAGIC,
    LOG_MAGIC_V1,
    LOG_MAGIC_V2,
    header_checked,
    header_mismatch,
    read_header,
    read_header_at,
)

N = 3  # messages per step
TRAJ = {"run.seed": 0, "zo.lr": 10.0, "zo.eps": 1e-3, "n_clients": N, "delay": 0}


def seed_of(o: int, s: int, k: int) -> int:
    return rng.derive(TRAJ["run.seed"], o, s, k)  # what a v2 log's reader derives


@dataclass(frozen=True)
class Fmt:
    """One log format: its frame version and the sizes of its on-disk records."""

    version: int
    frame_header: int  # bytes of a frame's header
    message: int  # bytes of one message in a frame

    @property
    def rec(self) -> int:
        """Bytes of one record on disk (v1: 96, v2: 36)."""
        return 8 + self.frame_header + N * self.message


V1, V2 = Fmt(1, message.HEADER_SIZE, message.RECORD_SIZE), Fmt(2, 13, 5)  # v2: 3 origins, k = 0


@pytest.fixture(params=[V1, V2], ids=["v1", "v2"])
def fmt(request: pytest.FixtureRequest) -> Fmt:
    return request.param


def header(**traj: object) -> dict:
    return {"base_identity": "tiny", "base_hash": "abc", "trajectory": {**TRAJ, **traj}, "config": {"run": {"seed": 0}}}


def msgs(step: int) -> list[Message]:
    return [Message.make(o, step, seed=seed_of(o, step, 0), scalar=0.5 * o - step) for o in range(N)]


def start_log(path: Path, fmt: Fmt, head: dict | None = None) -> None:
    """A log with no records: v2 as LogWriter creates it, v1 as the code before frame v2 did."""
    if fmt.version == 2:
        LogWriter(path, head or header()).close()
        return
    body = json.dumps(head or header(), sort_keys=True).encode()
    path.write_bytes(LOG_MAGIC_V1 + len(body).to_bytes(4, "little") + body)


def write_log(path: Path, steps: int, fmt: Fmt = V2) -> int:
    """A log of `steps` records (a v1 log is appended to in v1); returns the byte offset of record 0."""
    start_log(path, fmt)
    w = LogWriter(path, header())
    assert w.version == fmt.version
    for s in range(steps):
        w.append(s, msgs(s))
    w.close()
    start = path.stat().st_size - steps * fmt.rec
    assert [path.read_bytes()[start + i * fmt.rec : start + i * fmt.rec + 4] for i in range(steps)] == [
        i.to_bytes(4, "little") for i in range(steps)
    ]
    return start


def flipped(data: bytes, i: int, bit: int) -> bytes:
    b = bytearray(data)
    b[i] ^= 1 << bit
    return bytes(b)


def limits_check(step: int, ms: list[Message]) -> None:
    """What the evaluator's check does: wire limits per message, exactly N messages."""
    lim = Limits(n_origins=N, min_step=step, max_step=step, seed_of=seed_of)
    for m in ms:
        lim.check(m)
    if len(ms) != N:
        raise ValueError(f"step {step} carries {len(ms)} messages, expected {N}")


def flips(off: int, fmt: Fmt) -> list[tuple[int, int]]:
    """(byte, bit) to flip in the record at `off`: every bit of the record and frame headers
    (step, length, frame header: where the torn-vs-corrupt logic lives), one bit of each message
    byte (all of them fall to the CRC), so the loop stays in the hundreds."""
    head = 8 + fmt.frame_header
    return [(off + i, b) for i in range(head) for b in range(8)] + [(off + i, i % 8) for i in range(head, fmt.rec)]


def rec_at(start: int, fmt: Fmt, step: int) -> int:
    return start + step * fmt.rec


def snapshot(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mtime_ns


# -- the log: round trip, torn tail ---------------------------------------------------------------
def test_round_trip_and_header(tmp_path: Path, fmt: Fmt) -> None:
    p = tmp_path / "log.bin"
    write_log(p, 5, fmt)
    reader = LogReader(p)
    head, records = reader.read(check=limits_check)
    assert head == json.loads(json.dumps(header()))
    assert read_header(p) == head
    assert records == [(s, msgs(s)) for s in range(5)]
    assert reader.torn == 0


def test_torn_tail_at_every_byte_of_the_final_record(tmp_path: Path, fmt: Fmt) -> None:
    p = tmp_path / "log.bin"
    start = write_log(p, 4, fmt)
    full = p.read_bytes()
    last = rec_at(start, fmt, 3)
    for cut in range(1, fmt.rec):
        p.write_bytes(full[: last + cut])
        reader = LogReader(p)
        _, records = reader.read(check=limits_check)
        assert [s for s, _ in records] == [0, 1, 2], cut
        assert reader.torn == cut
        w = LogWriter(p, header(), check=limits_check)
        assert (w.next_step, w.dropped_tail) == (3, cut)
        assert p.stat().st_size == last  # cut off before anything is appended
        w.append(3, msgs(3))
        w.close()
        assert p.read_bytes() == full, cut


# -- the log: corruption is an error, never a short read -----------------------------------------
def test_bit_flip_anywhere_in_a_middle_record_names_it(tmp_path: Path, fmt: Fmt) -> None:
    p = tmp_path / "log.bin"
    start = write_log(p, 5, fmt)
    full = p.read_bytes()
    off = rec_at(start, fmt, 2)
    for i, bit in flips(off, fmt):
        p.write_bytes(flipped(full, i, bit))
        with pytest.raises(CheckpointError) as e:
            LogReader(p).read()
        assert f"record at byte offset {off} (step 2) is corrupt" in str(e.value), (i, bit, str(e.value))
        assert "\n" not in str(e.value)


def test_bit_flip_anywhere_in_the_last_complete_record_is_not_a_torn_tail(tmp_path: Path, fmt: Fmt) -> None:
    p = tmp_path / "log.bin"
    start = write_log(p, 4, fmt)
    full = p.read_bytes()
    off = rec_at(start, fmt, 3)
    for i, bit in flips(off, fmt):
        p.write_bytes(flipped(full, i, bit))
        with pytest.raises(CheckpointError, match=rf"record at byte offset {off} \(step 3\) is corrupt"):
            LogReader(p).read()


def test_crc_failure_of_the_last_record_is_an_error(tmp_path: Path, fmt: Fmt) -> None:
    p = tmp_path / "log.bin"
    write_log(p, 3, fmt)
    p.write_bytes(flipped(p.read_bytes(), p.stat().st_size - 1, 0))  # last byte of the last message
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        LogReader(p).read()


def test_length_field_of_the_last_record_grown_by_one_message_is_an_error(tmp_path: Path, fmt: Fmt) -> None:
    # A valid-looking frame length that runs past the end of the file: it would look torn,
    # but the frame header (fully present) still says N messages.
    p = tmp_path / "log.bin"
    start = write_log(p, 3, fmt)
    b = bytearray(p.read_bytes())
    off = rec_at(start, fmt, 2)
    b[off + 4 : off + 8] = (fmt.rec - 8 + fmt.message).to_bytes(4, "little")
    p.write_bytes(bytes(b))
    with pytest.raises(CheckpointError, match=rf"offset {off} \(step 2\).*disagrees with the frame header"):
        LogReader(p).read()


@pytest.mark.parametrize("garbage", [b"\xff", b"\x00\x00\x00\x00\x10", b"\x03\x00\x00\x00" + b"\x00" * 40])
def test_trailing_garbage_is_an_error(tmp_path: Path, fmt: Fmt, garbage: bytes) -> None:
    p = tmp_path / "log.bin"
    start = write_log(p, 3, fmt)
    p.write_bytes(p.read_bytes() + garbage)
    with pytest.raises(CheckpointError, match=rf"offset {rec_at(start, fmt, 3)} \(step 3\) is corrupt"):
        LogReader(p).read()


def _incomplete_final(b: bytearray, off: int, byte: int, cut: int, mask: int = 1) -> bytes:
    """The log cut `cut` bytes into the record at `off`, with byte `off + byte` xor `mask`."""
    b[off + byte] ^= mask
    return bytes(b[: off + cut])


INCONSISTENT = [  # (format, byte, bytes left of the final record, reason, xor mask of the byte)
    (V1, 1, 3, "does not start with step 3", 1),  # step field, itself incomplete
    (V1, 8 + 2, 8 + 3, "bad frame magic", 1),  # frame magic, itself incomplete
    (V1, 8 + 4, 8 + 20, "unsupported frame version", 1),  # frame header whole, rest missing
    (V1, 8 + 16 + 4, 8 + 16 + 30, "holds a message of step", 1),  # first message whole, wrong step
    (V1, 8 + 16 + 22, 8 + 16 + 30, "holds a message of step", 1),  # reserved field of that message
    (V2, 1, 3, "does not start with step 3", 1),
    (V2, 8 + 1, 8 + 2, "bad frame magic", 1),  # frame magic, itself incomplete
    (V2, 8 + 2, 8 + 3, "unsupported frame version", 1),  # version byte, nothing after it
    (V2, 8 + 3, 8 + 4, "has step offsets", 1),  # layout byte: an offset width in a one-step frame
    (V2, 8 + 3, 8 + 4, "count width 0 is reserved", 0x40),  # layout byte: no count
    (V2, 8 + 4, 8 + 5, "disagrees with the frame header", 1),  # count, then nothing
    (V2, 8 + 5, 8 + 9, "frame header holds step 2", 1),  # base step whole, no CRC yet
    (V2, 8 + 13, 8 + 13 + 12, "out of canonical", 1),  # first message (origin 0 -> 1), two whole
    (V2, 8 + 18, 8 + 13 + 10, "out of canonical", 1),  # second message's origin (1 -> 0)
]


@pytest.mark.parametrize(
    ("fmt", "byte", "cut", "reason", "mask"), INCONSISTENT, ids=[f"v{t[0].version}-{t[3]}" for t in INCONSISTENT]
)
def test_an_incomplete_final_record_with_an_inconsistent_field_is_corrupt_not_torn(
    tmp_path: Path,
    fmt: Fmt,
    byte: int,
    cut: int,
    reason: str,
    mask: int,
) -> None:
    p = tmp_path / "log.bin"
    start = write_log(p, 4, fmt)
    off = rec_at(start, fmt, 3)
    p.write_bytes(_incomplete_final(bytearray(p.read_bytes()), off, byte, cut, mask))
    with pytest.raises(CheckpointError, match=rf"offset {off} \(step 3\) is corrupt: .*{reason}"):
        LogReader(p).read()
    before = snapshot(p)
    with pytest.raises(CheckpointError):
        LogWriter(p, header())
    assert snapshot(p) == before


def test_step_out_of_sequence_is_an_error(tmp_path: Path, fmt: Fmt) -> None:
    p = tmp_path / "log.bin"
    start = write_log(p, 3, fmt)
    b = bytearray(p.read_bytes())
    b[rec_at(start, fmt, 1) : rec_at(start, fmt, 1) + 4] = (2).to_bytes(4, "little")
    p.write_bytes(bytes(b))
    with pytest.raises(CheckpointError, match=r"\(step 1\) is corrupt: holds step 2, expected 1"):
        LogReader(p).read()


# -- the check hook -------------------------------------------------------------------------------
def test_check_rejects_a_record_with_a_valid_crc_and_a_nan_scalar(tmp_path: Path, fmt: Fmt) -> None:
    p = tmp_path / "log.bin"
    start = write_log(p, 3, fmt)
    bad = [Message(step=3, origin=o, k=0, seed=seed_of(o, 3, 0), scalar=math.nan if o == 1 else 1.0) for o in range(N)]
    frame = message.encode(bad, version=fmt.version)
    got = message.decode(frame, seed_of=seed_of)
    assert got[1].scalar != got[1].scalar  # CRC fine, NaN inside
    p.write_bytes(p.read_bytes() + (3).to_bytes(4, "little") + len(frame).to_bytes(4, "little") + frame)
    assert len(LogReader(p).read()[1]) == 4  # structurally whole: only the check can catch it
    off = rec_at(start, fmt, 3)
    with pytest.raises(CheckpointError, match=rf"offset {off} \(step 3\) is corrupt: rejected: scalar nan"):
        LogReader(p).read(check=limits_check)
    before = snapshot(p)
    with pytest.raises(CheckpointError, match=rf"offset {off} \(step 3\)"):
        LogWriter(p, header(), check=limits_check)
    assert snapshot(p) == before


def test_check_sees_every_whole_record_but_not_a_torn_tail(tmp_path: Path, fmt: Fmt) -> None:
    p = tmp_path / "log.bin"
    write_log(p, 3, fmt)
    p.write_bytes(p.read_bytes()[:-5])
    seen: list[int] = []
    LogReader(p).read(check=lambda s, ms: seen.append(s))
    assert seen == [0, 1]


# -- writer: never touches a log it refuses -------------------------------------------------------
def test_writer_on_a_corrupt_log_raises_and_leaves_it_byte_identical(tmp_path: Path, fmt: Fmt) -> None:
    p = tmp_path / "log.bin"
    start = write_log(p, 4, fmt)
    p.write_bytes(flipped(p.read_bytes(), rec_at(start, fmt, 1) + 30, 3))
    before = snapshot(p)
    with pytest.raises(CheckpointError, match=rf"offset {rec_at(start, fmt, 1)} \(step 1\) is corrupt"):
        LogWriter(p, header())
    assert snapshot(p) == before


def test_writer_with_different_settings_raises_and_leaves_the_log_byte_identical(tmp_path: Path, fmt: Fmt) -> None:
    p = tmp_path / "log.bin"
    write_log(p, 2, fmt)
    before = snapshot(p)
    with pytest.raises(CheckpointError) as e:
        LogWriter(p, header(**{"zo.lr": 5.0, "zo.eps": 1e-2}))
    assert str(e.value) == (
        f"{p} belongs to a different run: settings differ: zo.eps (0.001 -> 0.01), zo.lr (10.0 -> 5.0); "
        "use a new run.out_dir or delete the directory"
    )
    assert snapshot(p) == before
    # Only the informational config differs: the same run, resumed.
    w = LogWriter(p, {**header(), "config": {"eval": {"every": 7}}})
    assert w.next_step == 2
    w.close()


def test_writer_on_a_log_without_a_fingerprint_says_so(tmp_path: Path) -> None:
    p = tmp_path / "log.bin"
    start_log(p, V1, {"run_seed": 0, "n_clients": N, "base_hash": "abc"})  # as an older SeedFlood wrote it
    before = snapshot(p)
    with pytest.raises(
        CheckpointError, match=rf"^{re.escape(str(p))} was written by an older SeedFlood \(its header has no settings"
    ):
        LogWriter(p, header())
    assert snapshot(p) == before


def test_header_mismatch_names_exactly_the_differing_keys() -> None:
    old = {"base_hash": "abc", "trajectory": {"a": 1, "b": 2, "c": 3, "t": [1, 2], "f": 10, "s": "ring:4"}}
    new = {
        "base_hash": "def",
        "trajectory": {"a": 1, "b": 5, "d": 4, "t": (1, 2), "f": 10.0, "s": "ring:4"},
        "config": {"x": 1},
    }
    assert header_mismatch(old, new) == [
        'base_hash ("abc" -> "def")',
        "b (2 -> 5)",
        "c (3 -> absent)",
        "d (absent -> 4)",
    ]
    assert header_mismatch(old, old) == []
    assert header_mismatch({**old, "config": 1}, {**old, "config": 2}) == []
    legacy = {"run_seed": 0, "n_clients": 3, "base_hash": "def"}
    assert header_mismatch(legacy, new) == [
        "trajectory (absent -> present: the log was written by an older SeedFlood)",
    ]


# -- format versions ------------------------------------------------------------------------------
V1_FIXTURE = Path(__file__).parent / "data" / "log_v1.bin"  # written by the v1 code: see data/README.md


def test_a_committed_v1_log_and_the_same_runs_v2_log_hold_the_same_messages(tmp_path: Path) -> None:
    head, records = LogReader(V1_FIXTURE).read()
    assert V1_FIXTURE.read_bytes().startswith(LOG_MAGIC_V1)
    assert [s for s, _ in records] == [0, 1, 2, 3] and all(len(ms) == 6 for _, ms in records)  # N = 3, K = 2
    run_seed = head["trajectory"]["run.seed"]
    assert all(m.seed == rng.derive(run_seed, m.origin, m.step, m.k) for _, ms in records for m in ms)
    p = tmp_path / "log.bin"
    w = LogWriter(p, head)
    assert w.version == 2
    for s, ms in records:
        w.append(s, ms)
    w.close()
    assert p.read_bytes().startswith(LOG_MAGIC)
    assert LogReader(p).read() == (head, records)
    assert p.stat().st_size < V1_FIXTURE.stat().st_size
    # Resuming the v1 log keeps it v1 (one frame version per log) and byte-identical.
    q = tmp_path / "v1.bin"
    data = V1_FIXTURE.read_bytes()
    q.write_bytes(data[: read_header_at(io.BytesIO(data), q)[1]])
    w = LogWriter(q, head)
    assert w.version == 1
    for s, ms in records:
        w.append(s, ms)
    w.close()
    assert q.read_bytes() == data


def as_legacy_v2(data: bytes) -> bytes:
    """A v3 log rewritten as a log from before the header CRC: magic 2, no CRC, same records."""
    (n,) = struct.unpack_from("<I", data, len(LOG_MAGIC))
    head_end = len(LOG_MAGIC) + 4 + n
    return LOG_MAGIC_V2 + data[len(LOG_MAGIC) : head_end] + data[head_end + 4 :]


def test_a_new_log_header_carries_its_own_crc(tmp_path: Path) -> None:
    p = tmp_path / "log.bin"
    write_log(p, 2)
    data = p.read_bytes()
    (n,) = struct.unpack_from("<I", data, len(LOG_MAGIC))
    sized = data[len(LOG_MAGIC) : len(LOG_MAGIC) + 4 + n]
    assert data.startswith(LOG_MAGIC) and LOG_MAGIC == b"SEEDFLOOD-LOG 3\n"
    assert struct.unpack_from("<I", data, len(LOG_MAGIC) + 4 + n)[0] == zlib.crc32(sized)
    assert header_checked(p) and read_header(p) == header()


@pytest.mark.parametrize("where", ['"config": {', '"trajectory": {'], ids=["config-snapshot", "fingerprint"])
def test_a_flipped_bit_in_the_header_is_a_corrupt_log_header(tmp_path: Path, where: str) -> None:
    p = tmp_path / "log.bin"
    write_log(p, 2)
    data = p.read_bytes()
    at = data.index(where.encode()) + len(where) + 1  # a letter of the object's first key: JSON stays valid
    p.write_bytes(flipped(data, at, 0))
    for read in (read_header, lambda path: LogReader(path).read(), lambda path: LogWriter(path, header())):
        with pytest.raises(CheckpointError, match=r"log\.bin: the log header is corrupt \(checksum mismatch\)"):
            read(p)
    assert p.read_bytes() == flipped(data, at, 0)  # the writer refused before changing a byte


def test_a_header_cut_before_its_crc_is_truncated(tmp_path: Path) -> None:
    p = tmp_path / "log.bin"
    write_log(p, 0)
    p.write_bytes(p.read_bytes()[:-2])
    with pytest.raises(CheckpointError, match="truncated log header"):
        read_header(p)


def test_a_log_from_before_the_header_crc_is_read_and_resumed_as_legacy(tmp_path: Path) -> None:
    """Decision (docs/design.md, Evaluator, run directory, checkpoints, replay): magic-2 logs are accepted, header unchecked, format kept."""
    p = tmp_path / "log.bin"
    write_log(p, 3)
    want = LogReader(p).read()
    q = tmp_path / "legacy.bin"
    q.write_bytes(as_legacy_v2(p.read_bytes()))
    assert not header_checked(q) and LogReader(q).read() == want
    w = LogWriter(q, header())
    assert w.version == 2 and w.next_step == 3
    w.append(3, msgs(3))
    w.close()
    assert q.read_bytes().startswith(LOG_MAGIC_V2) and [s for s, _ in LogReader(q).read()[1]] == [0, 1, 2, 3]


def test_a_new_log_without_a_run_seed_is_refused_before_writing(tmp_path: Path) -> None:
    p = tmp_path / "log.bin"
    head = header()
    del head["trajectory"]["run.seed"]
    with pytest.raises(CheckpointError, match='no integer trajectory "run.seed"'):
        LogWriter(p, head)
    assert not p.exists()


def test_a_v2_log_refuses_a_message_it_could_not_reproduce(tmp_path: Path) -> None:
    p = tmp_path / "log.bin"
    w = LogWriter(p, header())
    before = snapshot(p)
    wrong = [msgs(0)[0], Message.make(1, 0, seed=12345, scalar=1.0), msgs(0)[2]]
    with pytest.raises(CheckpointError, match=r"message \(1, 0, 0\) is of another step or its seed"):
        w.append(0, wrong)
    with pytest.raises(CheckpointError, match="no messages"):
        w.append(0, [])
    assert snapshot(p) == before
    w.append(0, msgs(0))
    w.close()
    assert LogReader(p).read()[1] == [(0, msgs(0))]


# -- writer: durability and truncation ------------------------------------------------------------
def test_append_flushes_without_fsync_and_sync_fsyncs(
    tmp_path: Path, fmt: Fmt, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "log.bin"
    start_log(p, fmt)
    w = LogWriter(p, header())
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    for s in range(3):
        w.append(s, msgs(s))
    assert calls == []
    assert len(LogReader(p).read()[1]) == 3  # flushed: a reader sees every appended step
    w.sync()
    assert len(calls) == 1
    w.close()
    assert len(calls) == 2


def test_truncate_to_then_append(tmp_path: Path, fmt: Fmt) -> None:
    p = tmp_path / "log.bin"
    start = write_log(p, 5, fmt)
    w = LogWriter(p, header())
    w.truncate_to(2)
    assert w.next_step == 2
    assert p.stat().st_size == rec_at(start, fmt, 2)
    with pytest.raises(CheckpointError, match="appending step 3, expected 2"):
        w.append(3, msgs(3))
    w.append(2, msgs(2))
    w.truncate_to(10)  # beyond the end: nothing to cut
    w.close()
    assert [s for s, _ in LogReader(p).read()[1]] == [0, 1, 2]


def test_creating_a_log_leaves_no_temp_file(tmp_path: Path, fmt: Fmt) -> None:
    write_log(tmp_path / "log.bin", 1, fmt)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["log.bin"]


# -- checkpoints ---------------------------------------------------------------------------------
def make_ckpt(run: Path, step: int) -> Path:
    d = ckpt.checkpoint_dir(run, step)
    with atomic_dir(d) as tmp:
        sha = ckpt.save_state(tmp / "state.pt", {"w": torch.arange(64, dtype=torch.float32) + step})
        atomic_write_text(tmp / "meta.json", json.dumps({"step": step, "state_sha256": sha}))
    return d


def test_save_state_returns_the_sha256_and_load_state_checks_it(tmp_path: Path) -> None:
    p = tmp_path / "state.pt"
    sha = ckpt.save_state(p, {"w": torch.ones(3)})
    assert sha == hashlib.sha256(p.read_bytes()).hexdigest()
    assert torch.equal(ckpt.load_state(p, sha)["w"], torch.ones(3))
    assert torch.equal(ckpt.load_state(p)["w"], torch.ones(3))
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(p))}: checksum mismatch \(file corrupt\)$"):
        ckpt.load_state(p, "0" * 64)


def test_a_flipped_bit_in_tensor_data_is_caught_and_the_previous_checkpoint_used(tmp_path: Path) -> None:
    run = tmp_path
    c10, c20 = make_ckpt(run, 10), make_ckpt(run, 20)
    state = c20 / "state.pt"
    data = state.read_bytes()
    at = data.index((torch.arange(64, dtype=torch.float32) + 20).numpy().tobytes()) + 4 * 7
    state.write_bytes(flipped(data, at, 0))
    corrupt = state.read_bytes()
    assert not torch.equal(torch.load(state, weights_only=True)["w"], torch.arange(64) + 20.0)  # loads silently

    assert ckpt.verify(c10) is None
    assert ckpt.verify(c20) == f"{state}: checksum mismatch (file corrupt)"
    meta = json.loads((c20 / "meta.json").read_text())
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        ckpt.load_state(state, meta["state_sha256"])
    found, skipped = ckpt.usable_checkpoint(run, 100)
    assert found == c10
    assert len(skipped) == 1 and "step_000020" in skipped[0] and "checksum mismatch" in skipped[0]
    assert state.read_bytes() == corrupt  # reported, never modified or deleted
    assert ckpt.usable_checkpoint(run, 15) == (c10, [])
    assert ckpt.usable_checkpoint(run, 9) == (None, [])


def test_verify_reasons(tmp_path: Path) -> None:
    c = make_ckpt(tmp_path, 5)
    meta = json.loads((c / "meta.json").read_text())
    (c / "meta.json").write_text(json.dumps({"step": 5}))
    assert "state_sha256" in ckpt.verify(c)
    (c / "meta.json").write_text(json.dumps({**meta, "step": 6}))
    assert "does not match the directory name" in ckpt.verify(c)
    (c / "meta.json").write_text("{not json")
    assert "not valid JSON" in ckpt.verify(c)
    (c / "meta.json").write_text(json.dumps(meta))
    (c / "state.pt").unlink()
    assert ckpt.verify(c) == f"{c / 'state.pt'} is missing"


def test_checkpoints_newest_first_and_only_complete(tmp_path: Path) -> None:
    for s in (5, 100, 20):
        make_ckpt(tmp_path, s)
    (tmp_path / "checkpoints" / "step_000200").mkdir()  # no meta.json: incomplete
    (tmp_path / "checkpoints" / ".step_000300.tmp").mkdir()
    assert [p.name for p in ckpt.checkpoints(tmp_path)] == ["step_000100", "step_000020", "step_000005"]
    assert ckpt.checkpoints(tmp_path / "nothing") == []


def test_prune_keeps_the_newest_and_the_latest_target(tmp_path: Path) -> None:
    for s in (10, 20, 30, 40, 50):
        make_ckpt(tmp_path, s)
    ckpt.mark_latest(tmp_path, ckpt.checkpoint_dir(tmp_path, 20))
    ckpt.prune(tmp_path, keep=2)
    assert [p.name for p in ckpt.checkpoints(tmp_path)] == ["step_000050", "step_000040", "step_000020"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "LATEST",
        "step_000020",
        "step_000040",
        "step_000050",
    ]
    ckpt.prune(tmp_path, keep=0)
    assert [p.name for p in ckpt.checkpoints(tmp_path)] == ["step_000020"]
    assert ckpt.latest(tmp_path) == ckpt.checkpoint_dir(tmp_path, 20)


def test_atomic_dir_leaves_no_trace_when_the_body_raises(tmp_path: Path) -> None:
    target = tmp_path / "step_000001"
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "state.pt").write_bytes(b"half")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    make_ckpt(tmp_path, 1)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    with pytest.raises(RuntimeError):
        with atomic_dir(ckpt.checkpoint_dir(tmp_path, 1)) as tmp:
            (tmp / "meta.json").write_text("{}")
            raise RuntimeError("boom")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
    assert ckpt.verify(ckpt.checkpoint_dir(tmp_path, 1)) is None
