"""Un-training: `seedflood replay/eval RUN --exclude ORIGIN [--from STEP]` rebuilds the model from
base + log with that origin's messages at steps >= STEP left out, and says so (the origins, the
step, the messages left out, and the note that later scalars were measured with them in); bad
input is refused in one line, exit status 2."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DEBUG = str(ROOT / "launch" / "configs" / "debug.yaml")  # 4 clients, 6 steps, one message per client and step


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished debug run directory (simulate, in this process)."""
    from seedflood import cli

    out = tmp_path_factory.mktemp("untrain") / "run"
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["simulate", "--config", DEBUG, "--set", f"run.out_dir={out}"]) == 0
    return out


def replay(run: Path, capsys, *args: str) -> dict:
    from seedflood import cli

    assert cli.main(["replay", str(run), *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def reference_hash(run: Path, drop: set[int], start: int) -> tuple[str, int]:
    """The hash of base + the log's records with the messages of `drop` at steps >= `start`
    filtered out here, applied with Applier (not through the CLI), and how many were dropped."""
    from seedflood.core.flood.protocol import trajectory
    from seedflood.core.zo.replay import Applier, state_hash
    from seedflood.ml.workload import Workload
    from seedflood.rundir import resume
    from seedflood.rundir.layout import RunDir

    rd = RunDir.at(str(run))
    cfg, proto = resume.recorded(rd)
    w = Workload.build(cfg)
    records, _ = resume.recorded_log(rd, proto, trajectory(cfg, proto, w.train_digest()), w.loaded.base_hash)
    kept = [(s, [m for m in msgs if s < start or m.origin not in drop]) for s, msgs in records]
    dropped = sum(len(msgs) for _, msgs in records) - sum(len(msgs) for _, msgs in kept)
    Applier(w.direction, proto).apply_all(kept)
    return state_hash(w.model, w.direction), dropped


def test_excluding_an_origin_is_the_log_minus_its_messages(run, capsys):
    full = replay(run, capsys)
    got = replay(run, capsys, "--exclude", "1")
    want, dropped = reference_hash(run, {1}, 0)
    assert dropped == 6
    assert got["param_hash"] == want != full["param_hash"]
    assert got["steps"] == 6
    assert {k: v for k, v in got["excluded"].items() if k != "note"} == {
        "origins": [1],
        "from_step": 0,
        "messages_left_out": 6,
    }
    assert "included the excluded updates" in got["excluded"]["note"]


def test_from_keeps_the_earlier_steps_and_several_origins_can_be_excluded(run, capsys):
    got = replay(run, capsys, "--exclude", "3", "--exclude", "1", "--exclude", "3", "--from", "2")
    want, dropped = reference_hash(run, {1, 3}, 2)
    assert (got["param_hash"], got["excluded"]["messages_left_out"]) == (want, dropped) == (want, 8)
    assert got["excluded"]["origins"] == [1, 3] and got["excluded"]["from_step"] == 2
    assert want != replay(run, capsys, "--exclude", "1", "--from", "2")["param_hash"]


def test_from_past_the_last_step_is_the_plain_replay(run, capsys):
    got = replay(run, capsys, "--exclude", "2", "--from", "6")
    assert got["param_hash"] == replay(run, capsys)["param_hash"]
    assert got["excluded"]["messages_left_out"] == 0


def test_excluding_every_origin_from_step_0_is_the_base_model(run, capsys):
    every = [a for o in range(4) for a in ("--exclude", str(o))]
    got = replay(run, capsys, *every)
    assert got["param_hash"] == replay(run, capsys, "--step", "0")["param_hash"]
    assert got["excluded"]["messages_left_out"] == 24


def test_the_summary_names_what_was_left_out(run, capsys):
    from seedflood import cli

    assert cli.main(["replay", str(run), "--exclude", "0", "--from", "4"]) == 0
    lines = dict(line.split(":", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["excluded"].strip() == "origin 0 from step 4: 2 logged messages left out"
    assert lines["note"].strip().startswith("the other origins' later scalars were measured on states")
    assert len(lines["param hash"].strip()) == 64


@pytest.mark.parametrize(
    "args, words",
    [
        (["--exclude", "4"], "--exclude 4: the run has 4 clients (origins 0..3)"),
        (["--exclude", "-1"], "--exclude -1: the run has 4 clients (origins 0..3)"),
        (["--exclude", "1", "--from", "7"], "--from 7 is outside 0..6 (steps in the log)"),
        (["--exclude", "1", "--from", "-1"], "--from -1 is outside 0..6 (steps in the log)"),
        (["--from", "2"], "--from 2 needs --exclude ORIGIN"),
    ],
)
@pytest.mark.parametrize("command", ["replay", "eval"])
def test_bad_exclusions_are_refused_in_one_line(run, capsys, command, args, words):
    from seedflood import cli

    assert cli.main([command, str(run), *args]) == 2
    got = capsys.readouterr()
    assert got.out == ""
    lines = got.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("seedflood: error: ") and words in lines[0], got.err


def test_eval_scores_the_untrained_model(run, capsys):
    from seedflood import cli

    assert cli.main(["eval", str(run), "--exclude", "2", "--from", "3", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["steps"] == 6 and m["n"] == 64 and 0.0 <= m["accuracy"] <= 1.0 and m["loss"] > 0
    assert m["excluded"]["origins"] == [2] and m["excluded"]["messages_left_out"] == 3
    assert cli.main(["eval", str(run), "--exclude", "2"]) == 0
    lines = dict(line.split(":", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["excluded"].strip() == "origin 2 from step 0: 6 logged messages left out"
    assert "accuracy" in lines and "note" in lines
