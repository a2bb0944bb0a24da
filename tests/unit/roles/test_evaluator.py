"""The evaluator in one process, fed the steps of an in-memory run, and the run directory it
writes: replay, check and resume against it, including every on-disk corruption we know of.

Each corruption must end in one line on stderr, exit status 2, and a run directory left exactly
as it was; a corrupt checkpoint is skipped with one warning line in favour of an older one.
"""

from __future__ import annotations

import json
import logging
import struct
import zlib
from pathlib import Path

import pytest
import torch

import runs
from seedflood import cli
from seedflood.core.config import runconfig as config
from seedflood.core.flood import protocol as proto
from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.stepstream import encode_step
from seedflood.core.flood.transport import EOS, Inbox
from seedflood.core.membership.roster import Change
from seedflood.core.topology.resolve import build
from seedflood.core.wire import message
from seedflood.core.wire.message import encode
from seedflood.core.zo.replay import state_hash
from seedflood.ml.workload import Workload
from seedflood.roles.evaluator import Evaluator, EvaluatorError, Settings, restore
from seedflood.roles.inprocess import simulate
from seedflood.rundir.logfile import LogReader
from seedflood.rundir.logheader import LOG_MAGIC, log_header

ROOT = Path(__file__).resolve().parents[3]
DEBUG = ROOT / "launch" / "configs" / "debug.yaml"
torch.set_num_threads(1)


def debug_cfg(out: Path, *extra: str) -> config.Config:
    return config.load(DEBUG, [f"run.out_dir={out}", "run.steps=6", "checkpoint.every=2", "eval.every=3", *extra])


def evaluate(cfg: config.Config, records, start: int = 0, changes=None) -> tuple[Evaluator, dict]:
    """`changes` (step -> Change): the steps are streamed with them, as a churn run's attach client does."""
    w = Workload.build(cfg)
    p = Protocol.of(cfg, build(cfg.topology).diameter)
    start = restore(w, p, Path(cfg.run.out_dir), records[:start])
    header = log_header(cfg, proto.trajectory(cfg, p, w.train_digest()), w.loaded.identity, w.loaded.base_hash)
    inbox = Inbox("test")
    for s, msgs in records[start:]:
        inbox.put(encode(msgs) if changes is None else encode_step(msgs, changes.get(s)))
    inbox.put(EOS)
    ev = Evaluator(Settings.of(cfg), p, w, inbox, header, start_step=start, progress=False)
    try:
        return ev, ev.run()
    finally:
        ev.close()


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, str, list]:
    """A finished 6-step run directory written by the evaluator, its final hash, the steps."""
    out = tmp_path_factory.mktemp("eval") / "run"
    cfg = debug_cfg(out)
    sim = simulate(cfg, hash_every_step=False)
    (want,) = set(sim.hashes.values())
    _, final = evaluate(cfg, sim.records)
    assert final["param_hash"] == want
    return out, want, sim.records


@pytest.fixture
def run_dir(finished, tmp_path) -> Path:
    """A private copy of the finished run directory (tests corrupt it)."""
    return runs.copy_run_dir(finished[0], tmp_path / "run")


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def one_line_exit_2(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("seedflood: error: "), lines
    return lines[0]


# -- what the evaluator writes ----------------------------------------------------------------------
def test_run_directory_layout(finished):
    out, want, records = finished
    assert (out / "config.yaml").is_file() and (out / "summary.json").exists() is False  # summary is train's
    names = sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_dir())
    assert names == ["step_000004", "step_000006"], "the newest two checkpoints are kept"
    meta = json.loads((out / "checkpoints" / "step_000006" / "meta.json").read_text())
    assert meta["param_hash"] == want and len(meta["state_sha256"]) == 64
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 3, 6]
    header, logged = LogReader(out / "log.bin").read()
    assert logged == records and header["trajectory"]["zo.lr"] == 1.0


def test_a_gap_in_the_stream_is_refused(tmp_path, finished):
    cfg = debug_cfg(tmp_path / "gap")
    records = finished[2]
    with pytest.raises(EvaluatorError, match="bad frame for step 2"):
        evaluate(cfg, records[:2] + records[3:])


def test_replay_and_check_accept_the_intact_directory(run_dir, finished, capsys):
    assert cli.main(["replay", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"steps": 6, "param_hash": finished[1]}
    assert cli.main(["check", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoints"] == ["step_000006", "step_000004"]


# -- corruption ---------------------------------------------------------------------------------------
def test_edited_config_yaml_is_refused_by_replay(run_dir, capsys):
    path = run_dir / "config.yaml"
    path.write_text(path.read_text().replace("lr: 1.0", "lr: 5.0"))
    before = snapshot(run_dir)
    line = one_line_exit_2(capsys, ["replay", str(run_dir)])
    assert "zo.lr (1.0 -> 5.0)" in line
    assert snapshot(run_dir) == before


@pytest.mark.parametrize("where", ['"config": {', '"trajectory": {'], ids=["config-snapshot", "fingerprint"])
def test_a_bit_flip_in_the_log_header_is_reported_as_log_bin_not_config_yaml(run_dir, capsys, where):
    """The header has its own CRC: a flip in its config snapshot (which nothing compares) or in its
    trajectory fingerprint (which config.yaml is compared with) names log.bin's header."""
    log = run_dir / "log.bin"
    data = bytearray(log.read_bytes())
    data[data.index(where.encode()) + len(where) + 1] ^= 0x01  # a letter of the first key: still valid JSON
    log.write_bytes(bytes(data))
    before = snapshot(run_dir)
    for cmd in ("check", "replay"):
        line = one_line_exit_2(capsys, [cmd, str(run_dir)])
        assert f"{log}: the log header is corrupt (checksum mismatch)" in line and "config.yaml" not in line, line
    assert snapshot(run_dir) == before


def record_offsets(path: Path) -> list[tuple[int, int]]:
    """(offset, step) of each record in a log."""
    data = path.read_bytes()
    (n,) = struct.unpack_from("<I", data, len(LOG_MAGIC))
    off, out = len(LOG_MAGIC) + 4 + n + 4, []  # magic, u32 n, JSON header, u32 header CRC
    while off < len(data):
        step, length = struct.unpack_from("<II", data, off)
        out.append((off, step))
        off += 8 + length
    return out


def test_a_bit_flip_in_a_middle_record_is_named_not_truncated(run_dir, capsys):
    log = run_dir / "log.bin"
    off, step = record_offsets(log)[2]
    data = bytearray(log.read_bytes())
    data[off + 8 + 16 + 13] ^= 0x04  # inside the first message's scalar
    log.write_bytes(bytes(data))
    before = snapshot(run_dir)
    for cmd in ("replay", "check"):
        line = one_line_exit_2(capsys, [cmd, str(run_dir)])
        assert f"offset {off}" in line and f"step {step}" in line, line
    assert snapshot(run_dir) == before


def test_a_nan_record_with_a_valid_crc_is_refused(run_dir, capsys):
    log = run_dir / "log.bin"
    off, step = record_offsets(log)[3]
    data = bytearray(log.read_bytes())
    frame = off + 8
    head = message.read_head(bytes(data[frame:]))  # a v2 frame: CRC over header (after magic) + records
    body, crc_at = frame + head.layout.header_size, frame + head.layout.header_size - 4
    struct.pack_into("<f", data, body + head.layout.record_size - 4, float("nan"))  # first record's scalar
    end = body + head.count * head.layout.record_size
    struct.pack_into("<I", data, crc_at, zlib.crc32(bytes(data[frame + 2 : crc_at]) + bytes(data[body:end])))
    log.write_bytes(bytes(data))
    before = snapshot(run_dir)
    line = one_line_exit_2(capsys, ["replay", str(run_dir)])
    assert f"step {step}" in line and "not finite" in line
    assert snapshot(run_dir) == before


def flip_tensor_bit(state: Path) -> None:
    """Flip one bit inside the tensor data of a torch.save file (not its zip metadata)."""
    data = bytearray(state.read_bytes())
    at = data.find(b"data/0") + 200  # the first tensor's bytes start after the zip entry header
    data[at] ^= 0x10
    state.write_bytes(bytes(data))


def test_a_checkpoint_bit_flip_falls_back_to_the_previous_checkpoint(run_dir, finished, capsys, caplog):
    flip_tensor_bit(run_dir / "checkpoints" / "step_000006" / "state.pt")
    before = snapshot(run_dir)
    line = one_line_exit_2(capsys, ["check", str(run_dir)])
    assert "step_000006" in line and "state.pt" in line
    cfg = debug_cfg(run_dir)
    w = Workload.build(cfg)
    p = Protocol.of(cfg, build(cfg.topology).diameter)
    with caplog.at_level(logging.INFO, logger="seedflood"):
        assert restore(w, p, run_dir, finished[2]) == 6
    assert state_hash(w.model, w.direction) == finished[1]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "step_000006" in warnings[0]
    assert any("restored checkpoint step_000004" in r.getMessage() for r in caplog.records)
    assert snapshot(run_dir) == before


def test_resume_from_the_middle_equals_the_whole_run(tmp_path, finished):
    out = tmp_path / "partial"
    cfg = debug_cfg(out)
    records = finished[2]
    evaluate(debug_cfg(out, "run.steps=3"), records[:3])  # stops after 3 steps (checkpoint at 2 and 3)
    _, final = evaluate(cfg, records, start=3)
    assert final["param_hash"] == finished[1]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps.count(3) == 1


def test_the_roster_size_and_each_join_and_leave_are_metrics(tmp_path, finished):
    """A churn run's stream in which node 3 leaves at step 2 and comes back at step 4: a metrics
    line per change at its step (members after it, joins, leaves: TensorBoard's roster/*), the
    roster's size on every score; cut after logging step 4 (its change's line written) and
    resumed from the checkpoint after step 4, each change is still one line."""
    changes = {2: Change(2, leave=(3,)), 4: Change(4, join=((3, 2),))}
    records = [(s, [m for m in msgs if m.origin != 3 or s not in (2, 3)]) for s, msgs in finished[2]]
    out = tmp_path / "churn"
    evaluate(debug_cfg(out, "churn.settle=1"), records, changes=changes)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    events = [r for r in lines if r.get("event") == "membership"]
    assert [(r["step"], r["members"], r["joins"], r["leaves"]) for r in events] == [(2, 3, 0, 1), (4, 4, 1, 0)]
    assert events[1]["change"] == "step 4: join 3 (incarnation 2)"
    assert [(r["step"], r["members"]) for r in lines if "event" not in r] == [(0, 4), (3, 3), (6, 4)]
    resumed = tmp_path / "resumed"
    with pytest.raises(EvaluatorError, match="stream ended after step 4"):
        evaluate(debug_cfg(resumed, "churn.settle=1"), records[:5], changes=changes)
    evaluate(debug_cfg(resumed, "churn.settle=1"), records, start=4, changes=changes)
    again = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in again if "event" in r] == events


# -- the preflight ------------------------------------------------------------------------------------
def world_size(run_dir: Path, *sets: str) -> list[str]:
    """argv of the preflight on the debug config in `run_dir` with `--set` overrides."""
    return [
        "world-size",
        "--config",
        str(DEBUG),
        "--set",
        f"run.out_dir={run_dir}",
        *(a for s in sets for a in ("--set", s)),
    ]


def test_world_size_refuses_changed_settings_for_an_existing_run(run_dir, capsys):
    before = snapshot(run_dir)
    line = one_line_exit_2(capsys, world_size(run_dir, "run.steps=6", "zo.eps=0.05"))
    assert "zo.eps (0.001 -> 0.05)" in line
    assert snapshot(run_dir) == before
    # settings that do not change the bits may change: a longer constant-lr run, eval cadence
    assert cli.main(world_size(run_dir, "run.steps=8", "eval.every=1")) == 0
    assert capsys.readouterr().out.strip() == "5"


def test_replay_out_to_an_unwritable_place_is_one_line(run_dir, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    line = one_line_exit_2(capsys, ["replay", str(run_dir), "--out", str(blocker / "model")])
    assert str(blocker) in line


def test_rescoring_a_finished_run_keeps_one_history(tmp_path, finished):
    out = tmp_path / "again"
    cfg = debug_cfg(out)
    evaluate(cfg, finished[2])
    evaluate(cfg, finished[2], start=6)  # a relaunch of a finished run only re-scores it
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 3, 6]


def test_progress_follows_the_clients_not_the_scoring(tmp_path, finished):
    """Frames that arrive while the evaluator is busy move the bar at once (bug: it advanced with
    the evaluator's processing, so rate and ETA were wrong while it lagged)."""
    cfg = debug_cfg(tmp_path / "progress")
    w = Workload.build(cfg)
    p = Protocol.of(cfg, build(cfg.topology).diameter)
    header = log_header(cfg, proto.trajectory(cfg, p, w.train_digest()), w.loaded.identity, w.loaded.base_hash)
    inbox = Inbox("test")
    ev = Evaluator(Settings.of(cfg), p, w, inbox, header, progress=True)
    try:
        for _, msgs in finished[2][:4]:
            inbox.put(encode(msgs))
        assert ev.progress.bar.n == 4 and ev.next_step == 0  # nothing processed yet
    finally:
        ev.close()
