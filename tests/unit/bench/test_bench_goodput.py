"""`seedflood bench --only goodput` (bench/goodput.py): its schedules, its arithmetic and its CLI
wiring, without a timed run (the figure's runs take minutes; a tiny real one is marked slow).
Nothing here asserts a timing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedflood.bench import cli as bench
from seedflood.bench import goodput
from seedflood.core.topology import resolve as topo
from seedflood.core.topology.graph import Topology
from seedflood.roles.inprocess import Event


def _debug() -> Path:
    return Path(__file__).resolve().parents[3] / "launch" / "configs" / "debug.yaml"


def ring(n: int) -> Topology:
    return Topology(f"ring{n}", n, tuple((i, (i + 1) % n) for i in range(n)))


def test_every_schedule_lands_on_its_steps_and_stops_before_the_margin():
    top = ring(8)
    last = goodput.last_event_step(150, delay=2)
    assert last == 150 - 4 * 3 == 138
    assert goodput.marks(150, 50, last) == [50, 100]
    assert goodput.cut_schedule(top, 150, 50, last) == [
        Event(50, 0, "cut", 1),
        Event(55, 0, "heal", 1),
        Event(100, 5, "cut", 4),  # node 5's first neighbour on the ring
        Event(105, 5, "heal", 4),
    ]
    assert goodput.join_schedule(8, 150, 50, last) == [Event(50, 8, "join"), Event(100, 9, "join")]
    assert goodput.kill_schedule(8, 150, 50, last) == [
        Event(50, 0, "kill"),
        Event(50, 0, "restart"),  # restarted by its supervisor once the others apply step 50
        Event(100, 5, "kill"),
        Event(100, 5, "restart"),
    ]
    # per 100 steps: a stall at +10, a kill with restart at +40, a cut at +70 healed at +75; the
    # second period's kill (140) and cut (170) come after `last` and are left out
    assert goodput.mixed_schedule(top, 150, last) == [
        Event(10, 4, "stall", goodput.STALL_S),
        Event(40, 1, "kill"),
        Event(40, 1, "restart"),
        Event(70, 0, "cut", 1),
        Event(75, 0, "heal", 1),
        Event(110, 1, "stall", goodput.STALL_S),
    ]
    assert goodput.marks(10, 50, goodput.last_event_step(10, 2)) == []


def test_the_fixed_set_up_is_a_ring_of_8_and_a_4x4_torus_with_one_second_timeouts():
    for name, n in (("ring8", 8), ("torus4x4", 16)):
        g = goodput.Graph.of(name, 150, config_path=_debug())
        assert g.top.n == n and g.cfg.transport.timeout_s == 1.0 and g.cfg.churn.settle == 1
        assert g.cfg.run.steps == 150 and g.cfg.churn.max_nodes == n + 2  # two joins, at 50 and 100
        assert [e.node for e in g.schedules["join"]] == [n, n + 1]
        assert set(g.schedules) == set(goodput.SCHEDULES) and g.schedules["none"] == []
        # the join's bases: n + 1 and n + 2 members, the new ids linked as the join rule links them
        assert sorted(g.bases) == [n + 1, n + 2]
        for m, (cfg, top) in g.bases.items():
            assert cfg.topology.nodes == top.n == m and cfg.churn.max_nodes == n + 2
            topo.check_nodes(top, cfg.topology.nodes)
            new = [e for e in top.edges if max(e) >= n]
            assert len(new) == (m - n) * g.top.min_degree  # each new id links to k founders
            assert all(min(e) < n for e in new)  # founders first
    assert goodput.Graph.of("torus4x4", 150, config_path=_debug()).top.diameter == 4


def test_member_steps_and_the_equivalent_wall():
    # 8 founders, joins committed at steps 56 and 106 of 150
    spent = goodput.member_steps(8, {56: 1, 106: 1}, 150)
    assert spent == {8: 56, 9: 50, 10: 44}
    assert goodput.member_steps(4, {}, 10) == {4: 10}
    assert goodput.member_steps(4, {0: 2}, 10) == {6: 10}
    walls = {8: 40.0, 9: 45.0, 10: 50.0}
    assert goodput.equivalent_wall(spent, walls) == pytest.approx((56 * 40 + 50 * 45 + 44 * 50) / 150)
    assert goodput.equivalent_wall({8: 150}, walls) == 40.0


def test_ratio_takes_the_set_up_out_of_both_and_spread_is_median_min_max():
    # steps/s under the schedule over steps/s with none = none's stepping time / the schedule's
    assert goodput.ratio(41.0, 51.0, 1.0) == pytest.approx(40 / 50)
    assert goodput.ratio(30.0, 30.0, 0.0) == 1.0
    assert goodput.spread([0.9, 0.97, 0.95, 0.8, 0.99]) == {"median": 0.95, "min": 0.8, "max": 0.99, "n": 5}
    assert goodput.spread([1.0, 0.5]) == {"median": 0.75, "min": 0.5, "max": 1.0, "n": 2}


def test_goodput_pairs_each_repeat_with_its_own_none_and_leaves_failed_runs_out():
    g = goodput.Graph.of("ring8", 150, config_path=_debug())
    ok = {"joins": {}, "rule_stops": 0}
    runs = {
        "setup": [{"wall_s": 1.0}, {"wall_s": 2.0}, {"wall_s": 1.0}],
        "none": [{"wall_s": 41.0, **ok}, {"wall_s": 62.0, **ok}, {"wall_s": 41.0, **ok}],
        "cut": [{"wall_s": 51.0, **ok}, {"wall_s": 62.0, **ok}, {"failed": "RuntimeError: stuck"}],
        "kill": [{"wall_s": 45.0, **ok}, {"wall_s": 80.0, **ok}, {"wall_s": 41.0, **ok}],
        "mixed": [{"failed": "x"}] * 3,
        # the join run spent 56 steps at 8 members, 50 at 9, 44 at 10
        "join": [{"wall_s": 50.0, "joins": {56: 1, 106: 1}, "rule_stops": 1}] * 3,
        "9": [{"wall_s": 46.0}] * 3,
        "10": [{"wall_s": 51.0}] * 3,
    }
    out = goodput.goodput(g, runs, 150)
    assert out["cut"]["ratios"] == pytest.approx([40 / 50, 1.0])  # repeat 2 with its own set-up
    assert out["cut"]["failed"] == 1 and out["cut"]["goodput"]["n"] == 2
    assert out["kill"]["goodput"]["median"] == pytest.approx(40 / 44)
    assert out["mixed"]["goodput"] is None and out["mixed"]["failed"] == 3
    assert out["cut"]["failures"] == 2 and out["cut"]["goal"] == 0.95 and out["kill"]["goal"] == 0.90
    assert out["mixed"]["failures"] == 4  # two stalls, a kill and its restart, a cut and its heal
    # a failure's cost: the extra wall over the failures, and that in steps of its base
    assert out["cut"]["cost_s"]["max"] == pytest.approx((51 - 41) / 2)
    assert out["cut"]["cost_steps"]["max"] == pytest.approx(5 / (40 / 150))
    assert out["kill"]["cost_s"]["min"] == 0.0
    base = (56 * 41 + 50 * 46 + 44 * 51) / 150  # none's wall for 8 members, the bases for 9 and 10
    assert out["join"]["ratios"][0] == pytest.approx((base - 1) / 49)
    assert out["join"]["ratios"][1] == pytest.approx(((56 * 62 + 50 * 46 + 44 * 51) / 150 - 2) / 48)


def test_cli_runs_goodput_with_its_options(monkeypatch, tmp_path, capsys):
    seen = {}

    def fake(steps, repeats, graphs, out, every, period):
        seen.update(steps=steps, repeats=repeats, graphs=graphs, every=every, period=period)
        print("== goodput", file=out)
        return {"steps": steps}

    monkeypatch.setattr(goodput, "fig_goodput", fake)
    assert "goodput" in bench.FIGURES and bench.RUNNERS["goodput"] is bench.fig_goodput
    out = tmp_path / "g.json"
    assert bench.main(["--only", "goodput", "--json", str(out)]) == 0
    assert seen == {"steps": 150, "repeats": 5, "graphs": ("ring8", "torus4x4"), "every": 50, "period": 100}
    assert json.loads(out.read_text())["figures"]["goodput"]["steps"] == 150
    argv = ["--only", "goodput", "--quick", "--repeats", "1", "--goodput-steps", "40", "--goodput-graphs", "torus4x4"]
    assert bench.main(argv) == 0
    assert seen == {"steps": 40, "repeats": 1, "graphs": ["torus4x4"], "every": 8, "period": 20}
    assert "== goodput" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--only", "goodput", "--goodput-graphs", "hypercube"])
    assert bench.main(["--only", "goodput", "--goodput-steps", "-1"]) == 2


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 7 runs of 30 steps; minutes on a loaded 2-core machine
def test_quick_goodput_runs_every_schedule_to_one_hash(monkeypatch, capsys):
    """`--quick` on the ring: every schedule's run ends on one hash (a failed one is reported, and
    none may be), and every goodput is a positive ratio of two measured runs."""
    monkeypatch.chdir(_debug().parents[2])
    fig = goodput.fig_goodput(30, 1, ("ring8",), every=8, period=20)
    g = fig["ring8"]["goodput"]
    assert set(g) == {"cut", "join", "kill", "mixed"}
    assert all(v["failed"] == 0 and v["goodput"]["median"] > 0 for v in g.values()), g
    assert "goodput: steps/s under a schedule" in capsys.readouterr().out
