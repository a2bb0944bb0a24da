"""The experiment trackers (eval.trackers: rundir/trackers.py and one adapter per system): each one
gets the evaluator's metrics, the run's settings, a churn run's health and the final hash, read
back from its own local store with its own reader (MLflow's client over its file store, Trackio's
SQLite storage, `wandb leet inspect` over an offline run's .wandb file). The preflight refuses an
unknown tracker or one whose package is missing in one line, exit 2.

The trackers' packages are the `trackers` extra (setup.cfg): without one, its tests skip and say so.
Trackio reads its store folder once per process, so its writer and reader run in subprocesses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from seedflood.rundir import trackers
from seedflood.rundir.metrics import MetricsWriter, read_metrics

pytestmark = pytest.mark.timeout(300)

RECORDS = [
    {"step": 0, "accuracy": 0.5, "loss": 1.25, "members": 4, "zero_shot": True},
    {"step": 3, "event": "membership", "members": 3, "joins": 0, "leaves": 1, "change": "step 3: leave 2"},
    {"step": 6, "accuracy": 0.75, "loss": 0.5, "members": 3, "final": True, "param_hash": "ab" * 16},
]
HEALTH = {"commit_hops": 4.5, "ballots_per_step": 1.0, "drops": 2, "heals": 0, "joins": 0, "exclusions": 1}
RECORDED = {"run": {"seed": 7, "out_dir": "somewhere"}, "zo": {"lr": 0.001, "trainable": ["a", "b"]}}


def write_run(root: Path, names: list[str]) -> None:
    """What an evaluator writes: the records, health at step 5, through MetricsWriter with `names`."""
    sinks = trackers.open_trackers(names, root, RECORDED, resume=False)
    assert [t.name for t in sinks] == names  # every one opened (a failure would be a warning and a gap)
    writer = MetricsWriter(root / "metrics.jsonl", tensorboard=root / "tb", trackers=sinks)
    for r in RECORDS[:2]:
        writer.write(r)
    writer.health(5, HEALTH)
    writer.write(RECORDS[2])
    writer.close()


def check_metrics(history: dict[str, dict[int, float]]) -> None:
    """tag -> {step: value} as a tracker holds it: every score, the roster, health, nothing else made up."""
    assert history["accuracy"] == {0: 0.5, 6: 0.75}
    assert history["loss"] == {0: 1.25, 6: 0.5}
    assert history["roster/members"] == {0: 4, 3: 3, 6: 3}
    assert history["roster/leaves"] == {3: 1}
    assert history["health/commit_hops"] == {5: 4.5}
    assert history["health/drops"] == {5: 2} and history["health/exclusions"] == {5: 1}


def test_settings_are_flat_section_keys_as_text() -> None:
    flat = trackers.settings_of(RECORDED)
    assert flat == {"run.seed": "7", "run.out_dir": "somewhere", "zo.lr": "0.001", "zo.trainable": '["a", "b"]'}


def test_mlflow_gets_metrics_settings_health_and_the_final_hash(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("mlflow", reason="the trackers extra is not installed (pip install 'seedflood[trackers]')")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    write_run(tmp_path, ["mlflow"])
    from seedflood.rundir.mlflowtracker import client_of

    client = client_of(tmp_path)
    experiment = client.get_experiment_by_name("seedflood")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == trackers.read_run_id(tmp_path, "mlflow") and run.info.status == "FINISHED"
    assert run.data.params["zo.lr"] == "0.001" and run.data.params["run.seed"] == "7"
    assert run.data.tags["param_hash"] == "ab" * 16
    history = {
        key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)} for key in run.data.metrics
    }
    check_metrics(history)


def test_wandb_offline_gets_metrics_settings_health_and_the_final_hash(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("wandb", reason="the trackers extra is not installed (pip install 'seedflood[trackers]')")
    for var in ("WANDB_DIR", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    write_run(tmp_path, ["wandb"])
    (file,) = (tmp_path / "trackers" / "wandb").glob("offline-run-*/run-*.wandb")
    records = [json.loads(line) for line in wandb_reader(file, "--json").splitlines() if line.startswith("{")]
    history: dict[str, dict[int, float]] = {}
    for r in records:
        if r["type"] == "history":
            for key, value in r["history"]["item"].items():
                if not key.startswith("_"):
                    history.setdefault(key, {})[r["history"]["step"].get("num", 0)] = value
    check_metrics(history)
    summary = json.loads(wandb_reader(file, "--summary", "--json"))
    assert summary["state"] == "finished" and summary["summary"]["param_hash"] == "ab" * 16
    assert summary["config"]["zo.lr"] == "0.001" and summary["config"]["run.seed"] == "7"


def wandb_reader(file: Path, *flags: str) -> str:
    """wandb's own reader of a .wandb transaction log (`wandb leet inspect`)."""
    wandb = Path(sys.executable).parent / "wandb"
    r = subprocess.run([str(wandb), "leet", "inspect", *flags, str(file)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


TRACKIO_WRITER = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_trackers import write_run
write_run(Path({root!r}), ["trackio"])
"""

TRACKIO_READER = """
import json
from trackio.sqlite_storage import SQLiteStorage
print(json.dumps({{"runs": SQLiteStorage.get_runs("seedflood"), "logs": SQLiteStorage.get_logs("seedflood", {name!r}),
                  "config": SQLiteStorage.get_run_config("seedflood", {name!r})}}))
"""


def test_trackio_gets_metrics_settings_health_and_the_final_hash(tmp_path: Path) -> None:
    pytest.importorskip("trackio", reason="the trackers extra is not installed (pip install 'seedflood[trackers]')")
    root = tmp_path / "run"
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRACKIO_DIR"}
    env["HF_HUB_OFFLINE"] = "1"
    tests = str(Path(__file__).parent)
    w = subprocess.run([sys.executable, "-c", TRACKIO_WRITER.format(tests=tests, root=str(root))], env=env, timeout=240)
    assert w.returncode == 0
    env["TRACKIO_DIR"] = str(root / "trackers" / "trackio")  # where it wrote, unset: the run's own folder
    read = TRACKIO_READER.format(name=root.name)
    r = subprocess.run([sys.executable, "-c", read], env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["runs"] == [root.name]
    assert got["config"]["zo.lr"] == "0.001" and got["config"]["run.seed"] == "7"
    history: dict[str, dict[int, float]] = {}
    for row in got["logs"]:
        for key, value in row.items():
            if key not in ("step", "timestamp"):
                history.setdefault(key, {})[row["step"]] = value
    assert history.pop("param_hash") == {6: "ab" * 16}
    check_metrics(history)


def test_the_jsonl_is_the_same_bytes_with_or_without_trackers(tmp_path: Path) -> None:
    """A tracker adds nothing to metrics.jsonl, and health never goes there (a fake tracker: no package)."""

    class Fake:
        name = "fake"

        def __init__(self) -> None:
            self.logged: list[tuple[int, dict[str, float]]] = []
            self.summaries: list[dict[str, str]] = []

        def log(self, step, scalars):
            self.logged.append((step, dict(scalars)))

        def summary(self, values):
            self.summaries.append(dict(values))

        def close(self):
            pass

    fake = Fake()
    for name, sinks in (("plain", []), ("tracked", [fake])):
        w = MetricsWriter(tmp_path / name / "metrics.jsonl", trackers=sinks)
        for r in RECORDS:
            w.write(r)
            w.health(r["step"], HEALTH)
        w.close()
    plain, tracked = ((tmp_path / n / "metrics.jsonl").read_bytes() for n in ("plain", "tracked"))
    assert plain == tracked and b"health" not in plain
    assert len(read_metrics(tmp_path / "plain" / "metrics.jsonl")) == 3
    assert [s for s, tags in fake.logged if "accuracy" in tags] == [0, 6]
    assert fake.summaries == [{"param_hash": "ab" * 16}]


def test_a_tracker_that_fails_is_left_out_and_the_run_goes_on(tmp_path: Path, caplog) -> None:
    class Broken:
        name = "broken"
        closed = False

        def log(self, step, scalars):
            raise RuntimeError("store unreachable\nsecond line")

        def summary(self, values):
            raise AssertionError("never called once left out")

        def close(self):
            Broken.closed = True

    w = MetricsWriter(tmp_path / "metrics.jsonl", trackers=[Broken()])
    for r in RECORDS:
        w.write(r)
    w.close()
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 3 and Broken.closed
    assert "tracker broken left out: store unreachable" in caplog.text


def test_preflight_refuses_a_tracker_whose_package_is_missing(monkeypatch, capsys) -> None:
    """`seedflood world-size` with a tracker that is not installed: one line, exit 2. The control:
    the same command with eval.trackers empty passes the same preflight."""
    from seedflood.cli import main

    monkeypatch.setitem(trackers.TRACKERS, "mlflow", trackers.Kind("x", "seedflood_no_such_package", "mlflow"))
    assert main(["world-size", "--set", "eval.trackers=[mlflow]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "seedflood: error: eval.trackers: mlflow needs the seedflood_no_such_package package: "
        "pip install 'seedflood[mlflow]'"
    ]
    assert main(["world-size", "--set", "eval.trackers=[]"]) == 0


@pytest.mark.parametrize(
    "value, says",
    [
        ("[comet]", "eval.trackers[0]: must be one of mlflow, trackio, wandb; got 'comet'"),
        ("[wandb,wandb]", "eval.trackers: names a tracker twice"),
    ],
)
def test_an_unknown_tracker_is_one_line_exit_2(value: str, says: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "seedflood", "world-size", "--set", f"eval.trackers={value}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr


def test_the_missing_lines_name_each_problem() -> None:
    assert trackers.missing(["comet"]) == ["eval.trackers: unknown tracker 'comet' (known: mlflow, trackio, wandb)"]
    assert trackers.missing([]) == []


def test_a_resumed_evaluator_continues_the_same_mlflow_run(tmp_path: Path, monkeypatch) -> None:
    """The run id kept under trackers/ brings a resume back to its tracker run; the control: a
    new run (resume=False) in the same directory opens a second one."""
    pytest.importorskip("mlflow", reason="the trackers extra is not installed (pip install 'seedflood[trackers]')")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for step, resume in ((0, False), (5, True), (9, False)):
        (t,) = trackers.open_trackers(["mlflow"], tmp_path, RECORDED, resume=resume)
        t.log(step, {"accuracy": step / 10})
        t.close()
    from seedflood.rundir.mlflowtracker import client_of

    client = client_of(tmp_path)
    runs = client.search_runs([client.get_experiment_by_name("seedflood").experiment_id])
    steps = sorted(sorted(m.step for m in client.get_metric_history(r.info.run_id, "accuracy")) for r in runs)
    assert steps == [[0, 5], [9]]
