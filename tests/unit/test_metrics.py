"""metrics.py: truncate_metrics keeps one history when a run resumes from an earlier step."""

from __future__ import annotations

import json
from pathlib import Path

from seedflood.metrics import MetricsWriter, read_metrics, truncate_metrics


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
