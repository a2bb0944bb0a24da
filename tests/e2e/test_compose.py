"""docker/compose.yaml without a docker daemon: it validates offline (as written and rendered by
docker/scale.py for other N) and has the shape the launch needs; `local_commands` maps its
services to local processes (tests/e2e/test_compose_churn.py's emulated restart policy runs them).

On a real daemon, `make compose-up` runs the file itself: tests/e2e/test_compose_docker.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import e2e_support as sup

pytestmark = pytest.mark.e2e

COMPOSE = sup.REPO / "docker" / "compose.yaml"
SCALE = sup.REPO / "docker" / "scale.py"


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default} and $$, recursively."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, default = m.group(1), m.group(2), m.group(3) or ""
        if op == ":-":
            return env.get(name) or default
        if op == "-":
            return env.get(name, default)
        return env.get(name, "")

    return re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}", sub, value)


def services(path: Path = COMPOSE, env: dict[str, str] | None = None) -> dict[str, dict]:
    doc = yaml.safe_load(path.read_text())
    return interpolate(doc["services"], env or {})


def _validators() -> list[list[str]]:
    out = []
    if shutil.which("docker-compose"):
        out.append(["docker-compose", "-f", "-", "config", "-q"])
    if shutil.which("check-jsonschema"):
        # stdin has no file name to tell its type by; check-jsonschema assumes JSON without this
        out.append(["check-jsonschema", "--builtin-schema", "vendor.compose-spec", "--default-filetype", "yaml", "-"])
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("clients", [4, 2, 7])
def test_compose_file_validates_offline(clients: int) -> None:
    validators = _validators()
    if not validators:
        pytest.skip("neither docker-compose (Debian) nor check-jsonschema (PyPI) is installed; run .ci/setup-e2e.sh")
    if clients == 4:
        text = COMPOSE.read_text()
    else:
        text = subprocess.run(
            [sys.executable, str(SCALE), str(clients)], capture_output=True, text=True, check=True, timeout=60
        ).stdout
        svc = yaml.safe_load(text)["services"]
        assert sorted(svc) == sorted(["evaluator", *(f"client{i}" for i in range(1, clients + 1))])
        assert {s["environment"]["WORLD_SIZE"] for s in svc.values()} == {str(clients + 1)}
        assert all(f"topology.nodes={clients}" in s["command"] for s in svc.values())
    for argv in validators:
        r = subprocess.run(argv, input=text, capture_output=True, text=True, timeout=60, cwd=COMPOSE.parent)
        assert r.returncode == 0, f"{argv[0]}: {r.stdout}{r.stderr}"


def test_compose_file_shape() -> None:
    svc = services()
    ranks = sorted(int(s["environment"]["RANK"]) for s in svc.values())
    world = {s["environment"]["WORLD_SIZE"] for s in svc.values()}
    assert ranks == list(range(len(svc))) and world == {str(len(svc))}
    assert svc["evaluator"]["environment"]["RANK"] == "0"
    assert {s["environment"]["MASTER_ADDR"] for s in svc.values()} == {"evaluator"}
    assert all(s["volumes"] for s in svc.values()), "every service mounts the runs volume"
    # the run's containers reach nothing outside their own network (tested on a daemon too)
    assert yaml.safe_load(COMPOSE.read_text())["networks"] == {"default": {"internal": True}}


def local_commands(
    tmp: Path, port: int, path: Path = COMPOSE, env: dict[str, str] | None = None
) -> list[tuple[str, list[str], dict[str, str]]]:
    """(service, argv, env) for every service of `path`, mapped from container to this machine;
    `env` is what ${VAR} in the file sees (the shell compose would be started from)."""
    svc = services(path, env)
    hostnames = set(svc) | {s.get("hostname") for s in svc.values() if s.get("hostname")}
    cmds = []
    for name, s in svc.items():
        mounts = {}
        for vol in s.get("volumes", []):
            source, target = vol.split(":")[:2]
            mounts[target] = tmp / source
        workdir = s.get("working_dir", "/")

        def to_local(arg: str) -> str:
            for target, local in mounts.items():
                arg = arg.replace(target, str(local))
            if arg.startswith(workdir + "/"):
                arg = str(sup.REPO / arg[len(workdir) + 1 :])
            return arg

        argv = [to_local(a) for a in [*s["entrypoint"], *s["command"]]]
        assert argv[:3] == ["python", "-m", "seedflood"], argv
        argv[:3] = [sys.executable, "-m", sup.MODULE]
        env = {k: str(v) for k, v in s["environment"].items()}
        if env.get("MASTER_ADDR") in hostnames:
            env["MASTER_ADDR"] = "127.0.0.1"
        env["MASTER_PORT"] = str(port)
        cmds.append((name, argv, env))
    return cmds
