"""The README's debug hashes by instruction set ("What is exact and what depends on the CPU").

The table between the README's `<!-- debug-hashes -->` markers gives, per ATEN_CPU_CAPABILITY
setting, the final hash of `seedflood simulate --config launch/configs/debug.yaml` (equal to the
launched run's: tests/dist/test_simulate_gloo.py). For every setting this CPU offers (torch's own
pick with the variable unset, and every lower x86-64 level) the run is made in a fresh interpreter
(torch reads the variable when it loads; the forked test processes' torch loaded before it was
set) and its hash compared with the row, so the README and the measurement cannot drift. The rows
differ from each other: were the variable ignored, at most one of them could pass. And `seedflood
replay` of the best level's log at avx2 gives the best level's hash, not avx2's (applying is exact).

Assumes: x86-64 (the rows are its levels; elsewhere the test skips) and the CPU lock installed
(`make install`): another torch, numpy or transformers may change every row.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys

import pytest

import procs
import runs
from seedflood.ml.machine import cpu_model
from seedflood.rundir import build

README = procs.REPO / "README.md"
LEVELS = ("default", "avx2", "avx512")  # ATEN_CPU_CAPABILITY's x86-64 settings, lowest first
ROW = re.compile(r"^\| ([^|`]+?) \| `ATEN_CPU_CAPABILITY=(\w+)` \| (\w+) \| `([0-9a-f]{16})` \|$", re.M)
# Variables that pick other libraries' instruction sets: left out, so a row is the setting alone.
ISA_VARS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR")


def tables() -> dict[str, dict[str, tuple[str, str]]]:
    """{CPU model: {setting: (what torch reports, hash)}} from the README's debug-hashes block."""
    text = README.read_text()
    block = re.search(r"<!-- debug-hashes -->\n(.*?)<!-- /debug-hashes -->", text, re.S)
    assert block, "README.md has no <!-- debug-hashes --> ... <!-- /debug-hashes --> block"
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for cpu, level, reported, h in ROW.findall(block.group(1)):
        out.setdefault(cpu.strip(), {})[level] = (reported, h)
    return out


def clean_env(**extra: str) -> dict[str, str]:
    env = procs.env(**extra)
    for name in ISA_VARS:
        if name not in extra:
            env.pop(name, None)
    return env


def best() -> str:
    """The ATEN_CPU_CAPABILITY setting torch picks on this CPU with the variable unset."""
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().lower()


def test_the_table_has_one_distinct_hash_per_level():
    for cpu, rows in tables().items():
        assert sorted(rows) == sorted(LEVELS[: len(rows)]), (cpu, rows)  # the CPU's levels, lowest first
        assert len({h for _, h in rows.values()}) == len(rows), f"{cpu}: two settings with one hash"
        assert all(reported == level.upper() for level, (reported, _) in rows.items())


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the rows are x86-64 levels")
@pytest.mark.timeout(900)
def test_the_debug_run_ends_on_the_readme_hash_at_every_level_the_cpu_offers(tmp_path):
    top = best()
    assert top in LEVELS, f"torch picks {top!r} on this x86-64 CPU"
    offered = LEVELS[: LEVELS.index(top) + 1]
    rows = tables().get(cpu_model())
    if rows is None:
        pytest.skip(f"README.md has no debug hashes for this CPU ({cpu_model()!r}): measure them and add its rows")
    got = {}
    for level in offered:
        out = tmp_path / level
        argv = [sys.executable, "-m", "seedflood", "simulate", "--config", str(runs.DEBUG)]
        argv += ["--set", f"run.out_dir={out}"]
        # a fresh interpreter, not procs.run's fork: torch must load with the variable set
        sim = subprocess.run(
            argv, capture_output=True, text=True, env=clean_env(ATEN_CPU_CAPABILITY=level), cwd=procs.REPO, timeout=600
        )
        assert sim.returncode == 0, sim.stderr[-3000:]
        last = json.loads((out / "build.json").read_text())
        assert last["cpu_capability"] == rows[level][0], last  # the setting took effect
        got[level] = json.loads((out / "summary.json").read_text())["param_hash"][:16]  # as printed
    want = {level: rows[level][1] for level in offered}
    assert got == want, f"README's table: {want}; measured: {got} with {build.show(last)} (the locked versions?)"
    # replay is exact: the best level's log on avx2 (same base weights) gives its hash; where avx2 is
    # the best level this CPU offers (an EPYC VM without AVX-512) there is no other level to replay on
    if top != "avx2" and "avx2" in offered:
        rep = subprocess.run(
            [sys.executable, "-m", "seedflood", "replay", str(tmp_path / top), "--json"],
            capture_output=True,
            text=True,
            env=clean_env(ATEN_CPU_CAPABILITY="avx2"),
            cwd=procs.REPO,
            timeout=600,
        )
        assert rep.returncode == 0, rep.stderr[-3000:]
        assert json.loads(rep.stdout)["param_hash"][:16] == rows[top][1] != rows["avx2"][1]
