"""The pure core never reaches for the outside world (docs/architecture.md, Layers).

The package layering itself is import-linter's contracts in pyproject.toml (`make lint`); these
tests add what import-linter cannot see: submodules of an external package (torch.distributed),
what importing the core loads at run time, and private names taken across modules."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CORE_DIR = Path(__file__).resolve().parents[3] / "src" / "seedflood" / "core"
CORE = sorted(  # dotted names under seedflood.core: "flood.flooding", "zo.subcge", ...
    ".".join(p.relative_to(CORE_DIR).with_suffix("").parts) for p in CORE_DIR.rglob("*.py") if p.stem != "__init__"
)
FORBIDDEN = ("torch.distributed", "transformers", "datasets")
SRC = Path(__file__).resolve().parents[3] / "src" / "seedflood"


@pytest.mark.parametrize("module", CORE)
def test_core_module_source_has_no_forbidden_import(module):
    tree = ast.parse((SRC / "core" / f"{module.replace('.', '/')}.py").read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            assert not name.startswith(FORBIDDEN), f"{module}.py imports {name}"


def test_importing_the_core_loads_none_of_them():
    code = (
        "import sys\n"
        + "".join(f"import seedflood.core.{m}\n" for m in CORE)
        # torch imports torch.distributed itself, so that one is guarded by the source check above.
        + "bad = [m for m in sys.modules if m.split('.')[0] in ('transformers', 'datasets')]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# the transports, bench/hops' bare-torch baseline, and what `seedflood launch` preloads into its
# fork server (imported there so the ranks share its pages, never called)
DISTRIBUTED = ("comm/", "bench/hops.py", "cli/preload.py")


def _imported_names(tree: ast.AST) -> list[str]:
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    return names + [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]


def test_only_the_transports_import_torch_distributed():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if any(x.startswith("torch.distributed") for x in _imported_names(ast.parse(path.read_text()))):
            assert rel.startswith(DISTRIBUTED), f"{rel} imports torch.distributed"


def test_no_private_name_is_taken_across_modules():
    """`from seedflood.x import _y` or `x._y` on an imported seedflood module couples two modules
    through a name the owner may change at will: shared names are public, in the owner's API."""
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        modules = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("seedflood"):
                for a in n.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        bad.append(f"{path.relative_to(SRC)}: from {n.module} import {a.name}")
                    modules.add(a.asname or a.name)
            elif isinstance(n, ast.Import):
                modules |= {a.asname or a.name for a in n.names if a.name.startswith("seedflood")}
        for n in ast.walk(tree):
            if (
                isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.value.id in modules
                and n.attr.startswith("_")
                and not n.attr.startswith("__")
            ):
                bad.append(f"{path.relative_to(SRC)}: {n.value.id}.{n.attr}")
    assert bad == []


def test_the_core_modules_are_found():
    """The checks above are parametrized by CORE: an empty list would pass them all."""
    assert len(CORE) >= 20 and "flood.flooding" in CORE, CORE
