"""bench.signing runs at a tiny size and prints its figures; bad sizes are refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from seedflood.bench import signing

REPO = Path(__file__).resolve().parents[3]


def test_the_signing_benchmark_measures_both_runs_on_one_hash(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert signing.main(["--clients", "3", "--steps", "6", "--ops", "20"]) == 0
    out = capsys.readouterr().out
    assert "one hash for both runs: True" in out and "sign" in out and "verify" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("unsigned ", "signed "))}
    assert float(rows["signed"][1]) > float(rows["unsigned"][1]) + 64  # a message's signature at least


@pytest.mark.parametrize("args", [["--clients", "2"], ["--steps", "3"], ["--config", "nowhere.yaml"]])
def test_sizes_it_cannot_measure_are_refused(args, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert signing.main(args) == 2 and "error" in capsys.readouterr().out
    assert os.getcwd() == str(REPO)
