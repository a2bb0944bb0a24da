"""The README's worked example ("Your own model and data") runs as written.

The README shows examples/own-data/config.yaml verbatim and tells the reader to save a model
directory with examples/own-data/save_model.py; these tests run exactly that config (only the
model is the tiny random one, saved by the same script, and the run directory is a temporary one),
so a change that breaks the example, or a README that drifts from the file, fails here.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from seedflood import cli
from seedflood.core.config import runconfig as config
from seedflood.ml import sampling as T

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "own-data"
CONFIG = EXAMPLE / "config.yaml"


def _save_model(name: str, out: Path) -> None:
    """Run examples/own-data/save_model.py's main, as `python save_model.py NAME OUT` would."""
    spec = importlib.util.spec_from_file_location("save_model", EXAMPLE / "save_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([name, str(out)]) == 0


def test_readme_shows_the_example_config_verbatim():
    readme = (REPO / "README.md").read_text()
    assert CONFIG.read_text() in readme, "README.md must embed examples/own-data/config.yaml as it is"
    assert "examples/own-data/save_model.py" in readme


def test_example_data_loads_with_the_configured_columns_and_labels(monkeypatch):
    """The csv train file and the jsonl test file give the split sizes the config asks for, with
    both labels present (label_values maps the text labels; a wrong mapping raises)."""
    monkeypatch.chdir(REPO)  # data_files are relative to the repository root, as in the README
    cfg = config.load(CONFIG)
    splits = T.load_splits(cfg.task, cfg.run.seed)
    assert (len(splits.train), len(splits.dev), len(splits.test)) == (32, 8, 12)
    for part in (splits.train, splits.test):
        assert {e.label for e in part} == {0, 1}
        assert all(e.fields["text"] for e in part)


@pytest.mark.timeout(300)
def test_the_worked_example_trains_from_a_saved_model_directory(tmp_path, monkeypatch, capsys):
    """`seedflood simulate --config examples/own-data/config.yaml` with model.name pointing at a
    directory written by save_model.py: 20 steps, 2 clients, every client equal to the evaluator."""
    monkeypatch.chdir(REPO)
    model_dir = tmp_path / "my-model"
    _save_model("tiny", model_dir)
    assert (model_dir / "config.json").is_file() and (model_dir / "tokenizer.json").is_file()
    out = tmp_path / "run"
    rc = cli.main(
        ["simulate", "--config", str(CONFIG), "--set", f"model.name={model_dir}", "--set", f"run.out_dir={out}"]
    )
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "steps 20, 2 clients on complete2" in printed
    assert "consensus: all 2 clients equal the evaluator" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["consensus"] is True and summary["clients"] == 2
    assert (out / "checkpoints" / "step_000020" / "hf" / "config.json").is_file()
