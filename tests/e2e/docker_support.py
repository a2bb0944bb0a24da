"""A docker daemon for the compose tests (tests/e2e/test_compose_docker.py): whether one answers,
the image built from the working tree once per session, and a compose project's containers,
logs, runs volume and leftovers, found by the labels compose v1 (docker-compose 1.29) and v2
both set.

Without a daemon those tests skip and say why, except under CI (CI=true): there .ci/setup-e2e.sh
installs and starts one, so its absence is a broken CI and the tests fail.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

import e2e_support as sup

IMAGE = "seedflood:cpu"  # what docker/build.sh and the compose files name by default
OFFLINE_BASE = "seedflood-base:bookworm"  # docker/base.sh's
PROJECT = "com.docker.compose.project"
SERVICE = "com.docker.compose.service"
# One build at a time across the pytest workers: the first builds, the others find every layer cached.
BUILD_LOCK = Path(tempfile.gettempdir()) / "seedflood-docker-build.lock"
BUILD_STALL_S = 900.0  # a build step may print nothing for minutes (copying the 2 GB venv)


def docker(
    *args: str, timeout: float = 120, check: bool = True, stdin: bytes | None = None
) -> subprocess.CompletedProcess:
    """`docker ARGS`, output captured (text unless `stdin` is bytes); asserts exit 0 with `check`."""
    r = subprocess.run(["docker", *args], input=stdin, capture_output=True, timeout=timeout)
    if check:
        assert r.returncode == 0, (
            f"docker {' '.join(args)}: {r.stdout.decode(errors='replace')}{r.stderr.decode(errors='replace')}"
        )
    return r


def out(*args: str, **kw: Any) -> str:
    return docker(*args, **kw).stdout.decode(errors="replace")


def compose_command() -> list[str] | None:
    """The Makefile's choice: `docker compose` (v2) when the plugin answers, else docker-compose."""
    if shutil.which("docker") and docker("compose", "version", check=False, timeout=30).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


def unavailable() -> str | None:
    """Why no compose project can run on a daemon here, or None."""
    if not shutil.which("docker"):
        return "no docker command (bash .ci/setup-e2e.sh installs docker.io)"
    r = docker("info", "-f", "{{.ServerVersion}}", check=False, timeout=60)
    if r.returncode != 0:
        said = (r.stderr.decode(errors="replace").strip().splitlines() or ["no answer"])[-1]
        return f"no docker daemon answers ({said}); bash .ci/setup-e2e.sh starts one"
    if compose_command() is None:
        return "neither `docker compose` (v2) nor docker-compose (v1) is installed"
    return None


def require() -> None:
    """Skip (fail under CI=true) when no daemon and compose are there."""
    why = unavailable()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true, and {why}", pytrace=False)
        pytest.skip(why)


def exists(image: str) -> bool:
    return docker("image", "inspect", image, check=False).returncode == 0


def build_image(log: Path) -> None:
    """docker/build.sh from the working tree (layers cached after the first time). Without a
    base image to build on here (the offline one or python:3.11-slim) docker/base.sh makes the
    offline one first (root and debootstrap; .ci/setup-e2e.sh does this in CI)."""
    env = sup.launcher_env()
    with open(BUILD_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not exists(OFFLINE_BASE) and not exists("python:3.11-slim"):
            sup.run_checked(["bash", "docker/base.sh"], env=env, log=log, stall_s=BUILD_STALL_S)
        sup.run_checked(["bash", "docker/build.sh", IMAGE], env=env, log=log, stall_s=BUILD_STALL_S)


def image_with(base: str, files: dict[Path, str]) -> str:
    """A throwaway image: `base` with each file written at its absolute path (a run config the
    host's preflight reads at the same path). Remove it with `remove_image`."""
    tag = f"seedflood-test:{uuid.uuid4().hex[:12]}"
    lines = [f"FROM {base}"]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i, (path, text) in enumerate(files.items()):
            assert path.is_absolute(), path
            data = text.encode()
            info = tarfile.TarInfo(f"f{i}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
            lines.append(f"COPY f{i} {path}")
        dockerfile = ("\n".join(lines) + "\n").encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    docker("build", "-q", "-t", tag, "-", stdin=buf.getvalue(), timeout=600)
    return tag


def remove_image(tag: str) -> None:
    docker("image", "rm", "-f", tag, check=False)


def project_name(what: str) -> str:
    """A project of this test alone: its containers, network and volume carry the name."""
    return f"sf-{what}-{uuid.uuid4().hex[:8]}"


def containers(project: str, service: str | None = None) -> list[str]:
    """Ids of the project's containers (of one service), stopped ones too."""
    filters = ["--filter", f"label={PROJECT}={project}"]
    if service:
        filters += ["--filter", f"label={SERVICE}={service}"]
    return out("ps", "-aq", "--no-trunc", *filters).split()


def inspect(ids: list[str]) -> list[dict[str, Any]]:
    return json.loads(out("inspect", *ids)) if ids else []


def states(project: str) -> dict[str, dict[str, Any]]:
    """service -> the State of its container (one container per service in these files)."""
    found = {}
    for c in inspect(containers(project)):
        found[c["Config"]["Labels"][SERVICE]] = {**c["State"], "RestartCount": c["RestartCount"], "Id": c["Id"]}
    return found


def logs(project: str, service: str) -> str:
    """The service's container output (stdout and stderr), all its lives."""
    (cid,) = containers(project, service)
    r = docker("logs", cid, timeout=120)
    return r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")


def network_internal(project: str) -> bool:
    (net,) = out(
        "network",
        "ls",
        "-q",
        "--filter",
        "label=com.docker.compose.network=default",
        "--filter",
        f"label={PROJECT}={project}",
    ).split()
    return json.loads(out("network", "inspect", net))[0]["Internal"] is True


def fetch_runs(project: str, image: str, dest: Path) -> Path:
    """Copy the project's `runs` volume into `dest` (owned by this user, so readable here and
    removed with the test's temporary directory), through a container of `image` that reaches
    no network; returns dest."""
    volume = f"{project}_runs"
    dest.mkdir(parents=True, exist_ok=True)
    r = docker(
        "run",
        "--rm",
        "--network",
        "none",
        "-v",
        f"{volume}:/runs:ro",
        "--entrypoint",
        "tar",
        image,
        "-c",
        "-C",
        "/runs",
        ".",
        timeout=300,
    )
    with tarfile.open(fileobj=io.BytesIO(r.stdout), mode="r:") as tar:
        tar.extractall(dest, filter="data")  # no owners, no device files, nothing outside dest
    return dest


def leftovers(project: str) -> list[str]:
    """Whatever of the project the daemon still has: containers (running or not), volumes and
    networks, by compose's label or by the project's name prefix."""
    label = f"label={PROJECT}={project}"
    found = [f"container {c}" for c in out("ps", "-aq", "--filter", label).split()]
    found += [f"container {n}" for n in out("ps", "-a", "--format", "{{.Names}}").split() if n.startswith(project)]
    for kind in ("volume", "network"):
        names = out(kind, "ls", "--format", "{{.Name}}").split()
        found += [f"{kind} {n}" for n in out(kind, "ls", "-q", "--filter", label).split()]
        found += [f"{kind} {n}" for n in names if n.startswith(project)]
    return sorted(set(found))


def remove_project(project: str) -> None:
    """Remove what is left of a project by force (a failed test's cleanup; `down -v` is the test)."""
    with contextlib.suppress(Exception):
        ids = out("ps", "-aq", "--filter", f"label={PROJECT}={project}").split()
        if ids:
            docker("rm", "-f", "-v", *ids, check=False)
        for kind in ("network", "volume"):
            for name in out(kind, "ls", "-q", "--filter", f"label={PROJECT}={project}").split():
                docker(kind, "rm", name, check=False)
