"""Reading YAML for configs, sweep files and topology files.

Owns: `read_yaml(path)` and `parse_yaml(text)`: PyYAML's SafeLoader plus the YAML 1.2 floats
without a dot (`1e-3`, which PyYAML's YAML 1.1 would read as text), refusing a key written twice
in one mapping (`DuplicateKey`, naming its dotted path and both lines).

Assumes nothing about the environment: pure Python + yaml.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

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


def parse_yaml(text: str, path: str = "") -> Any:
    """One YAML document (None if empty) read with `_Loader`; keys are named under `path`."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_duplicates(node, path, set())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml(path: str | Path, what: str = "config file", error: type[Exception] = ConfigError) -> Any:
    """The parsed YAML document at `path`; a missing file, bad YAML or a key written twice in one
    mapping raises `error` in one line. Floats like `1e-3` read as floats (YAML 1.2)."""
    p = Path(path)
    if not p.is_file():
        raise error(f"{what} {str(p)!r} does not exist")
    try:
        return parse_yaml(p.read_text())
    except DuplicateKey as e:
        raise error(f"{p}: line {e.line}: duplicate key '{e.key}' (first at line {e.first})") from None
    except yaml.YAMLError as e:
        raise error(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from None
