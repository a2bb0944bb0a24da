"""Smoke test of `seedflood bench --quick`: every figure runs on the tiny model and writes sane JSON.

No timing thresholds (timings belong to the benchmark's output, not to assertions): only shapes,
invariants that do not depend on speed (equal bytes for two model sizes, replay == loaded state),
and that times are positive and finite.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from seedflood import bench


def _time_ok(s: dict) -> bool:
    return s["n"] >= 1 and 0 <= s["min"] <= s["median"] <= s["max"] and math.isfinite(s["max"])


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
    assert small["bytes_per_edge_per_run"] == large["bytes_per_edge_per_run"] == \
        small["bytes_per_edge_per_step"] * small["steps"]


def test_apply_measures_both_families(report):
    a = report["figures"]["apply"]
    assert [e["n"] for e in a["per_n"]] == [16, 64, 256, 1024]
    assert a["trainable"] > 0 and _time_ok(a["subcge_basis_s"])
    for e in a["per_n"]:
        assert _time_ok(e["subcge_s"]) and _time_ok(e["subcge_cpu_s"])
        if e["gaussian_s"] is None:  # skipped for the budget: no ratio either
            assert e["ratio"] is None
        else:
            assert _time_ok(e["gaussian_s"]) and e["ratio"] > 0
    assert a["per_n"][0]["gaussian_s"] is not None  # the tiny model fits the budget at n = 16


def test_step_efficiency(report):
    s = report["figures"]["step"]
    assert _time_ok(s["forward_s"])
    for fam in ("subcge", "gaussian"):
        f = s[fam]
        assert _time_ok(f["step_s"]) and _time_ok(f["apply_s"])
        assert 0 < f["efficiency"] < math.inf and 0 < f["efficiency_cpu"] < math.inf


def test_catchup_replay_matches_loaded_state(report):
    c = report["figures"]["catchup"]
    assert c["messages"] == c["steps"] * c["clients"]
    assert 0 < c["log_bytes"] < c["state_bytes"]
    assert [v["merge_every"] for v in c["variants"]] == [1, c["steps"]]
    for v in c["variants"]:
        assert v["hash_equal"] is True
        assert _time_ok(v["replay_s"]["total"]) and _time_ok(v["load_s"]["total"]) and v["ratio"] > 0


def test_hop_latency(report):
    h = report["figures"]["hop"]
    assert [s["nodes"] for s in h["sizes"]] == [4, 8]
    for s in h["sizes"]:
        assert s["diameter"] == s["nodes"] // 2 and s["hops"] == s["steps"] * s["diameter"]
        assert _time_ok(s["hop_s"]) and s["bytes_per_edge_per_step"] > 0


def test_only_and_separator(tmp_path, capsys):
    out = tmp_path / "hop.json"
    assert bench.main(["--", "--quick", "--only", "hop", "--json", str(out)]) == 0
    assert list(json.loads(out.read_text())["figures"]) == ["hop"]
    assert "== hop:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--only", "nonsense"])
