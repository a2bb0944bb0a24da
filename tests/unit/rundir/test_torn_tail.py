"""A run directory whose log.bin ends in a torn record (a crash mid-append): `replay` and
`eval` apply the whole steps and say so in one line on stderr, naming what disagrees with them
(summary.json's step count and hash, checkpoints past the log's end); `check` refuses the
directory with that line (exit 2, never "OK"); a resume cuts the torn bytes off, redoes the step
and leaves a directory that checks OK again. One finished debug run (simulated in this process),
copied per test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import runs
from seedflood import cli
from seedflood.core.config import runconfig as config
from seedflood.roles import sharedmodel
from seedflood.rundir.logheader import LogFormat, read_header_at
from seedflood.rundir.logrecords import scan_records

ROOT = Path(__file__).resolve().parents[3]
DEBUG = ROOT / "launch" / "configs" / "debug.yaml"  # 6 steps, checkpoints after steps 3 and 6
torch.set_num_threads(1)

STEPS = 6


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, dict]:
    """A finished 6-step debug run directory (summary.json, checkpoints step_000003 and step_000006)."""
    out = tmp_path_factory.mktemp("torn") / "run"
    summary = sharedmodel.run(config.load(DEBUG, [f"run.out_dir={out}"]), progress=False).to_dict()
    assert summary["steps"] == STEPS
    return out, summary


@pytest.fixture
def run_dir(finished, tmp_path) -> Path:
    """A private copy of the finished run directory (the tests cut its log)."""
    return runs.copy_run_dir(finished[0], tmp_path / "run")


def record_ends(log: Path) -> list[int]:
    """Byte offset just past each whole record of `log`."""
    with open(log, "rb") as f:
        header, start, version = read_header_at(f, log)
        return scan_records(f, log, start, LogFormat.of(version, header, log), None).ends


def cut_to(log: Path, size: int) -> None:
    log.write_bytes(log.read_bytes()[:size])


def err_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def fields(text: str) -> dict[str, str]:
    """The `label:  value` lines of a command's summary."""
    return {label: value.strip() for label, value in (line.split(":", 1) for line in text.splitlines())}


def torn_line(run_dir: Path, torn: int, after: int, disagreeing: str) -> str:
    return (
        f"{run_dir / 'log.bin'} ends in a torn record: {torn} bytes after step {after}, its last whole record "
        f"(a crash mid-append; resuming the run cuts them off); {disagreeing}"
    )


@pytest.mark.parametrize("short", range(1, 8))
def test_check_refuses_a_log_cut_short_naming_the_summary_and_the_checkpoint_past_its_end(run_dir, short, capsys):
    log = run_dir / "log.bin"
    ends = record_ends(log)
    cut_to(log, ends[-1] - short)
    assert cli.main(["check", str(run_dir)]) == 2
    got = capsys.readouterr()
    assert got.out == ""  # no "OK" verdict, no "steps logged"
    torn = ends[-1] - short - ends[-2]  # what is left of the last record
    want = torn_line(
        run_dir,
        torn,
        STEPS - 2,
        "disagreeing with its 5 whole steps: summary.json says 6 steps, checkpoint step_000006 lies past the log's end",
    )
    assert err_lines(got.err) == [f"seedflood: error: {want}"]
    assert cli.main(["check", str(run_dir), "--json"]) == 2  # scripts get the refusal too
    got = capsys.readouterr()
    assert got.out == "" and err_lines(got.err) == [f"seedflood: error: {want}"]


@pytest.mark.parametrize("short", range(1, 8))
def test_replay_of_a_log_cut_short_applies_its_whole_steps_and_says_it_ends_torn(run_dir, finished, short, capsys):
    log = run_dir / "log.bin"
    ends = record_ends(log)
    cut_to(log, ends[-1] - short)
    assert cli.main(["replay", str(run_dir), "--json"]) == 0
    got = capsys.readouterr()
    replayed = json.loads(got.out)
    assert replayed["steps"] == STEPS - 1
    summary_hash, mine = finished[1]["param_hash"], replayed["param_hash"]
    assert mine != summary_hash
    want = torn_line(
        run_dir,
        ends[-1] - short - ends[-2],
        STEPS - 2,
        f"disagreeing with its 5 whole steps: summary.json says 6 steps and param hash {summary_hash[:12]} "
        f"(the replay's: {mine[:12]}), checkpoint step_000006 lies past the log's end",
    )
    assert err_lines(got.err) == [f"seedflood: warning: {want}"]


def test_a_tear_earlier_names_every_checkpoint_past_the_end_and_eval_says_it_too(run_dir, capsys):
    """Torn inside step 2's record (as after a crash, with later files from elsewhere): both
    checkpoints lie past the 2 whole steps. `replay --score` scores those steps and says the same line."""
    log = run_dir / "log.bin"
    ends = record_ends(log)
    cut_to(log, ends[2] - 1)
    want = torn_line(
        run_dir,
        ends[2] - 1 - ends[1],
        1,
        "disagreeing with its 2 whole steps: summary.json says 6 steps, "
        "checkpoints step_000003, step_000006 lie past the log's end",
    )
    assert cli.main(["check", str(run_dir)]) == 2
    assert err_lines(capsys.readouterr().err) == [f"seedflood: error: {want}"]
    assert cli.main(["replay", str(run_dir), "--score", "--json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["steps"] == 2
    assert [ln for ln in err_lines(got.err) if ln.startswith("seedflood: ")] == [f"seedflood: warning: {want}"]


def test_a_torn_log_with_nothing_else_past_it_is_still_not_ok(run_dir, capsys):
    """A crash before the run's end: no summary.json, no checkpoint past the log's whole steps.
    The tail is still reported, and check still refuses the directory."""
    log = run_dir / "log.bin"
    ends = record_ends(log)
    (run_dir / "summary.json").unlink()
    shutil.rmtree(run_dir / "checkpoints" / "step_000006")
    (run_dir / "checkpoints" / "LATEST").write_text("step_000003\n")
    cut_to(log, ends[-1] - 3)
    want = torn_line(
        run_dir, ends[-1] - 3 - ends[-2], STEPS - 2, "no summary.json or checkpoint disagrees with its 5 whole steps"
    )
    assert cli.main(["check", str(run_dir)]) == 2
    assert err_lines(capsys.readouterr().err) == [f"seedflood: error: {want}"]
    assert cli.main(["replay", str(run_dir)]) == 0
    got = capsys.readouterr()
    assert fields(got.out)["replayed"] == "5 logged steps applied to the base model"
    assert err_lines(got.err) == [f"seedflood: warning: {want}"]


def test_an_uncut_log_checks_ok_and_replays_without_a_word_on_stderr(run_dir, finished, capsys):
    assert cli.main(["check", str(run_dir)]) == 0
    got = capsys.readouterr()
    got_fields = fields(got.out)
    assert got_fields["verdict"].startswith("OK") and got_fields["steps logged"] == "6" and got.err == ""
    assert cli.main(["replay", str(run_dir), "--json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out) == {"steps": STEPS, "param_hash": finished[1]["param_hash"]} and got.err == ""


def test_a_resume_from_a_torn_log_redoes_the_step_and_checks_ok_again(run_dir, finished, capsys):
    """Reading after a crash still works: the resumed run continues from the whole steps (the
    writer cuts the torn bytes off), ends on the uninterrupted run's hash, and check says OK."""
    log = run_dir / "log.bin"
    ends = record_ends(log)
    cut_to(log, ends[-1] - 5)
    summary = sharedmodel.run(config.load(DEBUG, [f"run.out_dir={run_dir}"]), progress=False).to_dict()
    assert summary["param_hash"] == finished[1]["param_hash"]
    assert record_ends(log) == ends
    capsys.readouterr()
    assert cli.main(["check", str(run_dir)]) == 0
    got = capsys.readouterr()
    assert fields(got.out)["verdict"].startswith("OK") and got.err == ""


def test_check_refuses_a_log_cut_on_a_record_boundary_short_of_the_run(run_dir, capsys):
    """A log that ends whole but lost its last record (cut exactly on a record boundary): nothing
    is torn, yet summary.json counts 6 steps and checkpoint step_000006 lies past its end."""
    log = run_dir / "log.bin"
    cut_to(log, record_ends(log)[-2])
    want = (
        f"{log} ends after 5 whole steps, short of the run: summary.json says 6 steps, "
        "checkpoint step_000006 lies past the log's end (records lost at its end)"
    )
    assert cli.main(["check", str(run_dir)]) == 2
    got = capsys.readouterr()
    assert got.out == "" and err_lines(got.err) == [f"seedflood: error: {want}"]
    assert cli.main(["replay", str(run_dir), "--json"]) == 0  # replays the 5 steps, and says so
    got = capsys.readouterr()
    assert json.loads(got.out)["steps"] == STEPS - 1 and err_lines(got.err) == [f"seedflood: warning: {want}"]


def test_a_summary_behind_the_log_is_no_loss(run_dir, capsys):
    """A resumed run that crashed keeps its earlier summary.json, which counts fewer steps than
    the log: check still says OK (the log is not short of anything)."""
    summary = run_dir / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "steps": STEPS - 2}))
    assert cli.main(["check", str(run_dir)]) == 0
    assert fields(capsys.readouterr().out)["verdict"].startswith("OK")
