"""A YAML file the reader cannot take is one line saying why and where: an empty one (only blanks
or comments) is refused, never read as "all defaults"; a parse error names its line and column
(counted from 1, as editors count); bytes that are not UTF-8 or characters YAML forbids say where
they are. Every reader of a file (config, sweep file, topology file) gets the same lines."""

from __future__ import annotations

import pytest

from seedflood.core.config import runconfig as config
from seedflood.core.config.configerror import ConfigError
from seedflood.core.config.yamlread import EmptyDocument, parse_yaml, read_yaml
from seedflood.experiments import sweep


@pytest.mark.parametrize("text", ["", "\n\n", "   \n", "# nothing yet\n", "# a\n\n  # b\n"])
def test_an_empty_file_is_refused_as_empty_not_read_as_defaults(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        config.load(p)
    assert str(e.value) == f"{p}: the config file is empty (nothing in it but blanks or comments)"
    with pytest.raises(sweep.SweepError, match="the sweep file is empty"):
        sweep.load(p)


def test_control_an_empty_mapping_is_the_defaults_and_a_null_document_is_refused(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("{}\n")
    assert config.load(p) == config.load()  # written out: the defaults, on purpose
    for text in ("~\n", "---\n", "null\n"):
        p.write_text(text)
        with pytest.raises(ConfigError) as e:
            config.load(p)
        assert str(e.value) == f"{p}: must be a mapping of sections, got an empty document"


def test_parse_yaml_keeps_none_for_an_empty_text_unless_asked():
    assert parse_yaml("# c\n") is None  # --set values and callers that allow it
    with pytest.raises(EmptyDocument):
        parse_yaml("# c\n", empty=False)
    assert parse_yaml("a: 1\n", empty=False) == {"a": 1}


@pytest.mark.parametrize(
    "text, where",
    [
        (
            "run: {steps: 6\nmodel: x\n",
            "at line 2, column 6: expected ',' or '}', but got ':' (while parsing a flow mapping at line 1, column 6)",
        ),
        (
            "run:\n  steps: 6\n bad: 1\n",
            "at line 3, column 2: expected <block end>, but found '<block mapping start>' "
            "(while parsing a block mapping at line 1, column 1)",
        ),
        ("a: 1\nb: c: d\n", "at line 2, column 5: mapping values are not allowed here"),
        ("a: [1, 2\n", "at line 2, column 1: expected ',' or ']', but got '<stream end>'"),
        (
            "a: 1\n---\nb: 2\n",
            "at line 2, column 1: but found another document "
            "(expected a single document in the stream at line 1, column 1)",
        ),
        ("a: *nope\n", "at line 1, column 4: found undefined alias 'nope'"),
        ("a: 1\nb: x\x00y\n", "at line 2, column 5: character #x0000 is not allowed in YAML"),
    ],
)
def test_a_parse_error_names_its_line_and_column(tmp_path, text, where):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_yaml(p)
    assert str(e.value).startswith(f"{p}: not valid YAML {where}"), str(e.value)
    assert "\n" not in str(e.value)


def test_bytes_that_are_not_utf8_and_a_directory_are_one_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_bytes(b"run:\n  steps: 6\n  name: \xff\xfe\n")
    with pytest.raises(ConfigError) as e:
        read_yaml(p)
    assert str(e.value) == f"{p}: the config file is not UTF-8 text: byte 0xff at line 3, column 9"
    with pytest.raises(ConfigError, match="does not exist \\(it is a directory\\)"):
        read_yaml(tmp_path)


def test_a_bad_override_value_says_where_too():
    with pytest.raises(ConfigError) as e:
        config.load(None, ["zo.lr=[1, 2"])
    assert str(e.value).startswith("zo.lr: value '[1, 2' is not valid YAML at line 1, column 6: expected ',' or ']'")
