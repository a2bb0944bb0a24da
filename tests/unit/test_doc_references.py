"""Every test the documents name exists: a guarantee row or a design note that cites a test is
only as good as that test, and a rename or a removal would leave it citing nothing. Checks each
`file.py::test_name` (in a test file of that name), each bare `::test_name` (in some test file),
a trailing `*` or `_*` meaning a prefix, and each `tests/....py` path, in docs/*.md and the
READMEs (not CHANGELOG.md or docs/results/: history, which may name what is gone). Milliseconds;
no imports of the tests themselves."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [*ROOT.glob("docs/*.md"), ROOT / "README.md", ROOT / "launch" / "README.md", ROOT / "tests" / "README.md"]
)
DEF = re.compile(r"^\s*(?:async\s+)?def (test_\w+)|^class (Test\w+)", re.M)
CITED = re.compile(r"(?<![\w/])(?:(test_\w+\.py))?::(test_\w+)(\*)?")
PATH = re.compile(r"(?<![\w/.])(tests/[\w/]+\.py)")


def defined() -> dict[str, set[str]]:
    """Test file basename -> the tests it defines (basenames are unique in this suite)."""
    out: dict[str, set[str]] = {}
    for p in (ROOT / "tests").rglob("test_*.py"):
        out.setdefault(p.name, set()).update(a or b for a, b in DEF.findall(p.read_text()))
    return out


def test_every_test_a_document_names_exists() -> None:
    tests = defined()
    every = set().union(*tests.values())
    missing, checked = [], 0
    for doc in DOCS:
        text = doc.read_text()
        for m in CITED.finditer(text):
            checked += 1
            file, name, star = m.groups()
            pool = tests.get(file, set()) if file else every
            prefix = bool(star) or name.endswith("_")
            if not any(t.startswith(name) for t in pool) if prefix else name not in pool:
                missing.append(f"{doc.relative_to(ROOT)}: {file or ''}::{name}{star or ''}")
        missing += [f"{doc.relative_to(ROOT)}: {p}" for p in PATH.findall(text) if not (ROOT / p).is_file()]
    assert not missing, "documents cite tests that do not exist:\n" + "\n".join(missing)
    assert checked > 100, checked  # they cite over a hundred: a pattern that stopped matching would check none


def test_the_check_finds_a_test_that_does_not_exist() -> None:
    """The control: the patterns match what the documents write, and a made-up name fails."""
    tests = defined()
    m = CITED.search("(`test_churn.py::test_f5_a_sponsor_cut_off_from_the_others_*`)")
    assert m is not None and m.groups() == ("test_churn.py", "test_f5_a_sponsor_cut_off_from_the_others_", "*")
    assert any(t.startswith(m[2]) for t in tests["test_churn.py"])
    m = CITED.search("`test_churn.py::test_that_was_never_written`")
    assert m is not None and m[2] not in tests["test_churn.py"]
    assert PATH.findall("see `tests/unit/roles/test_churn.py` and tests/dist/test_join_gloo.py") == [
        "tests/unit/roles/test_churn.py",
        "tests/dist/test_join_gloo.py",
    ]
