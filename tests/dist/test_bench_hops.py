"""Smoke test of the `hops` benchmark (bench_hops): 4 real processes on a ring, a few steps.

Checks only speed-independent facts: every figure is present, positive and consistent (medians
within their min–max, as many timed hops on both sides, a step of ours holds D hops of ours,
the exchange is part of the hop, bytes per edge and hop are those of one-record frames), and the
printer shows each configuration. Never a timing against a threshold.

Its workers (`python -m seedflood.bench.hops --worker ...`) are forked from the test process's
fork server like every launched test's processes (tests/forked.py: one OS process each, own
session, environment and output files), not fresh interpreters: ~2 s of CPU of imports each.
"""

from __future__ import annotations

import io
import subprocess
import types
from pathlib import Path
from typing import IO

import pytest

import forked
from seedflood.bench import hops as bench_hops
from seedflood.core.flood.transport import HEADER

pytestmark = pytest.mark.dist


def _popen(
    argv: list[str], *, env: dict[str, str], stdout: IO[str], stderr: IO[str], start_new_session: bool
) -> subprocess.Popen | forked.Forked:
    """subprocess.Popen as bench_hops calls it (outputs in files it opened), forked when forked.py
    can start the command."""
    if forked.command(argv) is None or not start_new_session:
        return subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr, start_new_session=start_new_session)
    return forked.spawn(argv, env=env, cwd=Path.cwd(), out=Path(stdout.name), err=Path(stderr.name))


def _sane(s: dict) -> None:
    assert 0 < s["min"] <= s["median"] <= s["max"] and s["n"] >= 1


@pytest.mark.timeout(1200)  # an outer bound; the benchmark bounds its own wait
def test_fig_hops_on_a_ring_of_4_gives_sane_figures(monkeypatch):
    monkeypatch.setattr(bench_hops, "QUICK_SIZES", (4,))
    monkeypatch.setattr(
        bench_hops, "subprocess", types.SimpleNamespace(Popen=_popen, TimeoutExpired=subprocess.TimeoutExpired)
    )
    fig = bench_hops.fig_hops(quick=True, steps=2, timeout_s=900)
    assert fig["quick"] and [(r["kind"], r["nodes"]) for r in fig["rows"]] == [("ring", 4)]
    r = fig["rows"][0]
    assert (r["diameter"], r["hops_per_step"], r["steps"]) == (2, 2, 2)
    for key in ("ours_hop_s", "bare_hop_s", "ours_exchange_s", "ours_step_s", "bare_step_s", "wall_step_s"):
        _sane(r[key])
    timed_hops = 4 * r["steps"] * r["hops_per_step"]  # every process, every timed hop, drain excluded
    assert r["ours_hop_s"]["n"] == r["bare_hop_s"]["n"] == r["ours_exchange_s"]["n"] == timed_hops
    assert r["ours_exchange_s"]["min"] <= r["ours_hop_s"]["max"]  # the exchange is inside the hop
    assert r["ours_step_s"]["min"] >= r["ours_hop_s"]["min"] * r["hops_per_step"]  # a step holds D hops
    assert r["hop_ratio"] == pytest.approx(r["ours_hop_s"]["median"] / r["bare_hop_s"]["median"])
    # A ring floods one new message per direction per hop: every frame holds one record, no more
    # than the bare side's one-record v2 frame (13-byte frame header + origin byte + f32 scalar).
    assert HEADER < r["bytes_per_edge_hop"] <= bench_hops.BARE_BYTES == HEADER + 13 + 5
    text = io.StringIO()
    bench_hops.print_hops(fig, text)
    assert "ring" in text.getvalue() and "hop bare" in text.getvalue()
