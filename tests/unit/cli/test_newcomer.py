"""The command a newcomer holds: `--version`, `seedflood config` (a run's resolved config as
YAML), the help grouped by what a user is doing, the old names kept for a release with a
one-line notice, and one `--budget` unit (seconds, with m/h suffixes; reproduce's bare minutes
still read as before, with a notice)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from seedflood import cli
from seedflood.core.config import runconfig as config
from seedflood.experiments import budget

pytestmark = pytest.mark.timeout(300)
DEBUG = Path(__file__).parents[3] / "launch" / "configs" / "debug.yaml"


def test_version_names_the_package_and_torch(capsys) -> None:
    from importlib import metadata

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"seedflood {metadata.version('seedflood')} (torch {metadata.version('torch')}")


def test_config_prints_a_config_with_its_sets_resolved(capsys) -> None:
    assert cli.main(["config", str(DEBUG), "--set", "zo.lr=0.25", "--set", "eval.trackers=[mlflow]"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    expected = config.load(DEBUG, ["zo.lr=0.25", "eval.trackers=[mlflow]"]).to_dict()
    assert printed == expected and printed["zo"]["lr"] == 0.25 and printed["eval"]["trackers"] == ["mlflow"]
    assert printed["topology"]["nodes"] == 4 and "subspace" in printed  # every default filled in


def test_config_of_a_run_directory_is_its_recorded_config(tmp_path: Path, capsys) -> None:
    recorded = config.load(DEBUG, [f"run.out_dir={tmp_path}", "run.seed=11"])
    (tmp_path / "config.yaml").write_text(config.dump(recorded))
    assert cli.main(["config", str(tmp_path)]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == recorded.to_dict()
    assert cli.main(["config", str(tmp_path), "--set", "run.seed=12"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["run"]["seed"] == 12


def test_config_of_a_directory_that_is_no_run_is_one_line(tmp_path: Path, capsys) -> None:
    assert cli.main(["config", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"seedflood: error: {tmp_path}: a directory without config.yaml (not a run directory)"
    ]


def test_help_lists_every_command_once_under_its_group() -> None:
    text = cli.build_parser().format_help()
    heads = [line for line in text.splitlines() if line.rstrip(":") in cli.GROUPS and line.endswith(":")]
    assert heads == [f"{g}:" for g in cli.GROUPS]
    listed = [line.split()[0] for line in text.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    commands = [n for names in cli.GROUPS.values() for n in names]
    assert [n for n in listed if n in commands] == commands  # each once, in group order
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    hidden = set(sub.choices) - set(commands) - set(cli.ALIASES) - set(cli.RENAMED)
    assert hidden == set(), f"commands missing from the grouped help: {hidden}"


@pytest.mark.parametrize(
    "old, new",
    [
        (["eval", "RUN", "--json"], ["replay", "--score", "RUN", "--json"]),
        (["sweep-summary", "FILE", "--format", "tsv"], ["sweep", "FILE", "--format", "tsv", "--summary"]),
        (["replay", "RUN"], ["replay", "RUN"]),
    ],
)
def test_an_old_name_becomes_its_new_spelling_with_one_line(old, new) -> None:
    argv, said = cli._renamed(old)
    assert argv == new
    assert len(said) == (old[0] in cli.RENAMED) and all(line.startswith("seedflood: notice: `") for line in said)


def test_an_old_name_refused_says_only_the_refusal(tmp_path: Path, capsys) -> None:
    """Bad input stays one line: the notice comes only after a command that succeeded."""
    assert cli.main(["eval", str(tmp_path), "--json"]) == 2
    assert capsys.readouterr().err == f"seedflood: error: {tmp_path} is not a run directory (no log.bin)\n"


def test_the_old_eval_still_scores_a_run_as_replay_score(tmp_path: Path) -> None:
    """A real run: `eval` and `replay --score` print the same scores (the notice on stderr only)."""
    out = tmp_path / "run"
    base = [sys.executable, "-m", "seedflood"]
    sim = subprocess.run(
        [*base, "simulate", "--config", str(DEBUG), "--set", f"run.out_dir={out}", "--set", "run.steps=2"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert sim.returncode == 0, sim.stderr
    old = subprocess.run([*base, "eval", str(out), "--json"], capture_output=True, text=True, timeout=240)
    new = subprocess.run([*base, "replay", "--score", str(out), "--json"], capture_output=True, text=True, timeout=240)
    assert old.returncode == new.returncode == 0, old.stderr + new.stderr
    assert old.stdout == new.stdout and '"accuracy"' in new.stdout
    assert "notice: `eval` is now `replay --score`" in old.stderr and "notice" not in new.stderr
    plain = subprocess.run([*base, "replay", str(out), "--json"], capture_output=True, text=True, timeout=240)
    assert '"accuracy"' not in plain.stdout  # the control: without --score no scores


@pytest.mark.parametrize("text, s", [("540", 540.0), ("9m", 540.0), ("0.15h", 540.0), ("540s", 540.0), ("1e3", 1000.0)])
def test_a_budget_is_seconds_with_units(text: str, s: float) -> None:
    assert budget.seconds(text) == pytest.approx(s)


def test_a_bare_budget_in_minutes_is_read_as_before_with_a_notice(capsys) -> None:
    budget.NOTICES.clear()
    assert budget.seconds("30", bare_minutes=True, command="reproduce") == 1800.0
    (line,) = budget.NOTICES
    assert line.startswith("seedflood: notice: reproduce --budget 30 is read as minutes") and "30m" in line
    assert budget.seconds("30m", bare_minutes=True, command="reproduce") == 1800.0
    assert budget.seconds("1800", command="gpu-evidence") == 1800.0
    assert len(budget.NOTICES) == 1  # with its unit, or where seconds were the unit: no notice
    cli._notices([])  # what the CLI does after a command that succeeded
    assert capsys.readouterr().err == line + "\n" and budget.NOTICES == []


@pytest.mark.parametrize("text", ["0", "-3", "soon", "5 minutes", "nan", "inf"])
def test_a_bad_budget_is_one_line(text: str) -> None:
    with pytest.raises(budget.BudgetError, match="^--budget must be"):
        budget.seconds(text)
