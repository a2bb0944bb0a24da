"""Smoke test of `seedflood bench --quick`: every figure runs on the tiny model and writes sane JSON.

No timing thresholds (timings belong to the benchmark's output, not to assertions): only shapes,
invariants that do not depend on speed and that a wrong figure would break — byte counts equal to
the wire format's analytic sizes (a frame is a 16-byte header + 24 bytes per message, sent after
an 8-byte length), replay == loaded state, every ratio equal to the quotient of the two measured
times it reports, a part never longer than the whole it was timed inside — and that times are
positive and finite.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from seedflood import bench

# The wire (message.py, transport.py): per directed edge and hop one frame of FRAME_HEADER bytes +
# RECORD bytes per message, preceded by a LENGTH-byte length; counters include the length.
LENGTH, FRAME_HEADER, RECORD = 8, 16, 24


def ring_bytes_per_edge_per_step(n: int) -> int:
    """A ring of n (even) nodes floods in D = n/2 hops, one frame per directed edge per hop; each
    message crosses n directed edges (D each way, the antipode gets it from both sides), so a
    directed edge carries n·n / 2n = n/2 messages per step."""
    hops = n // 2
    return hops * (LENGTH + FRAME_HEADER) + RECORD * (n // 2)


def _time_ok(s: dict) -> bool:
    return s["n"] >= 1 and 0 <= s["min"] <= s["median"] <= s["max"] and math.isfinite(s["max"])


def _wall_ok(s: dict) -> bool:
    """A wall-clock stat of real work: strictly positive (perf_counter resolves nanoseconds)."""
    return _time_ok(s) and s["min"] > 0


def _quotient(a: dict | None, b: dict | None) -> float | None:
    """What a reported ratio must be: median of a / median of b."""
    return None if a is None or b is None else a["median"] / b["median"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    threads = torch.get_num_threads()
    rc = bench.main(["--quick", "--repeats", "1", "--gaussian-budget", "5", "--json", str(out)])
    assert rc == 0
    assert torch.get_num_threads() == threads, "bench must restore torch's thread count"
    return json.loads(out.read_text())


def test_report_has_every_figure(report):
    assert report["meta"]["figures"] == list(bench.FIGURES)
    assert report["meta"]["quick"] is True and report["meta"]["model"] == "tiny"
    assert set(report["figures"]) == set(bench.FIGURES)


def test_bytes_equal_for_two_model_sizes(report):
    b = report["figures"]["bytes"]
    small, large = b["sizes"]
    assert b["equal"] is True
    assert large["params"] > small["params"] and b["param_ratio"] > 1
    for s in (small, large):
        assert s["consensus"] is True
        assert s["directed_edges"] == 8  # ring of 4, both directions
        assert s["bytes_per_edge_per_step_min"] == s["bytes_per_edge_per_step_max"] > 0
    assert (
        small["bytes_per_edge_per_run"]
        == large["bytes_per_edge_per_run"]
        == small["bytes_per_edge_per_step"] * small["steps"]
    )
    # The analytic figure: 2 hops x (8 + 16) + 2 messages x 24 = 96 bytes (README: "96 bytes per
    # edge per step with 4 clients"), and the total over 8 directed edges and every step.
    assert ring_bytes_per_edge_per_step(4) == 96
    for s in (small, large):
        assert s["bytes_per_edge_per_step"] == s["bytes_per_edge_per_step_min"] == 96
        assert s["bytes_total"] == 96 * s["directed_edges"] * s["steps"]
    assert b["bytes_ratio"] == 1.0 and b["trainable_ratio"] > 1


def test_apply_measures_both_families(report):
    a = report["figures"]["apply"]
    assert [e["n"] for e in a["per_n"]] == [16, 64, 256, 1024]
    assert a["trainable"] > 0 and _time_ok(a["subcge_basis_s"])
    for e in a["per_n"]:
        assert _wall_ok(e["subcge_s"]) and _time_ok(e["subcge_cpu_s"]) and _time_ok(e["subcge_merge_s"])
        # The merge is timed inside each apply: per run merge <= apply, so also for every order
        # statistic (min, median, max) of the runs.
        for key in ("min", "median", "max"):
            assert e["subcge_merge_s"][key] <= e["subcge_s"][key]
        if e["gaussian_s"] is None:  # skipped for the budget: no ratio either
            assert e["ratio"] is None and e["ratio_cpu"] is None
        else:
            assert _wall_ok(e["gaussian_s"]) and _time_ok(e["gaussian_cpu_s"])
            assert e["ratio"] == pytest.approx(_quotient(e["gaussian_s"], e["subcge_s"]), rel=1e-12)
            assert e["ratio_cpu"] == pytest.approx(_quotient(e["gaussian_cpu_s"], e["subcge_cpu_s"]), rel=1e-12)
    assert 0 <= a["gaussian_spent_s"] <= a["gaussian_budget_s"]
    assert a["per_n"][0]["gaussian_s"] is not None  # the tiny model fits the budget at n = 16


def test_step_efficiency(report):
    s = report["figures"]["step"]
    assert _time_ok(s["forward_s"])
    assert _wall_ok(s["forward_s"])
    for fam in ("subcge", "gaussian"):
        f = s[fam]
        assert _wall_ok(f["step_s"]) and _wall_ok(f["apply_s"]) and _wall_ok(f["perturbed_forward_s"])
        assert f["step_s"]["n"] == f["apply_s"]["n"] == s["rounds"]
        # efficiency = 2 x plain forward / step, from the reported medians (wall and CPU) and minima.
        assert f["efficiency"] == pytest.approx(2 * s["forward_s"]["median"] / f["step_s"]["median"], rel=1e-12)
        assert f["efficiency_cpu"] == pytest.approx(
            2 * s["forward_cpu_s"]["median"] / f["step_cpu_s"]["median"], rel=1e-12
        )
        assert f["efficiency_best"] == pytest.approx(2 * s["forward_s"]["min"] / f["step_s"]["min"], rel=1e-12)
        # Both perturbed forwards and the apply are timed inside the step: the rest is >= 0 in
        # every round (float rounding of perf_counter differences aside), and apply <= step.
        assert f["other_s"]["min"] >= -1e-9
        for key in ("min", "median", "max"):
            assert f["apply_s"][key] <= f["step_s"][key]
        paired = f["efficiency_paired"]
        assert paired["n"] == s["rounds"] and 0 < paired["min"] <= paired["max"] < math.inf


def test_catchup_replay_matches_loaded_state(report):
    c = report["figures"]["catchup"]
    assert c["messages"] == c["steps"] * c["clients"]
    assert 0 < c["log_bytes"] < c["state_bytes"]
    # The log holds its magic line + u32 + JSON header, then per step an 8-byte (step, length)
    # record header and a frame of 16 + 24·clients bytes.
    records = c["steps"] * (8 + FRAME_HEADER + RECORD * c["clients"])
    header = c["log_bytes"] - len(b"SEEDFLOOD-LOG 1\n") - 4 - records
    assert 2 <= header < 65536, header  # at least "{}"
    assert c["size_ratio"] == pytest.approx(c["state_bytes"] / c["log_bytes"], rel=1e-12)
    assert [v["merge_every"] for v in c["variants"]] == [1, c["steps"]]
    for v in c["variants"]:
        assert v["hash_equal"] is True
        assert _wall_ok(v["replay_s"]["total"]) and _wall_ok(v["load_s"]["total"])
        assert v["ratio"] == pytest.approx(_quotient(v["replay_s"]["total"], v["load_s"]["total"]), rel=1e-12)
        assert v["ratio_cpu"] == pytest.approx(_quotient(v["replay_s"]["cpu"], v["load_s"]["cpu"]), rel=1e-12)
        # Read, basis and apply are consecutive parts of each timed replay: per run they add up to
        # its total, so the sum of their minima cannot exceed the longest total.
        parts = [v["replay_s"][k] for k in ("read", "basis", "apply")]
        assert sum(p["min"] for p in parts) <= v["replay_s"]["total"]["max"] + 1e-9
        if v["replay_s"]["total"]["n"] == 1:  # one run: the parts are exactly that run's
            assert sum(p["median"] for p in parts) == pytest.approx(v["replay_s"]["total"]["median"], abs=1e-9)


def test_hop_latency(report):
    h = report["figures"]["hop"]
    assert [s["nodes"] for s in h["sizes"]] == [4, 8]
    for s in h["sizes"]:
        assert s["diameter"] == s["nodes"] // 2 and s["hops"] == s["steps"] * s["diameter"]
        assert _wall_ok(s["hop_s"]) and _wall_ok(s["step_s"]) and s["wall_per_hop_s"] > 0
        assert s["hop_s"]["n"] == s["hops"] * s["nodes"]  # every node times every hop
        # n/2 hops of one (8 + 16)-byte frame each, plus n/2 messages of 24 bytes: 24·n.
        assert s["bytes_per_edge_per_step"] == ring_bytes_per_edge_per_step(s["nodes"]) == 24 * s["nodes"]


def test_only_and_separator(tmp_path, capsys):
    out = tmp_path / "hop.json"
    assert bench.main(["--", "--quick", "--only", "hop", "--json", str(out)]) == 0
    assert list(json.loads(out.read_text())["figures"]) == ["hop"]
    assert "== hop:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--only", "nonsense"])
