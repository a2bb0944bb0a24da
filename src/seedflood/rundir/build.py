"""The build a run's scalars are computed with, recorded beside its log, and the refusal of a
process that would continue the run on another one.

Applying a step is exact (`core/zo/replay.py`); computing its scalar is not: another instruction
set (torch's CPU capability, MKL's and oneDNN's), another thread count or other library versions
change the last bits of a loss, so a run continued on another build is no longer the run it began
as (README, "What is exact and what depends on the CPU"). Owns:
- `current`: this process's build: SeedFlood's version, Python's, the versions of the libraries
  whose kernels compute a scalar (`LIBRARIES`), a digest of every installed distribution
  (`packages`: the first 16 hex of sha256 over their sorted NAME-VERSION.dist-info names), torch's CPU
  capability, its intra-op threads, model.device and model.dtype (and the GPU, on cuda);
- build.json (`BUILD`) in the run directory: the build that made the run, written by rank 0 (or
  `seedflood simulate`) when a run starts, or when a run recorded before builds were
  (`from_step` > 0) resumes;
- `settle`: rank 0's decision on resume: the recorded build against its own (CheckpointError, one
  line naming both, on a difference in `COMPARED`; a one-line notice when none is recorded);
- `refusal`: the same comparison for any other process (a client at start, a restart rejoining,
  a new id joining) against the run's build that rank 0 broadcasts.
Only `COMPARED` can refuse: `python` and `packages` are recorded for the reader (a new tqdm
changes no bit); a run that mixes kinds of CPU (`mixed`: trust.audit_tolerance > 0) lets `KIND`
differ. `ALLOW` (SEEDFLOOD_ANY_BUILD=1) turns a refusal into a one-line warning.

May import: seedflood (its version); rundir's atomic and layout. torch is imported by `current`
only.

Assumes: every process of a run has the same build (one machine type; run.threads set, or the
same CPUs per process): one record speaks for the run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import sysconfig
from importlib import metadata
from typing import Any

from seedflood.rundir.atomic import atomic_write_text
from seedflood.rundir.layout import CheckpointError, RunDir

log = logging.getLogger(__name__)

BUILD = "build.json"
LIBRARIES = ("torch", "numpy", "transformers", "gguf")
"""The libraries whose kernels or parsing compute a scalar (the loss's arithmetic, the weights)."""
COMPARED = ("seedflood", *LIBRARIES, "cpu_capability", "threads", "device", "dtype", "gpu")
"""What a resume or rejoin must match: each changes the scalars' last bits (threads too: docs/trust.md)."""
ALLOW = "SEEDFLOOD_ANY_BUILD"
KIND = ("cpu_capability", "threads")
"""What a run that mixes kinds of CPU (trust.audit_tolerance > 0, docs/trust.md, Mixed hardware)
lets differ between its processes: its audits are measured to tolerate exactly these."""


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _packages() -> str:
    """The first 16 hex of sha256 over the installed distributions' metadata folder names
    (NAME-VERSION.dist-info) in the environment's site-packages, sorted: the whole installed set,
    in ~1 ms where reading each one's metadata (importlib.metadata) took ~0.2 s a process."""
    dirs = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    names = sorted(
        e for d in dirs if os.path.isdir(d) for e in os.listdir(d) if e.endswith((".dist-info", ".egg-info"))
    )
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


def current(device: str, dtype: str) -> dict[str, Any]:
    """This process's build (see the module doc); call it once its threads are set."""
    import torch

    from seedflood import __version__

    build: dict[str, Any] = {
        "seedflood": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,  # the local label (+cpu, +cu128) names the wheel
        **{name: _version(name) for name in LIBRARIES[1:]},
        "packages": _packages(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "device": device,
        "dtype": dtype,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        build["gpu"] = f"{torch.cuda.get_device_name(torch.device(device))}, CUDA {torch.version.cuda}"
    return build


def show(build: dict[str, Any]) -> str:
    """The build in a few words: "seedflood 0.1.0, torch 2.13.0+cpu, ..., AVX512, 1 thread, cpu float32"."""
    parts = [f"{k} {build[k]}" for k in ("seedflood", *LIBRARIES) if k in build]
    if "cpu_capability" in build:
        parts.append(str(build["cpu_capability"]))
    if "threads" in build:
        parts.append(f"{build['threads']} thread{'s' if build['threads'] != 1 else ''}")
    parts.append(" ".join(str(build[k]) for k in ("device", "dtype", "gpu") if k in build))
    return ", ".join(p for p in parts if p)


def differs(run: dict[str, Any], mine: dict[str, Any], mixed: bool = False) -> list[str]:
    """One "key (run's -> mine)" per `COMPARED` key the two builds hold different values of (a key
    absent on either side, from an older or newer record, is unknown: not a difference; with
    `mixed`, the `KIND` keys are not compared)."""
    return [
        f"{k} ({run[k]} -> {mine[k]})"
        for k in COMPARED
        if k in run and k in mine and json.dumps(run[k]) != json.dumps(mine[k]) and not (mixed and k in KIND)
    ]


def refusal(run: dict[str, Any] | None, mine: dict[str, Any], what: str, mixed: bool = False) -> str | None:
    """The one line refusing a process whose build differs from the run's (None: the same build, a
    run recorded before builds were, or ALLOW set, which logs the line as a warning). `what` names
    the run in the line."""
    if run is None or not (diff := differs(run, mine, mixed)):
        return None
    line = (
        f"{what} was made by another build: {show(run)}; this process: {show(mine)} "
        f"(differs: {', '.join(diff)}); run it where the run's build is, use a new run.out_dir, "
        f"or set {ALLOW}=1 to continue on this one"
    )
    if os.environ.get(ALLOW, "") not in ("", "0"):
        log.warning("%s was made by another build (differs: %s): continuing (%s is set)", what, ", ".join(diff), ALLOW)
        return None
    return line


def read(run: RunDir) -> dict[str, Any] | None:
    """The run directory's recorded build (None: none recorded). CheckpointError for a damaged one."""
    path = run.root / BUILD
    if not path.is_file():
        return None
    try:
        build = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not readable as JSON ({e})") from None
    if not isinstance(build, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return build


def write(run: RunDir, build: dict[str, Any]) -> None:
    atomic_write_text(run.root / BUILD, json.dumps(build, indent=1, sort_keys=True) + "\n")


def settle(run: RunDir, mine: dict[str, Any], logged: int, mixed: bool = False) -> dict[str, Any]:
    """Rank 0's decision, once its log's settings are accepted (resume.resume_records): the run's
    build, which every other process is checked against. A new run (no log) records `mine`; a run
    with a log must have been made by `mine` (CheckpointError, one line, nothing written); one
    recorded before builds were is continued with a one-line notice, and `mine` is recorded as
    the build from its `logged` steps on."""
    if not run.log.is_file():
        write(run, mine)
        return mine
    recorded = read(run)
    if recorded is None:
        log.warning(
            "note: %s records no build (made before SeedFlood recorded one): continued unchecked from step %d on %s",
            run.root,
            logged,
            show(mine),
        )
        recorded = {**mine, "from_step": logged}
        write(run, recorded)
        return recorded
    if line := refusal(recorded, mine, str(run.root), mixed):
        raise CheckpointError(line)
    return recorded
