"""The built wheel works outside the source tree: it carries every module and the named topologies.

Builds a wheel from a copy of what the Docker image copies (setup.cfg, pyproject.toml, README.md,
src/, topologies/), so the working tree gets no build/ or *.egg-info, installs it with
`pip install --target` into a temporary directory, and imports it from there in a subprocess whose
working directory is outside the repository. Assumes pip and setuptools (>= 70.1, which builds
wheels itself; in the dev extras) in the running interpreter; nothing is downloaded
(--no-build-isolation, --no-index).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COPIED = ("setup.cfg", "pyproject.toml", "README.md", "src", "topologies")

# Run in the installed copy: the named graph by name (`seedflood topology show ring16`) and a
# `topology.kind: file` config naming the bare file, both resolved from the installed package.
PROBE = """
import json, seedflood
from seedflood.core.topology import resolve as topology
from seedflood.core.topology import topofiles
from seedflood.core.config.systemsections import TopologyConfig
spec = topology.parse_spec("ring16")
by_file = topology.build(TopologyConfig(kind="file", nodes=16, file="ring16.yaml"))
print(json.dumps({
    "module": seedflood.__file__,
    "dir": str(topofiles.TOPOLOGY_DIR),
    "spec_file": spec.file,
    "spec": [spec.kind, spec.nodes, topology.build(spec).name, topology.build(spec).diameter],
    "by_file": [by_file.name, by_file.n, len(by_file.edges)],
}))
"""


def _pip(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, f"pip {' '.join(args)}: {r.stdout[-2000:]}{r.stderr[-2000:]}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("packaging")
    project = root / "project"
    project.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, project / name, ignore=skip)
        else:
            shutil.copy2(src, project / name)
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(root / "dist"), str(project))
    (built,) = (root / "dist").glob("seedflood-*.whl")
    return built


def test_wheel_carries_modules_and_topologies(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {
        f"seedflood/{p.relative_to(REPO / 'src' / 'seedflood').as_posix()}"
        for p in (REPO / "src" / "seedflood").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert modules <= names, f"missing from the wheel: {sorted(modules - names)}"
    shipped = {f"seedflood/topologies/{p.name}" for p in (REPO / "topologies").glob("*.yaml")}
    assert "seedflood/topologies/ring16.yaml" in shipped
    assert shipped <= names, f"missing from the wheel: {sorted(shipped - names)}"


@pytest.mark.timeout(120)
def test_installed_wheel_finds_named_topologies(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    _pip("install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # PYTHONPATH comes before site-packages, so the copy in `target` shadows the editable install.
    env = {**os.environ, "PYTHONPATH": str(target), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert Path(out["module"]).is_relative_to(target), f"imported {out['module']}, not the wheel in {target}"
    assert Path(out["dir"]) == target / "seedflood" / "topologies"
    assert Path(out["spec_file"]) == target / "seedflood" / "topologies" / "ring16.yaml"
    assert out["spec"] == ["file", 16, "ring16", 8]
    assert out["by_file"] == ["ring16", 16, 16]


def test_the_readme_test_command_collects_every_test_file(request: pytest.FixtureRequest) -> None:
    """`make test` runs pytest on `tests`: every test file under it must be collected (pytest's
    default norecursedirs holds "dist", and so skipped tests/dist until pyproject.toml said not to).
    When this session is that command and its items hold every file, that is the answer (a second
    collection cost ~30 s of CI); otherwise (another command, a -k filter) a subprocess collects."""
    files = {str(f.relative_to(REPO)) for f in (REPO / "tests").rglob("test_*.py")}
    collected = {item.nodeid.split("::")[0] for item in request.session.items}
    if [Path(a).resolve() for a in request.config.args] != [REPO / "tests"] or files - collected:
        p = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        collected = {line.split("::")[0] for line in p.stdout.splitlines() if "::" in line}
    assert files - collected == set(), sorted(files - collected)
    assert any(f.startswith("tests/dist/") for f in collected)
