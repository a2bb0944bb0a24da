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


def _summary(costs, diameter=2, per_edge=40.0):
    return {"diameter": diameter, "bytes_per_edge_per_step": per_edge, "consensus": True, "cost": costs}


def test_a_launched_row_is_the_mean_over_clients_of_their_own_reports():
    costs = [
        {"run_cpu_s": 0.3, "forwards_s": 0.2, "held_peak": 4, "process_cpu_s": 9.0},
        {"run_cpu_s": 0.6, "forwards_s": 0.25, "held_peak": 6, "process_cpu_s": 9.0},
    ]
    r = scaling.launched_row("ring", 2, 3, _summary(costs))
    assert r["launched"] and (r["graph"], r["nodes"], r["diameter"], r["steps"]) == ("ring", 2, 2, 3)
    assert r["client_step_cpu_s"] == pytest.approx(0.15)  # (0.1 + 0.2) / 2: the run's CPU, not the process's
    assert r["client_step_cpu_max_s"] == pytest.approx(0.2)
    assert r["client_step_forwards_s"] == pytest.approx(0.075)
    assert r["client_step_rest_s"] == pytest.approx(0.075) and r["rest_share"] == pytest.approx(0.5)
    assert (r["bytes_per_edge_step"], r["held_per_client"]) == (40.0, 5)
    out = io.StringIO()
    scaling.print_scaling(
        {"steps": 3, "rows": [r | {"wall_s": 5.0, "load_before": [1, 2, 3], "load_after": [2, 2, 3]}]}, out
    )
    assert "launched" in out.getvalue() and "150.00 ms" in out.getvalue()


def test_a_launched_row_refuses_a_run_where_a_client_did_not_report():
    costs = [{"run_cpu_s": 0.3, "forwards_s": 0.2, "held_peak": 4}, None]
    with pytest.raises(ValueError, match="1 of 2 clients"):
        scaling.launched_row("ring", 2, 3, _summary(costs))
    with pytest.raises(ValueError, match="0 of 2 clients"):
        scaling.launched_row("ring", 2, 3, {"diameter": 1, "bytes_per_edge_per_step": 1.0})  # no cost: older runs


def test_a_shorter_runs_costs_are_subtracted_client_by_client():
    long = [
        {"run_cpu_s": 1.3, "forwards_s": 0.5, "held_peak": 4},
        {"run_cpu_s": 2.0, "forwards_s": 0.6, "held_peak": 4},
    ]
    short = [
        {"run_cpu_s": 0.3, "forwards_s": 0.1, "held_peak": 4},
        {"run_cpu_s": 1.5, "forwards_s": 0.2, "held_peak": 4},
    ]
    r = scaling.launched_row("ring", 2, 13, _summary(long), 3, _summary(short))
    assert (r["steps"], r["minus_steps"]) == (13, 3)
    assert r["client_step_cpu_s"] == pytest.approx((0.1 + 0.05) / 2)  # per client: (1.0, 0.5) over 10 steps
    assert r["client_step_cpu_max_s"] == pytest.approx(0.1)
    assert r["client_step_forwards_s"] == pytest.approx(0.04)
