"""bench.audit runs at a tiny size and prints its figures; bad sizes are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from seedflood.bench import audit

REPO = Path(__file__).resolve().parents[3]


def test_the_audit_benchmark_prints_cost_and_latency(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert audit.main(["--clients", "3", "--steps", "4", "--rates", "1"]) == 0
    out = capsys.readouterr().out
    (row,) = [line.split() for line in out.splitlines() if line.lstrip().startswith("1 ")]
    # rate 1 on 3 clients, K = 1: each recomputes its 2 peers' scalars, 2 forwards each, every step
    assert row[1:3] == ["4.0", "4.0"]
    # the every-step liar lies first at step 0 and is caught at once: evidence at +0, never applied
    assert row[5:7] == ["0.0", "0.0"] and row[8] == "0.0"


@pytest.mark.parametrize(
    "args", [["--clients", "2"], ["--rates", "0"], ["--rates", "x"], ["--liar", "9"], ["--config", "nowhere.yaml"]]
)
def test_sizes_it_cannot_measure_are_refused(args, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert audit.main(args) == 2 and "error" in capsys.readouterr().out
