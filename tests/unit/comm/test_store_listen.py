"""`seedflood store --host H` listens on H only (runtime.serve_store hands TCPStore a socket it
bound: TCPStore's own server listens on every interface whatever its host says), still serves
the store, and a port it cannot have is one line, exit 2. Linux: the listening sockets are read
from /proc/net/tcp{,6}."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from procs import env as harness_env
from procs import free_port

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc/net/tcp (Linux)")


def listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} write them) that listen on `port`."""
    out = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(name):
            continue
        for line in Path(name).read_text().splitlines()[1:]:
            fields = line.split()
            address, hexport = fields[1].split(":")
            if fields[3] == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                out.add(address)
    return out


def store(host: str, port: int) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, "-m", "seedflood", "store", "--host", host, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=harness_env(),
    )
    assert p.stdout is not None
    line = p.stdout.readline()  # blocks until it listens, or the process ends
    assert f"listening on {host}:{port}" in line, line + p.stdout.read()
    return p


@pytest.mark.timeout(120)
def test_the_store_listens_on_its_host_only():
    loopback, anywhere = free_port(), free_port()
    a, b = store("127.0.0.1", loopback), store("0.0.0.0", anywhere)
    try:
        assert listening(loopback) == {"0100007F"}  # 127.0.0.1 only: not 0.0.0.0, not ::
        assert listening(anywhere) == {"00000000"}  # the control: every IPv4 interface
        client = dist.TCPStore("127.0.0.1", loopback, is_master=False, timeout=timedelta(seconds=30))
        client.set("k", "v")
        assert client.get("k") == b"v"
    finally:
        for p in (a, b):
            p.kill()
            p.wait(timeout=30)


@pytest.mark.timeout(120)
def test_a_port_in_use_is_one_line():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        p = subprocess.run(
            [sys.executable, "-m", "seedflood", "store", "--host", "127.0.0.1", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            env=harness_env(),
        )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"seedflood: error: seedflood store cannot listen on 127.0.0.1:{port}: address already in use"
    )
