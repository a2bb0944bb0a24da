"""Reading YAML for configs, sweep files and topology files.

Owns: `read_yaml(path)` and `parse_yaml(text)`: PyYAML's SafeLoader plus the YAML 1.2 floats
without a dot (`1e-3`, which PyYAML's YAML 1.1 would read as text), refusing a key written twice
in one mapping (`DuplicateKey`, naming its dotted path and both lines); `read_yaml` also refuses
a file with no document in it (empty, or only blanks and comments: never "all defaults") and
says where YAML it cannot parse goes wrong (`where`: line and column, counted from 1).

Assumes nothing about the environment: pure Python + yaml.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from yaml.reader import ReaderError

from seedflood.core.config.configerror import ConfigError


class _Loader(yaml.SafeLoader):
    """SafeLoader + the YAML 1.2 floats YAML 1.1 reads as text: 1e-3, 2E5, 1.5e3, .5e-2."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?|[-+]?\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


class DuplicateKey(yaml.YAMLError):
    """A key written twice in one YAML mapping; `key` is its dotted path in the document."""

    def __init__(self, key: str, line: int, first: int) -> None:
        super().__init__(f"duplicate key '{key}' at line {line} (first at line {first})")
        self.key, self.line, self.first = key, line, first


def _check_duplicates(node: yaml.Node, path: str, seen: set[int]) -> None:
    """Raise DuplicateKey for the first mapping in `node` that names a scalar key twice."""
    if id(node) in seen:  # an alias: already walked (and recursive anchors must not loop)
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_line: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            child = path
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                child = f"{path}.{key_node.value}" if path else str(key_node.value)
                ident = (key_node.tag, key_node.value)
                line = key_node.start_mark.line + 1
                if ident in first_line:
                    raise DuplicateKey(child, line, first_line[ident])
                first_line[ident] = line
            _check_duplicates(value_node, child, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(item, f"{path}[{i}]", seen)


class EmptyDocument(yaml.YAMLError):
    """A YAML text that holds no document: nothing, or only blanks and comments."""


def parse_yaml(text: str, path: str = "", *, empty: bool = True) -> Any:
    """One YAML document read with `_Loader`; keys are named under `path`. A text without one is
    None, or EmptyDocument when not `empty`."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            if not empty:
                raise EmptyDocument("no YAML document")
            return None
        _check_duplicates(node, path, set())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def where(e: yaml.YAMLError, text: str) -> str:
    """What PyYAML found wrong and where, in one line: "at line L, column C: problem (context at
    line l, column c)", lines and columns counted from 1 as editors count them."""

    def at(mark: yaml.Mark | None) -> str:
        return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""

    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        problem = e.problem or e.context or "unreadable"
        context = f" ({e.context}{at(e.context_mark)})" if e.problem and e.context else ""
        return f"{at(mark)}: {problem}{context}"
    if isinstance(e, ReaderError):  # a character YAML does not allow: where it is
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        char = f"#x{e.character:04x}" if isinstance(e.character, int) else repr(e.character)
        return f" at line {line}, column {column}: character {char} is not allowed in YAML"
    return f": {str(e).splitlines()[0] if str(e) else type(e).__name__}"


def read_yaml(path: str | Path, what: str = "config file", error: type[Exception] = ConfigError) -> Any:
    """The parsed YAML document at `path`; a missing or unreadable file, one that is not UTF-8
    text, an empty one, bad YAML (with its line and column) or a key written twice in one mapping
    raises `error` in one line. Floats like `1e-3` read as floats (YAML 1.2)."""
    p = Path(path)
    if not p.is_file():
        raise error(f"{what} {str(p)!r} does not exist" + (" (it is a directory)" if p.is_dir() else ""))
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise error(f"{p}: cannot read the {what}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1  # in bytes
        bad = raw[e.start : e.start + 1].hex()
        raise error(f"{p}: the {what} is not UTF-8 text: byte 0x{bad} at line {line}, column {column}") from None
    try:
        return parse_yaml(text, empty=False)
    except EmptyDocument:
        raise error(f"{p}: the {what} is empty (nothing in it but blanks or comments)") from None
    except DuplicateKey as e:
        raise error(f"{p}: line {e.line}: duplicate key '{e.key}' (first at line {e.first})") from None
    except yaml.YAMLError as e:
        raise error(f"{p}: not valid YAML{where(e, text)}") from None
