"""`seedflood bench --only sim` at a tiny size: the figure's shape, never its speed.

Checks that every N asked for is reported with the three sides (sequential, batched, floor) on
both clocks, that client-steps per second are N over the reported median, that every ratio is
the quotient of the medians it names, and that the table is printed.
"""

from __future__ import annotations

import io
import json
import math

import pytest
import torch

from seedflood.bench import cli as bench
from seedflood.bench import sim as bench_sim


@pytest.fixture(scope="module")
def fig(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "sim.json"
    threads = torch.get_num_threads()
    rc = bench.main(["--quick", "--only", "sim", "--repeats", "1", "--sim-clients", "1", "3", "--json", str(out)])
    assert rc == 0 and torch.get_num_threads() == threads
    return json.loads(out.read_text())["figures"]["sim"]


def test_every_n_has_three_sides_on_two_clocks(fig):
    assert fig["model"] == "tiny" and fig["direction"] == "subcge"
    assert [e["n"] for e in fig["per_n"]] == [1, 3]
    for e in fig["per_n"]:
        assert e["skipped"] == []
        for clock in ("", "_cpu"):
            for side in ("sequential", "batched", "floor"):
                s = e[f"{side}{clock}_s"]
                assert s["n"] == 1 and 0 <= s["min"] <= s["median"] <= s["max"] and math.isfinite(s["max"])
                assert e[f"{side}{clock}_client_steps_per_s"] == pytest.approx(e["n"] / s["median"])
            seq, bat, flo = (e[f"{k}{clock}_s"]["median"] for k in ("sequential", "batched", "floor"))
            assert e[f"speedup{clock}"] == pytest.approx(seq / bat)
            assert e[f"batched_over_floor{clock}"] == pytest.approx(bat / flo)
    one = fig["per_n"][0]["sequential_s"]["median"]
    assert fig["per_n"][1]["batched_over_one_client"] == pytest.approx(fig["per_n"][1]["batched_s"]["median"] / one)


def test_the_table_is_printed(fig):
    buf = io.StringIO()
    bench_sim.print_sim(fig, buf)
    text = buf.getvalue()
    assert "== sim (wall clock)" in text and "== sim (CPU time of this process)" in text
    assert "batched/(1 client)" in text and "GPU goal" in text


def test_a_side_over_budget_is_skipped_not_extrapolated():
    res = bench_sim.fig_sim("tiny", [2], rounds=1, budget_s=0.0)
    (e,) = res["per_n"]
    assert e["skipped"] == ["batched", "floor", "sequential"]
    assert e["speedup"] is None and e["sequential_s"] is None and e["batched_client_steps_per_s"] is None
