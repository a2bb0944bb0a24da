"""launch/torchrun.sh across two hosts (network namespaces, launch/netns.sh up 2): one agent per
host, NNODES=2, the c10d rendezvous at host 0's address, gloo on each host's eth0 chosen by
GLOO_SOCKET_IFNAME, as launch/README.md's "Several machines" says to run it where a host's name
does not resolve to its cluster address (here every namespace's hostname is the machine's, which
resolves to 127.0.0.1: the case `--local-addr` and `--rdzv-conf=is_host=1` exist for).

What tests/e2e/test_netns.py does not cover: its ranks are started by hand (RANK, MASTER_ADDR);
here torchrun's own multi-node rendezvous runs between hosts, and the interface choice has its
control: without GLOO_SOCKET_IFNAME gloo binds to the address the hostname resolves to (the
loopback here), advertises it, and the run fails connecting across hosts.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import e2e_support as sup

pytestmark = pytest.mark.e2e

SUBNET = "10.77.0"  # inside the namespaces only; host h = .(10 + h)
RDZV_PORT = 29400  # in host 0's own namespace: free


def host_ip(host: int) -> str:
    return f"{SUBNET}.{10 + host}"


@pytest.fixture
def two_hosts():
    why = sup.netns_unavailable(("ip",))
    if why:
        pytest.skip(why)
    taken = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    prefix = next(p for i in range(100) if (p := f"sfh{os.getpid() % 100000}{i}") + "-" not in taken)
    env = sup.launcher_env(NETNS_PREFIX=prefix, NETNS_SUBNET=SUBNET)
    up = subprocess.run(
        ["launch/netns.sh", "up", "2"], env=env, cwd=sup.REPO, capture_output=True, text=True, timeout=60
    )
    try:
        assert up.returncode == 0, up.stderr
        yield prefix
    finally:
        subprocess.run(["launch/netns.sh", "down"], env=env, cwd=sup.REPO, capture_output=True, timeout=60)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert prefix + "-" not in left, f"namespaces left behind: {left}"


def launch(prefix: str, tmp: Path, out: Path, ifname: bool, *overrides: str) -> tuple[list[int], list[str]]:
    """launch/torchrun.sh on each host (NNODES=2); exit codes and logs of hosts 0 and 1."""
    logs = [tmp / f"host{h}.log" for h in (0, 1)]
    with sup.procs(tmp / "procs") as procs:
        procs.watch(out / "log.bin")
        for h in (0, 1):
            # --local-addr: the address this agent advertises (MASTER_ADDR of the workers when it
            # hosts rank 0); is_host: host 0 serves the rendezvous although its hostname does not
            # resolve to RDZV_ENDPOINT's address
            args = f"--local-addr={host_ip(h)}" + (" --rdzv-conf=is_host=1" if h == 0 else "")
            env = sup.launcher_env(
                NNODES="2",
                NODE_RANK=str(h),
                RDZV_ENDPOINT=f"{host_ip(0)}:{RDZV_PORT}",
                RDZV_ID=f"hosts-{os.getpid()}",
                TORCHRUN_ARGS=args,
                **({"GLOO_SOCKET_IFNAME": "eth0"} if ifname else {}),
            )
            argv = ["launch/torchrun.sh", str(sup.DEBUG_CONFIG), *sup.sets(f"run.out_dir={out}", *overrides)]
            procs.start(f"host{h}", ["ip", "netns", "exec", f"{prefix}-h{h}", *argv], env=env, log=logs[h])
        codes = procs.wait(fail_fast=True)
    return codes, [log.read_text(errors="replace") for log in logs]


@pytest.mark.timeout(1200)  # outer bound: every wait is bounded by the run's progress
def test_torchrun_across_two_hosts_on_the_interface_gloo_is_told(
    reference_hash: str, two_hosts: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    codes, logs = launch(two_hosts, tmp_path / "named", out, ifname=True)
    assert codes == [0, 0], f"exit codes {codes}:\n" + "\n".join(s[-3000:] for s in logs)
    assert "--nproc-per-node=3" in logs[0] and "--nproc-per-node=2" in logs[1]  # 5 processes: 3 + 2
    assert sup.check_run(out)["param_hash"] == reference_hash

    # control: the same launch without GLOO_SOCKET_IFNAME fails (short timeouts: it fails fast)
    codes, logs = launch(
        two_hosts,
        tmp_path / "unnamed",
        tmp_path / "run-unnamed",
        False,
        "transport.timeout_s=10",
        "transport.startup_timeout_s=30",
    )
    assert codes != [0, 0], codes
    assert any("remote=[127.0.0.1]" in s for s in logs), "\n".join(s[-3000:] for s in logs)
