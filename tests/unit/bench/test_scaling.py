"""Smoke test of the `scaling` benchmark (bench/scaling.py): one small torus, one step."""

import io

import pytest

from seedflood.bench import scaling


def test_scaling_splits_a_simulated_step_and_counts_its_flood():
    fig = scaling.fig_scaling([4], ["torus"], steps=1, budget_s=1e9)
    (r,) = fig["rows"]
    assert (r["graph"], r["nodes"], r["steps"]) == ("torus", 4, 1)
    assert 0 < r["forwards_s"] < r["cpu_s"]
    assert r["client_step_cpu_s"] == pytest.approx(r["client_step_forwards_s"] + r["client_step_rest_s"])
    assert 0 < r["rest_share"] < 1
    # a 2×2 torus is a 4-ring: 4 messages of one step, each held by every client after the hops
    assert r["held_per_client"] == 4
    assert r["bytes_per_edge_step"] > 4
    out = io.StringIO()
    scaling.print_scaling(fig, out)
    assert "torus" in out.getvalue() and "rest share" in out.getvalue()


def test_a_configuration_past_its_budget_is_skipped_not_extrapolated():
    (r,) = scaling.fig_scaling([4], ["torus"], steps=1000, budget_s=1e-9)["rows"]
    assert r["skipped"].startswith("projected")
