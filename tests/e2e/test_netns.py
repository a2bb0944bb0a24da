"""Five hosts on one machine (network namespaces, a bridge, capped and lossy links).

1 evaluator + 4 clients, one per namespace with its own IP, 20 Mbit/s per link and direction,
2% packet loss per link and direction; the run must finish with the loopback run's hashes.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import e2e_support as sup

pytestmark = pytest.mark.e2e


@pytest.fixture
def netns_prefix():
    why = sup.netns_unavailable(("ip", "tc", "nft"))
    if why:
        pytest.skip(why)
    prefix = f"sf{os.getpid() % 100000}"
    env = sup.launcher_env(NETNS_PREFIX=prefix)
    yield prefix
    subprocess.run(["launch/netns.sh", "down"], env=env, cwd=sup.REPO, capture_output=True, timeout=60)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert prefix + "-" not in left, f"namespaces left behind: {left}"


@pytest.mark.timeout(1200)  # an outer bound: the wait is bounded by the run's progress
def test_five_hosts_capped_lossy_links_match_loopback(reference_hash: str, netns_prefix: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = sup.launcher_env(NETNS_PREFIX=netns_prefix, RATE="20mbit", LOSS="2", MASTER_PORT=str(sup.free_port()))
    log = tmp_path / "netns.log"
    sup.run_checked(
        ["launch/netns.sh", "run", str(sup.DEBUG_CONFIG), *sup.sets(f"run.out_dir={out}")],
        env=env,
        log=log,
        watch=[out / "log.bin"],
    )
    text = log.read_text()
    assert "5 hosts" in text and "loss 2%" in text and "rate 20mbit" in text, sup.tail(log)
    summary = sup.check_run(out)
    assert summary["param_hash"] == reference_hash
