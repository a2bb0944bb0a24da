"""`make readme-figures` (seedflood.bench.readme): the README holds one first-run block, and
rewriting it replaces that block alone. The first run itself is `make try`, which CI runs and
times (.ci/run); its launched path is tested in tests/e2e/test_torchrun.py."""

from __future__ import annotations

from pathlib import Path

from seedflood.bench import readme

REPO = Path(__file__).resolve().parents[3]


def test_the_readme_has_one_first_run_block_with_its_provenance():
    text = (REPO / "README.md").read_text()
    assert text.count(readme.BEGIN) == 1 and text.count(readme.END) == 1
    inside = text.split(readme.BEGIN)[1].split(readme.END)[0]
    assert "consensus: all 4 clients equal the evaluator" in inside
    assert "`make readme-figures` at " in inside and "CPU-s" in inside


def test_write_replaces_the_block_and_nothing_else(tmp_path, monkeypatch):
    target = tmp_path / "README.md"
    target.write_text(f"# head\n{readme.BEGIN}\nold\n{readme.END}\ntail\n")
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(readme, "first_run", lambda out: (["consensus: all 4 clients equal"], 12.3, 45.6))
    assert readme.main(["--write", str(target)]) == 0
    new = target.read_text()
    assert new.startswith("# head\n") and new.endswith(f"{readme.END}\ntail\n") and "old" not in new
    assert "12 s wall, 46 CPU-s" in new and "consensus: all 4 clients equal" in new


def test_a_readme_without_the_block_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    target = tmp_path / "README.md"
    target.write_text("# no block\n")
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(readme, "first_run", lambda out: ([], 1.0, 1.0))
    assert readme.main(["--write", str(target)]) == 2
    assert target.read_text() == "# no block\n"
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
