"""metrics.py: truncate_metrics keeps one history when a run resumes from an earlier step; the
TensorBoard sink gets every scalar of every record and changes nothing in metrics.jsonl; a long
phase (scoring) shows its progress, as a bar on a terminal and as sparse lines in a log."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from seedflood.rundir.metrics import (
    MetricsWriter,
    PhaseProgress,
    export_tensorboard,
    read_metrics,
    truncate_metrics,
)


def test_truncate_metrics_keeps_whole_lines_up_to_the_step(tmp_path: Path) -> None:
    p = tmp_path / "metrics.jsonl"
    w = MetricsWriter(p)
    for s in (0, 10, 20, 30, 40):
        w.write({"step": s, "accuracy": s / 100})
    w.close()
    with open(p, "a") as f:
        # a stepless line, an unparseable line, and a last line torn just before its newline
        f.write('{"note": "no step"}\n{"step": 6, "acc\n{"step": 5}')
    kept = p.read_text().splitlines(keepends=True)[:3]

    truncate_metrics(p, 20)
    assert p.read_text() == "".join(kept)  # byte for byte, whole lines only
    assert [r["step"] for r in read_metrics(p)] == [0, 10, 20]
    assert [x.name for x in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temp file left

    truncate_metrics(p, -1)
    assert p.read_text() == ""
    truncate_metrics(tmp_path / "absent.jsonl", 3)  # no file: nothing to do
    assert not (tmp_path / "absent.jsonl").exists()


def test_truncate_then_resume_appends_one_history(tmp_path: Path) -> None:
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps({"step": s}) + "\n" for s in (0, 10, 20)))
    truncate_metrics(p, 10)
    w = MetricsWriter(p)
    w.write({"step": 20})
    w.close()
    assert [r["step"] for r in read_metrics(p)] == [0, 10, 20]


def test_a_resume_writes_the_membership_events_of_the_steps_it_takes_again(tmp_path: Path) -> None:
    """Resumed at step 20 (steps 20.. are taken again): the score at 20 stays, the event of step
    20 goes (it comes again), the event of step 19 stays."""
    p = tmp_path / "metrics.jsonl"
    lines = [{"step": 10}, {"step": 19, "event": "membership"}, {"step": 20}, {"step": 20, "event": "membership"}]
    p.write_text("".join(json.dumps(r) + "\n" for r in lines))
    truncate_metrics(p, 20, events_before=20)
    assert read_metrics(p) == lines[:3]


def test_the_roster_fields_are_scalars_under_roster(tmp_path: Path) -> None:
    w = MetricsWriter(tmp_path / "metrics.jsonl", tensorboard=tmp_path / "tb")
    w.write({"step": 0, "accuracy": 0.5, "members": 4})
    w.write({"step": 2, "event": "membership", "members": 3, "joins": 0, "leaves": 1, "change": "step 2: leave 3"})
    w.close()
    assert read_events(tmp_path / "tb") == {
        "accuracy": [(0, 0.5)],
        "roster/members": [(0, 4.0), (2, 3.0)],
        "roster/joins": [(2, 0.0)],
        "roster/leaves": [(2, 1.0)],
    }


# -- the TensorBoard sink ---------------------------------------------------------------------------
def read_events(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Scalars per tag from every event file in `log_dir`, read as TensorBoard does: files in name
    order, records framed and CRC-checked (TFRecord), and a SessionLog START at step s hides the
    scalars read so far at steps >= s (a resumed run's purge)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event, SessionLog
    from tensorboardX.record_writer import masked_crc32c

    out: dict[str, list[tuple[int, float]]] = {}
    files = sorted(p for p in log_dir.iterdir() if p.name.startswith("events.out.tfevents."))
    assert files, f"no event files in {log_dir}"
    for path in files:
        data, at = path.read_bytes(), 0
        while at < len(data):
            header = data[at : at + 8]
            (n,) = struct.unpack("<Q", header)
            assert struct.unpack("<I", data[at + 8 : at + 12])[0] == masked_crc32c(header)
            body = data[at + 12 : at + 12 + n]
            assert struct.unpack("<I", data[at + 12 + n : at + 16 + n])[0] == masked_crc32c(body)
            at += 16 + n
            event = Event.FromString(body)
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                out = {tag: [(s, v) for s, v in pts if s < event.step] for tag, pts in out.items()}
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


RECORDS = [
    {"step": 0, "accuracy": 0.5, "loss": 0.75, "auc": None, "threshold_accuracy": 0.625, "zero_shot": True},
    {"step": 10, "accuracy": 0.625, "loss": 0.5, "auc": 0.75, "threshold_accuracy": 0.5, "bytes_per_edge": 4096},
    {"step": 20, "accuracy": 0.75, "loss": float("nan"), "auc": 0.875, "consensus_distance": 0.25,
     "worst_accuracy": 0.5, "final": True, "param_hash": "ab" * 32, "elapsed_seconds": 3.5},
    {"note": "no step: not a point"},
]  # fmt: skip


def test_tensorboard_gets_every_scalar_against_its_step(tmp_path: Path) -> None:
    w = MetricsWriter(tmp_path / "metrics.jsonl", tensorboard=tmp_path / "tb")
    for r in RECORDS:
        w.write(r)
    w.close()
    assert read_events(tmp_path / "tb") == {
        "accuracy": [(0, 0.5), (10, 0.625), (20, 0.75)],
        "loss": [(0, 0.75), (10, 0.5)],  # NaN (null in the jsonl) is no point
        "auc": [(10, 0.75), (20, 0.875)],  # None is no point
        "threshold_accuracy": [(0, 0.625), (10, 0.5)],
        "bytes_per_edge": [(10, 4096.0)],
        "consensus_distance": [(20, 0.25)],
        "worst_accuracy": [(20, 0.5)],
    }  # and no tag for zero_shot, final, param_hash, elapsed_seconds


def test_the_jsonl_is_the_same_bytes_with_or_without_tensorboard(tmp_path: Path) -> None:
    for name, tb in (("plain", None), ("with-tb", tmp_path / "with-tb" / "tb")):
        w = MetricsWriter(tmp_path / name / "metrics.jsonl", tensorboard=tb)
        for r in RECORDS:
            w.write(r)
        w.close()
    assert (tmp_path / "with-tb" / "tb").is_dir()
    assert (tmp_path / "plain" / "metrics.jsonl").read_bytes() == (tmp_path / "with-tb" / "metrics.jsonl").read_bytes()
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == ["metrics.jsonl"]  # no sink unless asked


def test_a_resume_shows_one_history_in_tensorboard_too(tmp_path: Path) -> None:
    p, tb = tmp_path / "metrics.jsonl", tmp_path / "tb"
    w = MetricsWriter(p, tensorboard=tb)
    for s in (0, 10, 20, 30):
        w.write({"step": s, "accuracy": s / 100})
    w.close()
    truncate_metrics(p, 10)  # what the evaluator does when it resumes after step 10 ...
    w = MetricsWriter(p, tensorboard=tb)  # ... in the same second: the first file must survive
    for s in (20, 30):
        w.write({"step": s, "accuracy": 0.5 + s / 100})
    w.close()
    assert len(list(tb.iterdir())) == 2
    history = [(r["step"], r["accuracy"]) for r in read_metrics(p)]
    assert history == [(0, 0.0), (10, 0.1), (20, 0.7), (30, 0.8)]
    assert read_events(tb) == {"accuracy": [(s, pytest.approx(a)) for s, a in history]}


def test_tensorboard_export_of_a_finished_run(tmp_path: Path) -> None:
    assert export_tensorboard(RECORDS, tmp_path / "tb") == 3  # the stepless record is no event
    assert read_events(tmp_path / "tb")["accuracy"] == [(0, 0.5), (10, 0.625), (20, 0.75)]


def test_without_tensorboardx_the_jsonl_is_still_written(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.setitem(sys.modules, "tensorboardX.event_file_writer", None)  # import fails
    w = MetricsWriter(tmp_path / "metrics.jsonl", tensorboard=tmp_path / "tb")
    w.write(RECORDS[0])
    w.close()
    assert "pip install tensorboardX" in caplog.text
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0]
    assert not (tmp_path / "tb").exists()


def test_tensorboards_own_reader_finds_the_scalars(tmp_path: Path) -> None:
    """The same files through TensorBoard's EventAccumulator (runs where `tensorboard` is installed)."""
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    w = MetricsWriter(tmp_path / "metrics.jsonl", tensorboard=tmp_path / "tb")
    for r in RECORDS:
        w.write(r)
    w.close()
    acc = accumulator.EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {
        "accuracy", "loss", "auc", "threshold_accuracy", "bytes_per_edge", "consensus_distance", "worst_accuracy"
    }  # fmt: skip
    assert [(e.step, e.value) for e in acc.Scalars("accuracy")] == [(0, 0.5), (10, 0.625), (20, 0.75)]


# -- PhaseProgress: a long scoring shows it is alive --------------------------------------------------
class Clock:
    """A settable monotonic clock (seconds)."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_phase_prints_a_line_at_most_every_interval() -> None:
    clock, out = Clock(), io.StringIO()
    with PhaseProgress("scoring step 0", stream=out, every_s=15, clock=clock) as p:
        for done in range(10, 101, 10):  # one batch of 10 every 4 s: 40 s in all
            clock.t += 4
            p.update(done, 100)
    assert out.getvalue().splitlines() == [
        "scoring step 0: 40/100 examples (40%), 16 s, about 24 s left",
        "scoring step 0: 80/100 examples (80%), 32 s, about 8 s left",
        "scoring step 0: done, 100/100 examples in 40 s",
    ]


def test_a_short_phase_prints_nothing_and_a_disabled_one_never() -> None:
    clock, out = Clock(), io.StringIO()
    with PhaseProgress("scoring step 3", stream=out, every_s=15, clock=clock) as p:
        clock.t += 14
        p.update(100, 100)
    with PhaseProgress("scoring step 3", stream=out, every_s=0, clock=clock, enabled=False) as p:
        clock.t += 60
        p.update(50, 100)
    assert out.getvalue() == ""


def test_a_phase_cut_short_says_where_it_stopped() -> None:
    clock, out = Clock(), io.StringIO()
    with pytest.raises(KeyboardInterrupt), PhaseProgress("eval", stream=out, every_s=1, clock=clock) as p:
        clock.t += 2
        p.update(30, 100)
        raise KeyboardInterrupt
    assert out.getvalue().splitlines()[-1] == "eval: stopped, 30/100 examples in 2 s"


def test_on_a_terminal_a_phase_is_a_bar_that_is_removed_at_the_end() -> None:
    out = Tty()
    with PhaseProgress("scoring step 6", stream=out, delay_s=0) as p:
        p.update(64, 128)
        p.bar.refresh()
        assert "scoring step 6:  50%" in out.getvalue() and "64/128" in out.getvalue()
    assert p.bar is None
    text = out.getvalue()
    assert text.endswith("\r") and text.split("\r")[-2].strip() == ""  # the line blanked (leave=False)
    assert "\n" not in out.getvalue()  # a bar, not log lines


def test_scoring_reports_dev_and_test_as_one_count() -> None:
    """Workload.score_splits: after each batch, examples scored so far out of dev + test."""
    from seedflood.core.config import runconfig as config
    from seedflood.ml.workload import Workload

    root = Path(__file__).resolve().parents[3]
    cfg = config.load(root / "launch" / "configs" / "debug.yaml", ["task.dev_examples=40", "eval.batch_size=16"])
    w = Workload.build(cfg)
    seen: list[tuple[int, int]] = []
    dev, test = w.score_splits(on_examples=lambda done, total: seen.append((done, total)))
    assert seen == [(16, 104), (32, 104), (40, 104), (56, 104), (72, 104), (88, 104), (104, 104)]
    assert dev is not None and dev["metrics"]["n"] == 40 and test["metrics"]["n"] == 64
    assert w.scores() == w.scores(on_examples=lambda *_: None)  # the callback changes no score
