"""The pure core never reaches for the outside world (docs/design.md §10)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CORE = [
    "config",
    "rng",
    "directions",
    "zo",
    "message",
    "membership",
    "agreement",
    "protocol",
    "flooding",
    "replay",
    "topology",
    "gossip",
    "tensorwire",
]
FORBIDDEN = ("torch.distributed", "transformers", "datasets")
SRC = Path(__file__).resolve().parents[2] / "src" / "seedflood"


@pytest.mark.parametrize("module", CORE)
def test_core_module_source_has_no_forbidden_import(module):
    tree = ast.parse((SRC / f"{module}.py").read_text())
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
        + "".join(f"import seedflood.{m}\n" for m in CORE)
        # torch imports torch.distributed itself, so that one is guarded by the source check above.
        + "bad = [m for m in sys.modules if m.split('.')[0] in ('transformers', 'datasets')]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


DISTRIBUTED = {
    "runtime",
    "bounded",
    "gloo",
    "links",
    "attach",
    "bench_hops",
}  # the adapters, + bench_hops' bare-torch baseline


def test_only_the_adapters_import_torch_distributed():
    for path in sorted(SRC.glob("*.py")):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        if any(x.startswith("torch.distributed") for x in names):
            assert path.stem in DISTRIBUTED, f"{path.name} imports torch.distributed"
