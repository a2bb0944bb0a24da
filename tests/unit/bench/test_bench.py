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

from seedflood.bench import cli as bench
from seedflood.core.flood import transport

# The wire (message.py v2, transport.py): per directed edge and hop one frame, preceded by a
# LENGTH-byte length (counters include it). A frame of one step with K = 1 and under 256 messages
# has a FRAME_HEADER-byte header (magic 2, version, layout, 1-byte count, u32 base step, u32 crc)
# and per message an origin byte (none when every origin in the frame is 0) and the f32 scalar.
LENGTH, FRAME_HEADER, SCALAR = transport.HEADER, 13, 4


def ring_bytes_per_edge_per_step(n: int) -> float:
    """A ring of n (even) nodes floods in n/2 hops, each a one-message frame per directed edge;
    each message crosses n directed edges, so the origin bytes of the n − 1 messages with an origin
    other than 0 add n(n − 1) bytes over the 2n edges."""
    return n // 2 * (LENGTH + FRAME_HEADER + SCALAR) + (n - 1) / 2


def ring4_bytes_per_step() -> int:
    """A ring of 4 floods in 2 hops; each message crosses 4 directed edges (one each way, then
    both neighbours into the antipode), always alone in its frame: 16 frames per step."""
    frames = 16 * (LENGTH + FRAME_HEADER + SCALAR)
    origin_bytes = sum(4 * (1 if origin else 0) for origin in range(4))
    return frames + origin_bytes


def _time_ok(s: dict) -> bool:
    return s["n"] >= 1 and 0 <= s["min"] <= s["median"] <= s["max"] and math.isfinite(s["max"])


def _wall_ok(s: dict) -> bool:
    """A wall-clock stat of real work: strictly positive (perf_counter resolves nanoseconds)."""
    return _time_ok(s) and s["min"] > 0


def _quotient(a: dict | None, b: dict | None) -> float | None:
    """What a reported ratio must be: median of a / median of b."""
    return None if a is None or b is None else a["median"] / b["median"]


# Figures that start real gloo processes run in their own tests (test_bench_hops.py,
# tests/e2e/test_overlap_netns.py), as does goodput, whose churn runs take minutes
# (test_bench_goodput.py), and load, which starts a fresh interpreter per load (test_bench_load.py);
# the shared fixture runs the other in-process ones.
MULTI_PROCESS = ("hops", "overlap", "goodput", "load")
IN_PROCESS = tuple(f for f in bench.FIGURES if f not in MULTI_PROCESS)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    threads = torch.get_num_threads()
    rc = bench.main(["--quick", "--repeats", "1", "--gaussian-budget", "5", "--json", str(out), "--only", *IN_PROCESS])
    assert rc == 0
    assert torch.get_num_threads() == threads, "bench must restore torch's thread count"
    return json.loads(out.read_text())


def test_report_has_every_figure(report):
    assert report["meta"]["figures"] == list(IN_PROCESS)
    assert report["meta"]["quick"] is True and report["meta"]["model"] == "tiny"
    assert set(report["figures"]) == set(IN_PROCESS)
    # Every figure has a runner; the multi-process ones are tested on their own.
    assert set(bench.RUNNERS) == set(bench.FIGURES) == set(IN_PROCESS) | set(MULTI_PROCESS)


def test_bytes_equal_for_two_model_sizes(report):
    b = report["figures"]["bytes"]
    small, large = b["sizes"]
    assert b["equal"] is True
    assert large["params"] > small["params"] and b["param_ratio"] > 1
    for s in (small, large):
        assert s["consensus"] is True
        assert s["directed_edges"] == 8  # ring of 4, both directions
    assert (
        small["bytes_per_edge_per_run"]
        == large["bytes_per_edge_per_run"]
        == small["bytes_per_edge_per_step"] * small["steps"]
    )
    # The analytic figure: 348 bytes per step over the 8 directed edges; an edge carries two
    # one-message frames per step, 43 or 44 bytes (1 less when one of them is origin 0's).
    assert ring4_bytes_per_step() == 348 == 8 * ring_bytes_per_edge_per_step(4)
    for s in (small, large):
        assert s["bytes_total"] == 348 * s["steps"]
        assert s["bytes_per_edge_per_step"] == 348 / 8
        assert (s["bytes_per_edge_per_step_min"], s["bytes_per_edge_per_step_max"]) == (43, 44)
    assert b["bytes_ratio"] == 1.0 and b["trainable_ratio"] > 1


def test_bytes_paper_setting_counts_v1_and_v2_full_and_one_hop(report):
    p = report["figures"]["bytes"]["paper"]
    assert p["nodes"] == 16 and p["steps"] == 100 and p["target_per_run"] is None  # quick: 100 steps
    got = {(r["version"], r["hops"]): r for r in p["settings"]}
    assert set(got) == {(1, 8), (1, 1), (2, 8), (2, 1)}
    # Steady state on a ring of 16 with one hop per step: every directed edge carries one frame of
    # 8 messages (origins at distance 0..7 behind it, 8 consecutive steps), v2: 4 + 13 + 8 × 6 bytes.
    assert got[(2, 1)]["per_step_steady"] == LENGTH + FRAME_HEADER + 8 * (1 + 1 + SCALAR)
    assert got[(1, 1)]["per_step_steady"] == LENGTH + 16 + 8 * 24
    for h in (1, 8):
        assert got[(2, h)]["per_run"] < got[(1, h)]["per_run"]


def test_apply_measures_both_families(report):
    a = report["figures"]["apply"]
    assert [e["n"] for e in a["per_n"]] == [16, 64, 256, 1024]
    assert a["trainable"] > 0 and _time_ok(a["subcge_basis_s"])
    for e in a["per_n"]:
        assert _wall_ok(e["subcge_s"]) and _time_ok(e["subcge_cpu_s"]) and _wall_ok(e["subcge_merge_s"])
        # Fractions of one forward are the reported medians' quotients (apply and merge separately).
        assert e["subcge_of_forward"] == pytest.approx(_quotient(e["subcge_s"], a["forward_s"]), rel=1e-12)
        assert e["subcge_of_forward_cpu"] == pytest.approx(_quotient(e["subcge_cpu_s"], a["forward_cpu_s"]), rel=1e-12)
        assert e["merge_of_forward"] == pytest.approx(_quotient(e["subcge_merge_s"], a["forward_s"]), rel=1e-12)
        if e["gaussian_s"] is None:  # skipped for the budget: no ratio either
            assert e["ratio"] is None and e["ratio_cpu"] is None
        else:
            assert _wall_ok(e["gaussian_s"]) and _time_ok(e["gaussian_cpu_s"])
            assert e["ratio"] == pytest.approx(_quotient(e["gaussian_s"], e["subcge_s"]), rel=1e-12)
            assert e["ratio_cpu"] == pytest.approx(_quotient(e["gaussian_cpu_s"], e["subcge_cpu_s"]), rel=1e-12)
    assert _wall_ok(a["forward_s"]) and _time_ok(a["forward_cpu_s"]) and a["target_of_forward"] == 0.01
    # The budget rule: a gaussian run starts only while the total it is expected to bring stays
    # within the budget (what it then takes is wall time: a loaded machine may overrun, as CI did).
    assert 0 <= a["gaussian_planned_s"] <= a["gaussian_budget_s"] and a["gaussian_spent_s"] > 0
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
    # The log holds its magic line + u32 + JSON header + u32 CRC, then per step an 8-byte (step, length)
    # record header and a v2 frame of 13 + (1 + 4)·clients bytes (origin byte + scalar).
    records = c["steps"] * (8 + FRAME_HEADER + (1 + SCALAR) * c["clients"])
    header = c["log_bytes"] - len(b"SEEDFLOOD-LOG 3\n") - 4 - 4 - records
    assert 2 <= header < 65536, header  # at least "{}"
    assert c["size_ratio"] == pytest.approx(c["state_bytes"] / c["log_bytes"], rel=1e-12)
    assert [v["merge_every"] for v in c["variants"]] == [0]  # the default: merge once per epoch
    assert c["clients"] == 16 and c["messages"] <= 10_000 and c["target_s"] == 10.0
    v = c["variants"][0]
    assert 0 < v["replay_s"]["read"]["median"] < v["floor_s"]
    assert v["ratio_to_floor"] == pytest.approx(v["replay_s"]["total"]["median"] / v["floor_s"], rel=1e-12)
    assert v["ratio_to_floor_cpu"] == pytest.approx(v["replay_s"]["total_cpu"]["median"] / v["floor_cpu_s"], rel=1e-12)
    assert c["gaussian_per_message_s"] > 0
    assert c["gaussian_projected_s"] == pytest.approx(c["gaussian_per_message_s"] * c["messages"], rel=1e-12)
    assert c["speedup_vs_gaussian"] == pytest.approx(
        c["gaussian_projected_s"] / c["variants"][0]["replay_s"]["total"]["median"], rel=1e-12
    )
    for v in c["variants"]:
        assert v["hash_equal"] is True
        assert _wall_ok(v["replay_s"]["total"]) and _wall_ok(v["load_s"]["total"])
        assert v["ratio"] == pytest.approx(_quotient(v["replay_s"]["total"], v["load_s"]["total"]), rel=1e-12)
        assert v["ratio_cpu"] == pytest.approx(_quotient(v["replay_s"]["cpu"], v["load_s"]["cpu"]), rel=1e-12)
        # Read, check, accumulate (with building the direction) and merge are consecutive parts of
        # each timed replay: per run they add up to its total, so the sum of their minima cannot
        # exceed the longest total.
        parts = [v["replay_s"][k] for k in ("read", "check", "accumulate", "merge")]
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
        assert s["bytes_per_edge_per_step"] == ring_bytes_per_edge_per_step(s["nodes"])


def test_tradeoff_rank_by_cadence(report):
    """Every (rank, cadence) cell is there; projections are the documented sums of the measured
    parts; merge_every 1 never sees a pending core, so its live overhead is the small merge alone."""
    t = report["figures"]["tradeoff"]
    assert [r["rank"] for r in t["ranks"]] == [8, 32]
    assert t["messages"] == 100_000 and t["steps"] == 6250 and t["clients"] == 16
    fwd = t["forward_cpu_s"]
    assert fwd > 0 and t["read_per_message_s"] > 0
    for r in t["ranks"]:
        assert set(r["catchup"]) == set(r["merge_s"]) == {"1", "10", "100", "1000"}
        assert set(r["live_overhead"]) == {"materialize", "lowrank", "carried"}
        per_msg = t["read_per_message_s"] + r["accumulate_per_message_s"]
        for m, c in r["catchup"].items():
            merges = t["steps"] // int(m)
            assert c["merges"] == merges and c["epochs"] == 7  # 6,250 steps, epochs of 1,000
            want = t["messages"] * per_msg + merges * r["merge_s"][m] + 7 * r["basis_s"]
            assert c["projected_s"] == pytest.approx(want, rel=1e-9)
            assert c["measured_short_s"] > 0
        for mode, live in r["live_overhead"].items():
            assert live["1"] == pytest.approx(r["merge_s"]["1"] / (2 * fwd), rel=1e-12)
            p = r["pending_forward"][mode]
            for m in ("10", "100", "1000"):
                extra = 2 * p["forward_extra_s"] + p["build_s"] + r["merge_s"][m] / int(m)
                assert live[m] == pytest.approx(extra / (2 * fwd), rel=1e-9)


def test_only_and_separator(tmp_path, capsys):
    out = tmp_path / "hop.json"
    assert bench.main(["--", "--quick", "--only", "hop", "--json", str(out)]) == 0
    assert list(json.loads(out.read_text())["figures"]) == ["hop"]
    assert "== hop:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--only", "nonsense"])


def test_churn_benchmark_refuses_schedules_it_cannot_measure(capsys):
    """`python -m seedflood.bench.churn` checks its sizes before it builds anything: a kill every
    5 steps would restart a client before the last rejoin finished."""
    from seedflood.bench import churn

    with pytest.raises(SystemExit) as err:
        churn.main(["--every", "5", "--steps", "20"])
    assert err.value.code == 2
    assert "--every >= 6" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:  # run from elsewhere than the repository root
        churn.main(["--quick", "--config", "no/such/debug.yaml"])
    assert err.value.code == 2
    assert "config no/such/debug.yaml not found: run from the repository root" in capsys.readouterr().err


def test_churn_benchmark_rejoin_figure_runs_and_rejoins_to_the_replayed_state(tmp_path):
    """`python -m seedflood.bench.churn --only rejoin`: a sponsor's real catch-up payload of H
    steps, rejoined by a fresh churn client (the benchmark asserts the rejoined state equals a
    plain replay's); the payload grows with H, about 6 bytes a message."""
    from seedflood.bench import churn

    out = tmp_path / "churn.json"
    assert churn.main(["--quick", "--only", "rejoin", "--histories", "10,100", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["figures"]["rejoin"]
    assert {(r["model"], r["steps"]) for r in rows} == {(m, h) for m in ("small", "large") for h in (10, 100)}
    for r in rows:
        assert r["messages"] == 16 * r["steps"] and 5 < r["payload_bytes"] / r["messages"] < 8
