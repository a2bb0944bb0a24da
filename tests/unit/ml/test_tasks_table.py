"""The generic `table` task (your own jsonl/csv), template/verbalizer overrides, and their errors."""

from __future__ import annotations

import dataclasses
import json

import pytest

from seedflood.core.config import runconfig as config
from seedflood.core.config.configerror import ConfigError
from seedflood.core.config.trainsections import TaskConfig
from seedflood.ml import datafiles, encoding, sampling, tasks
from seedflood.ml.sources import tiny_tokenizer

ROWS = [  # (review, title, stars); stars "pos"/"NEG" in mixed case on purpose
    ("Loved every minute", "Great", "pos"),
    ("Dull, slow and long", "Meh", "NEG"),
    ('He said "wow"', "Wow", "pos"),
    ("Not for me", "No", "neg"),
    ("A classic", "Yes", "Pos"),
    ("Two hours lost", "Bad", "neg"),
]


def table_cfg(files: dict[str, str], **kw) -> TaskConfig:
    base = {
        "name": "table",
        "data_files": files,
        "template": "{title}: {review} It was",
        "candidates": [" bad", " good"],
        "label_field": "stars",
        "label_values": ["neg", "pos"],
        "train_examples": 6,
        "dev_examples": 0,
        "test_examples": 6,
    }
    return TaskConfig(**{**base, **kw})


def want_texts() -> list[tuple[str, int]]:
    """Hand-rendered: the template filled in, and the label index of each row."""
    return sorted((f"{t}: {r} It was", ["neg", "pos"].index(s.lower())) for r, t, s in ROWS)


def rendered(cfg: TaskConfig, examples) -> list[tuple[str, int]]:
    spec = tasks.get(cfg)
    return sorted((spec.template(e.fields), e.label) for e in examples)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_jsonl_round_trip(tmp_path, tok):
    path = tmp_path / "reviews.jsonl"
    path.write_text("\n".join(json.dumps({"review": r, "title": t, "stars": s, "extra": 1}) for r, t, s in ROWS))
    cfg = table_cfg({"train": str(path), "test": str(path)})
    s = sampling.load_splits(cfg, 0)
    assert rendered(cfg, s.test) == want_texts() and len(s.train) == 6
    assert set(s.test[0].fields) == {"review", "title"}  # only the template's columns are read
    batch = encoding.encode(s.test, tasks.get(cfg), tok, 64)
    ids, mask, _ = batch.expand()
    first = tok.decode(ids[0][mask[0].bool()], skip_special_tokens=True)
    assert first == rendered(cfg, s.test[:1])[0][0] + " bad" and batch.n_candidates == 2


def test_csv_round_trip_with_one_file_and_integer_labels(tmp_path):
    path = tmp_path / "reviews.csv"
    lines = ["review,title,stars"] + [
        f'"{r.replace(chr(34), 2 * chr(34))}",{t},{int(s.lower() == "pos")}' for r, t, s in ROWS
    ]
    path.write_text("\n".join(lines) + "\n")
    cfg = table_cfg({"train": str(path)}, label_values=[], train_examples=4, test_examples=2)
    s = sampling.load_splits(cfg, 0)  # no test file: test is carved out of train, disjoint
    assert (len(s.train), len(s.test)) == (4, 2)
    assert rendered(cfg, s.train + s.test) == want_texts()


def test_label_values_map_raw_values_in_their_order(tmp_path):
    def labels(values, label_values):
        path = tmp_path / "t.jsonl"
        path.write_text("\n".join(json.dumps({"x": str(i), "y": v}) for i, v in enumerate(values)))
        cfg = table_cfg({"train": str(path), "test": str(path)}, template="{x}", label_field="y")
        cfg = dataclasses.replace(cfg, label_values=label_values, test_examples=len(values))
        return [e.label for e in sorted(sampling.load_splits(cfg, 0).test, key=lambda e: int(e.fields["x"]))]

    assert labels([1, 0, 1], ["1", "0"]) == [0, 1, 0]  # the listed order decides, not the value
    assert labels([True, False], ["FALSE", "true"]) == [1, 0]  # booleans read as true/false, any case
    assert labels([1.0, 0.0], ["0", "1"]) == [1, 0]  # an integral float reads as an integer
    assert labels(["Pos ", "neg"], ["neg", "pos"]) == [1, 0]  # stripped, case-insensitive
    assert labels([1, 0], []) == [1, 0] and labels(["1", "0"], []) == [1, 0]  # no values: 0..C-1
    assert labels([True, False], []) == [1, 0] and labels([1.0, 0.0], []) == [1, 0]
    with pytest.raises(datafiles.TaskError, match=r"row 1: label 2 is not one of 0..1$"):
        labels([0, 2], [])
    with pytest.raises(datafiles.TaskError, match=r"row 0: label 'x' is not one of a, b \(task.label_values\)$"):
        labels(["x"], ["a", "b"])


def test_text_fields_are_cut_and_others_are_not(tmp_path, tok):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"a": "abcdefghijkl", "b": "mnopqrstuvwx", "label": 0}) + "\n")
    cfg = table_cfg({"train": str(path), "test": str(path)}, template="{a}|{b}", label_field="label", label_values=[])
    cut = dataclasses.replace(cfg, text_fields=["b"])
    (e,) = sampling.load_splits(cut, 0).test
    batch = encoding.encode([e], tasks.get(cut), tok, 4)  # byte tokenizer: 4 tokens = 4 characters
    assert tok.decode(batch.input_ids[0], skip_special_tokens=True) == "abcdefghijkl|mnop"
    batch = encoding.encode([e], tasks.get(cfg), tok, 4)  # default: every column the template names
    assert tok.decode(batch.input_ids[0], skip_special_tokens=True) == "abcd|mnop"


def test_overrides_of_a_registered_task(tok):
    cfg = TaskConfig(name="sst2", template="Review: {sentence}\nSentiment:", candidates=[" negative", " positive"])
    spec = tasks.get(cfg)
    assert spec.template({"sentence": "Fine."}) + spec.candidates[1] == "Review: Fine.\nSentiment: positive"
    assert spec.loader is tasks.TASKS["sst2"].loader and spec.truncate == ("sentence",)
    assert tasks.get(TaskConfig(name="sst2")) == tasks.TASKS["sst2"]  # no override: MeZO's own


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["task.name=table", "task.candidates=[' a', ' b']"], "task.template: is required for task table"),
        (["task.name=table", "task.template='{text}'"], "task.candidates: is required for task table"),
        (["task.template='no slots'"], "task.template: names no {column}, got 'no slots'"),
        (
            ["task.name=table", "task.template='{label}'", "task.candidates=[' a', ' b']"],
            "task.template: must not show the label column",
        ),
        (["task.template='{text'"], "task.template: expected '}' before end of string in '{text'"),
        (["task.template='{} x'"], "task.template: slots must name a column, got '{} x'"),
        (["task.template='{0}'"], "task.template: slots must name a column"),
        (["task.template='{t!r}'"], "task.template: slot {t} must be a plain column name"),
        (["task.template='{t.x}'"], "task.template: slot {t.x} must be a plain column name"),
        (["task.candidates=[' a']"], "task.candidates: needs at least 2 strings"),
        (["task.candidates=[' a', '']"], "task.candidates: must not hold an empty string"),
        (["task.candidates=[' a', ' a']"], "task.candidates: must be distinct"),
        (["task.candidates=' a'"], "task.candidates: must be a list of str, got ' a'"),
        (["task.template='{a}'", "task.text_fields=[b]"], "task.text_fields: ['b'] not named in task.template"),
        (["task.text_fields=['']"], "task.text_fields: must not hold an empty string"),
        (["task.label_field=''"], "task.label_field: must not be empty"),
        (["task.label_values=[Pos, pos]"], "task.label_values: must be distinct (case-insensitively)"),
        (["task.label_values=[no, yes]"], "task.label_values[0]: must be a string, got False"),  # YAML 1.1: quote them
        (
            ["task.candidates=[' a', ' b']", "task.label_values=[x, y, z]"],
            "task.label_values: has 3 values but task.candidates has 2",
        ),
        (["task.split=random"], "task.split: must be one of iid, dirichlet; got 'random'"),
        (["task.alpha=0"], "task.alpha: must be > 0, got 0"),
        (["task.alpha=.inf"], "task.alpha: must be a finite number"),
    ],
)
def test_bad_keys_are_one_line_config_errors(overrides, message):
    with pytest.raises(ConfigError) as info:
        config.load(None, overrides)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (TaskConfig(name="rt", text_fields=[]), None),
        (TaskConfig(name="rt", template="{sentence}", text_fields=["sentence"]), "task.text_fields: only task table"),
        (TaskConfig(name="rt", label_values=["a", "b"]), "task.label_values: only task table reads it"),
        (TaskConfig(name="rt", label_field="y"), "task.label_field: only task table reads it"),
        (TaskConfig(name="cb", candidates=[" y", " n"]), "task.candidates: task cb has 3 labels, got 2"),
        (TaskConfig(name="copa", candidates=[" y", " n"]), "task.candidates: task copa takes its candidates"),
    ],
)
def test_keys_a_task_cannot_use_are_one_line_task_errors(cfg, message):
    if message is None:
        tasks.get(cfg)
        return
    with pytest.raises(datafiles.TaskError) as info:
        tasks.get(cfg)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_table_data_errors(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"review": "a", "title": "b", "stars": "meh"}) + "\n")
    cases = [
        ({}, r"^task table reads your files: set task.data_files: \{train: FILE, test: FILE\}.*got keys none$"),
        ({"test": str(path)}, r"got keys test$"),
        ({"train": str(path)}, r"row 0: label 'meh' is not one of neg, pos \(task.label_values\)$"),
    ]
    for files, message in cases:
        with pytest.raises(datafiles.TaskError, match=message):
            sampling.load_splits(table_cfg(files), 0)
    with pytest.raises(datafiles.TaskError, match=r"missing column grade"):
        sampling.load_splits(table_cfg({"train": str(path)}, label_field="grade"), 0)
    with pytest.raises(datafiles.TaskError, match=r"build its spec with tasks.get\(cfg.task\)"):
        tasks.get("table").template({})


def test_preflight_catches_a_template_naming_a_missing_field():
    cfg = TaskConfig(name="synthetic", template="{review} It was", train_examples=4, dev_examples=0, test_examples=2)
    with pytest.raises(
        datafiles.TaskError, match=r"^task synthetic: task.template: template '\{review\} It was' names 'review'"
    ):
        sampling.check(cfg, 0, 2)
