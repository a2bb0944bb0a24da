"""Stage one shipment of the GPU kit on the host (run by stage.sh, from the shipment's folder).

Owns the host side of the kit: the staged home ($SEEDFLOOD_GPU_HOME, default ~/seedflood-gpu)
    kit/        every verified file of the kit, as shipments arrive
    site/       the offline install (pip --no-index --no-deps --target), first on PYTHONPATH
    launch/     the launchers and configs (launch.tar.gz)
    cache/      SEEDFLOOD_CACHE: the dequantised model, made on first load
    env.sh      the environment every later command sources
    evidence.sh the evidence command (`bash ~/seedflood-gpu/evidence.sh "$OUT"`)
    staged.json what was staged and found (versions, what does not fit)

Shipments are staged in order. Every file of this shipment is checked against the manifest's
sha256, and every file of an earlier one must already be in kit/: a missing file or a bad
checksum is one line on stderr and exit 2, before anything is copied or installed. After the
last shipment the cut files are reassembled and checked (one line, exit 2 on a mismatch), the
wheels installed offline, and one line says what was found (Python, torch, CUDA, the GPU,
transformers) and what does not fit (a shipped package's requirement the host does not meet).

Assumes: the host's python3 has torch and transformers (the image); pip is there; nothing else.
Standard library only (plus `packaging`, which pip's environments carry, for the fit check).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

MIB = 1 << 20
HERE = Path(__file__).resolve().parent


class StageError(Exception):
    """A problem that stops staging before any work: one line, exit 2."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


def home() -> Path:
    return Path(os.environ.get("SEEDFLOOD_GPU_HOME") or Path.home() / "seedflood-gpu")


def this_shipment(manifest: dict) -> int:
    """Which shipment this folder is: the one whose files it holds (a folder holds one shipment)."""
    for f in manifest["files"]:
        if (HERE / f["name"]).exists():
            return int(f["shipment"])
    raise StageError(f"{HERE} holds none of kit {manifest['kit']}'s files: ship the folder whole")


def verify(manifest: dict, index: int, kit: Path) -> None:
    """Every file of shipments 1..index is where it should be with its checksum, else StageError."""
    for f in manifest["files"]:
        if f["shipment"] > index:
            continue
        where = HERE if f["shipment"] == index else kit
        path = where / f["name"]
        if not path.is_file():
            raise StageError(
                f"missing {f['name']} of shipment {f['shipment']}: "
                + ("ship this folder whole" if where == HERE else f"stage shipment {f['shipment']} first")
            )
        if path.stat().st_size != f["bytes"] or sha256(path) != f["sha256"]:
            raise StageError(f"bad checksum: {path} is not the {f['name']} of kit {manifest['kit']}")


def reassemble(manifest: dict, kit: Path) -> None:
    """The cut files whole again, each checked against the whole file's sha256."""
    for whole in manifest["assembled"]:
        out = kit / whole["name"]
        if out.is_file() and sha256(out) == whole["sha256"]:
            continue
        tmp = out.with_suffix(out.suffix + ".tmp")
        with tmp.open("wb") as w:
            for part in whole["parts"]:
                with (kit / part).open("rb") as r:
                    shutil.copyfileobj(r, w, MIB)
        if sha256(tmp) != whole["sha256"]:
            tmp.unlink()
            raise StageError(f"bad checksum: {whole['name']} reassembled from {len(whole['parts'])} parts")
        tmp.replace(out)


def install(manifest: dict, kit: Path, root: Path) -> None:
    cut = {p for w in manifest["assembled"] for p in w["parts"]}
    wheels = sorted(
        str(kit / f["name"]) for f in manifest["files"] if f["name"].endswith(".whl") and f["name"] not in cut
    )
    wheels += [str(kit / w["name"]) for w in manifest["assembled"] if w["name"].endswith(".whl")]
    site = root / "site"
    if site.exists():
        shutil.rmtree(site)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-cache-dir",
        "--target",
        str(site),
        *wheels,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise StageError(f"offline install failed: {last[0]}")
    launch = root / "launch"
    if launch.exists():
        shutil.rmtree(launch)
    with tarfile.open(kit / "launch.tar.gz") as tar:
        tar.extractall(root, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(root)


PROBE = r"""
import json, platform, sys
info = {"python": platform.python_version()}
try:
    import torch
    info["torch"] = torch.__version__
    info["cuda"] = torch.version.cuda
    info["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    info["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
except Exception as e:
    info["torch"] = None; info["error"] = f"torch: {e}"
try:
    import transformers
    info["transformers"] = transformers.__version__
except Exception as e:
    info["transformers"] = None; info["error"] = f"transformers: {e}"
try:
    import seedflood.cli, datasets, gguf, pydantic, tensorboardX
    info["seedflood"] = seedflood.cli.__file__
except Exception as e:
    info["error"] = f"import: {type(e).__name__}: {e}"
misfits = []
try:
    import importlib.metadata as md
    from packaging.requirements import Requirement
    from packaging.markers import default_environment
    env = {**default_environment(), "extra": ""}
    for name in sys.argv[1:]:
        for text in md.requires(name) or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            try:
                found = md.version(req.name)
            except md.PackageNotFoundError:
                misfits.append(f"{name} needs {req} (not installed)")
                continue
            if req.specifier and not req.specifier.contains(found, prereleases=True):
                misfits.append(f"{name} needs {req} (found {found})")
except ImportError as e:
    misfits.append(f"fit not checked: {e}")
info["misfits"] = misfits
print(json.dumps(info))
"""


def env_for(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(root / "site"), env.get("PYTHONPATH", "")) if x)
    return env


def probe(manifest: dict, root: Path) -> dict:
    """What the host has, seen through the staged site: versions, GPU, import errors, misfits."""
    names = ["seedflood", *manifest["packages"]]
    r = subprocess.run([sys.executable, "-c", PROBE, *names], capture_output=True, text=True, env=env_for(root))
    if r.returncode != 0:
        last = r.stderr.strip().splitlines()[-1:] or ["(no output)"]
        return {"error": f"probe failed: {last[0]}", "misfits": []}
    return json.loads(r.stdout.strip().splitlines()[-1])


def write_env(root: Path) -> None:
    (root / "env.sh").write_text(
        "# sourced by evidence.sh: the staged install first on the path, offline, the model cache here\n"
        f'export PYTHONPATH="{root / "site"}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
        f'export SEEDFLOOD_CACHE="{root / "cache"}"\n'
        f'export SEEDFLOOD_LAUNCH="{root / "launch"}"\n'
        "export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false\n"
    )
    shutil.copy2(HERE / "evidence.sh", root / "evidence.sh")


def summary_line(info: dict) -> str:
    found = (
        f"Python {info.get('python')}, torch {info.get('torch')} (CUDA {info.get('cuda')}), "
        f"GPU {info.get('gpu') or 'none'}, transformers {info.get('transformers')}"
    )
    problems = [*info.get("misfits", []), *([info["error"]] if info.get("error") else [])]
    if not info.get("gpu"):
        problems.append("no CUDA device visible (the evidence runs only with --dry)")
    return f"found {found}; " + ("does not fit: " + "; ".join(problems) if problems else "everything fits")


def stage() -> int:
    manifest_path = HERE / "manifest.json"
    if not manifest_path.is_file():
        raise StageError(f"{manifest_path} is missing: ship the kit's folder whole")
    manifest = json.loads(manifest_path.read_text())
    root = home()
    kit = root / "kit"
    index = this_shipment(manifest)
    marker = root / "kit.id"
    if index > 1 and (not marker.is_file() or marker.read_text().strip() != manifest["kit"]):
        raise StageError(f"{root} holds no shipment 1 of kit {manifest['kit']}: stage shipment 1 first")
    verify(manifest, index, kit)  # everything checked before anything is copied
    if index == 1 and root.exists():
        for old in ("kit", "site", "launch", "staged.json"):
            p = root / old
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    kit.mkdir(parents=True, exist_ok=True)
    marker.write_text(manifest["kit"] + "\n")
    mine = [f for f in manifest["files"] if f["shipment"] == index]
    for f in mine:
        shutil.copy2(HERE / f["name"], kit / f["name"])
    n = manifest["shipments"]
    size = sum(f["bytes"] for f in mine) / MIB
    if index < n:
        print(
            f"stage: shipment {index} of {n} staged in {root} ({len(mine)} files, {size:.1f} MiB); next: shipment {index + 1}"
        )
        return 0
    reassemble(manifest, kit)
    install(manifest, kit, root)
    write_env(root)
    info = probe(manifest, root)
    info["kit"], info["commit"] = manifest["kit"], manifest.get("commit")
    (root / "staged.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"stage: kit {manifest['kit']} staged in {root}: {summary_line(info)}")
    print(f'stage: next: bash {root / "evidence.sh"} "$OUT"')
    return 1 if info.get("error") else 0


def main() -> int:
    try:
        return stage()
    except StageError as e:
        print(f"stage: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
