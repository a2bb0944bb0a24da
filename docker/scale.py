"""Render docker/compose.yaml for N clients: `python docker/scale.py N | docker compose -f - up`.

compose.yaml spells out the evaluator and clients client1..client4; this copies client1 as the
template for client1..clientN, sets WORLD_SIZE = N + 1 everywhere and topology.nodes = N in every
command, and makes the build context absolute so the output works from any directory (stdin).
Needs pyyaml (in the project's venv). Prints the YAML on stdout.
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def scale(doc: dict, n: int) -> dict:
    """A copy of the parsed compose document with n client services."""
    if n < 1:
        raise ValueError(f"N must be >= 1, got {n}")
    doc = copy.deepcopy(doc)
    services = doc["services"]
    template = services["client1"]
    clients = [name for name in services if re.fullmatch(r"client\d+", name)]
    for name in clients:
        del services[name]
    for rank in range(1, n + 1):
        svc = copy.deepcopy(template)
        svc["environment"] = {**svc["environment"], "RANK": str(rank)}
        services[f"client{rank}"] = svc
    for svc in services.values():
        svc["environment"] = {**svc["environment"], "WORLD_SIZE": str(n + 1)}
        svc["command"] = [re.sub(r"^topology\.nodes=\d+$", f"topology.nodes={n}", str(a)) for a in svc["command"]]
        build = svc.get("build")
        if isinstance(build, dict) and "context" in build:
            build["context"] = str((HERE / build["context"]).resolve())
    # Anchors were only there to be merged; drop the extension keys from the output.
    return {k: v for k, v in doc.items() if not k.startswith("x-")}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python docker/scale.py N  (number of clients)", file=sys.stderr)
        return 2
    doc = yaml.safe_load((HERE / "compose.yaml").read_text())
    sys.stdout.write(yaml.safe_dump(scale(doc, int(argv[1])), sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
