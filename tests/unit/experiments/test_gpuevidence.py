"""gpu-evidence's bookkeeping (experiments/gpuevidence.py), without running the plan: a command
past its deadline is killed with its process group, a cut run is reported as cut at the step its
directory shows (never as finished), and the report and rows read the figures they are given."""

from __future__ import annotations

import json
import time

from seedflood.experiments import gpuevidence_report as gp
from seedflood.experiments import gpuevidence_run as gr


def evidence(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    return gr.Evidence(tmp_path / "out", work, True, gp.report)


def test_a_command_past_its_deadline_is_killed_with_its_children(tmp_path):
    ev = evidence(tmp_path)
    marker = tmp_path / "child-alive"
    # the child outlives its parent's kill unless the whole group goes
    script = f"(sleep 3; touch {marker}) & sleep 30"
    t0 = time.monotonic()
    ran = gr.run(ev, "c-reproduce", ["sh", "-c", script], timeout_s=1.0, env={"PATH": "/usr/bin:/bin"})
    assert ran.code is None and time.monotonic() - t0 < 10
    time.sleep(3.5)
    assert not marker.exists()
    assert "killed at the deadline" in ev.log("c-reproduce").read_text()


def test_a_finished_command_reports_its_exit_status(tmp_path):
    ev = evidence(tmp_path)
    assert gr.run(ev, "b-bench", ["sh", "-c", "exit 3"], timeout_s=30, env={"PATH": "/usr/bin:/bin"}).code == 3
    assert gr.run(ev, "b-bench", ["true"], timeout_s=0, env={}).code is None  # no time left: not started


def plan_dir(tmp_path, steps=5000):
    out = tmp_path / "c-seedflood"
    out.mkdir()
    runs = [{"name": "ring16-seedflood", "algorithm": "seedflood"}, {"name": "ring16-dsgd", "algorithm": "dsgd"}]
    (out / "plan.json").write_text(json.dumps({"steps": steps, "runs": runs}))
    return out


def test_a_run_cut_by_the_clock_is_cut_at_the_step_its_directory_shows(tmp_path):
    out = plan_dir(tmp_path)
    cut = out / "ring16-seedflood" / "seedflood"
    cut.mkdir(parents=True)
    lines = [{"step": 0, "accuracy": 0.7}, {"step": 1200, "accuracy": 0.75}, {"final": False}]
    (cut / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\nnot json\n")
    rows = gp.reproduce_rows(out, gr.Ran(None, 300.0), "seedflood,dsgd")
    assert rows[0] == {
        "name": "ring16-seedflood",
        "algorithm": "seedflood",
        "planned_steps": 5000,
        "status": "cut",
        "cut_at_step": 1200,
    }
    assert rows[1]["status"] == "not started"
    # the same directory after a command that exited by itself: failed, not cut
    assert gp.reproduce_rows(out, gr.Ran(1, 3.0), "seedflood,dsgd")[0]["status"] == "failed"
    text = gp.report({"meta": {}, "c": {"runs": rows}})
    assert "| seedflood | cut | cut at 1200 |" in text and "finished" not in text


def test_finished_runs_carry_accuracy_its_standard_error_and_the_ratio_to_dsgd(tmp_path):
    out = plan_dir(tmp_path, steps=500)
    for alg, acc in (("seedflood", 0.8), ("dsgd", 0.64)):
        d = out / f"ring16-{alg}" / alg
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"steps": 500, "final": {"accuracy": acc}, "wall_seconds": 9.0}))
        (d / "config.yaml").write_text("task: {test_examples: 100}\n")
    rows = gp.reproduce_rows(out, gr.Ran(0, 20.0), "seedflood,dsgd")
    gp.normalise(rows)
    sf, dsgd = rows
    assert sf["status"] == dsgd["status"] == "finished" and sf["steps"] == 500
    assert abs(sf["stderr"] - (0.8 * 0.2 / 100) ** 0.5) < 1e-12
    assert sf["vs_dsgd"] == 0.8 / 0.64 and dsgd["vs_dsgd"] == 1.0


def test_consensus_of_a_run_without_summary_says_where_it_stopped():
    assert gp.consensus(None, 400, 123) == {"finished": False, "cut_at_step": 123}
    s = {"steps": 400, "param_hash": "h", "client_hashes": ["h", "h"], "consensus": True, "final": {"accuracy": 0.5}}
    got = gp.consensus(s, 400, 400)
    assert got["finished"] and got["clients_equal"] and got["clients"] == 2
    assert not gp.consensus({**s, "client_hashes": ["h", "x"]}, 400, 400)["clients_equal"]


def test_sim_rows_read_the_bench_figure():
    sim = {"per_n": [{"n": 16, "sequential_client_steps_per_s": 10.0, "batched_client_steps_per_s": 40.0,
                      "floor_client_steps_per_s": 50.0, "batched_over_floor": 1.25, "batched_over_one_client": 2.5}]}  # fmt: skip
    (row,) = gp.sim_rows(sim)
    assert row["batched"] == 40.0 and row["of_floor"] == 0.8 and row["over_one_client"] == 2.5


def test_the_churn_run_fits_what_is_left_of_its_clock_but_never_less_than_a_rejoin_needs():
    from seedflood.experiments.gpuevidence import churn_steps

    # the H200's figures: 2.6 steps/s, 63 s start-up; 168 s left fits 2.6 * 85 = 221 steps
    assert churn_steps(2.6, 63.0, 168.0, 100, 5000)[0] == 221
    # 86 s left (what the first plan had): too little, so the rejoin's minimum, which the clock cuts
    steps, why = churn_steps(2.6, 63.0, 86.0, 100, 5000)
    assert steps == 200 and "a rejoin needs 200" in why  # ceil(2.6 * 73) + 10
    assert churn_steps(100.0, 1.0, 3600.0, 200, 400)[0] == 400  # capped
    assert churn_steps(0.0, 5.0, 10.0, 200, 400)[0] == 200  # no rate measured: the floor
