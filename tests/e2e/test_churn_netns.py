"""Churn between emulated hosts: a network cut mid-run, as opposed to a killed process.

1 evaluator + 4 clients on a ring, one per network namespace (launch/netns.sh up), a churn run
(`churn.settle=1`, docs/churn-design.md, Between emulated hosts) with a short `transport.timeout_s`. Mid-run, nftables
rules silently drop packets (no RST, no ICMP: the peers see silence, not a closed socket):
1. between the hosts of ring neighbours 1 and 2, both ways: the ring stays connected, so the
   two ends drop that edge (heartbeat silence) and flood around it; nobody leaves, every client
   ends on the evaluator's hash and `seedflood replay` of the log reproduces it;
2. everything on one client's host (node 2, not the evaluator's attach node 0): the others drop
   it, decide that it left and finish; it is alone, a minority, and stops with exit 1 and one
   "no reachable majority agrees" line; summary.json and the log's membership record name it.

The processes are started here, not by `netns.sh run`, which stops every rank at the first
non-zero exit (case 2 expects one). Rank r runs on host r (`netns.sh exec r`: GLOO_SOCKET_IFNAME
=eth0), the store is rank 0's, on host 0. The cut lands once a few steps are in log.bin, as in
tests/dist/test_churn_gloo.py; every wait is bounded by the run's progress (tests/procs.py) and
the namespaces go in `finally`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import e2e_support as sup
import runs
from seedflood.rundir.logfile import LogReader

pytestmark = pytest.mark.e2e

NODES = 4  # clients on the debug config's ring; the evaluator attaches to node 0
WORLD = NODES + 1
STEPS = 150  # ~25 steps/s unloaded: the cut (after CUT_AFTER) lands with 140 steps (~6 s) of the run left
SUBNET = "10.77.0"  # inside the namespaces only (netns.sh's default); host of rank r = .(10 + r)
LINK = (1, 2)  # ring edge cut in case 1 (the ring 0-1-2-3-0 stays connected without it)
VICTIM = 2  # node cut off in case 2 (node 0, the attach node, is covered by test_churn_gloo.py)
CUT_AFTER = 10  # step records logged before the cut (about half a second of the run)
SETS = (
    f"run.steps={STEPS}",
    "run.hash_steps=true",
    "churn.settle=1",
    "transport.timeout_s=3",
    "eval.every=0",
    "checkpoint.every=100",
)


def rank_of(node: int) -> int:
    return node + 1


def host_ip(rank: int) -> str:
    return f"{SUBNET}.{10 + rank}"


def _free_prefix() -> str:
    """A namespace prefix (<= 12 characters) no namespace on this machine uses yet."""
    taken = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for i in range(100):
        prefix = f"sfc{os.getpid() % 100000}{i}"
        if prefix + "-" not in taken:
            return prefix
    raise AssertionError(f"no free namespace prefix among: {taken}")


class Hosts:
    """The namespaces of one run (netns.sh up/down: one per rank), its processes, and the cuts."""

    def __init__(self, tmp: Path, nodes: int = NODES, sets: tuple[str, ...] = SETS) -> None:
        self.nodes, self.world, self.sets = nodes, nodes + 1, sets
        self.prefix = _free_prefix()
        self.env = sup.launcher_env(NETNS_PREFIX=self.prefix, NETNS_SUBNET=SUBNET)
        self.procs = sup.procs(tmp / "procs")
        self.logs = [tmp / f"rank{r}.log" for r in range(self.world)]

    def netns(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["launch/netns.sh", *args], env=self.env, cwd=sup.REPO, capture_output=True, text=True, timeout=60
        )

    def up(self) -> None:
        r = self.netns("up", str(self.world))
        assert r.returncode == 0, r.stderr

    def start(self, out: Path) -> None:
        """One `seedflood train` per host, explicit rendezvous on host 0 (as netns.sh run does)."""
        train = [sys.executable, "-m", "seedflood", "train", "--config", str(sup.DEBUG_CONFIG)]
        sets = [a for s in (f"run.out_dir={out}", *self.sets) for a in ("--set", s)]
        world = {
            "WORLD_SIZE": str(self.world),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": host_ip(0),
            "MASTER_PORT": str(sup.free_port()),  # a port inside host 0's own namespace
            "PYTHONUNBUFFERED": "1",
        }
        for r in range(self.world):
            self.procs.start(
                f"rank{r}",
                ["launch/netns.sh", "exec", str(r), "env", f"RANK={r}", *train, *sets],
                env={**self.env, **world},
                log=self.logs[r],
            )

    def nft(self, rank: int, rules: str) -> None:
        """Add a table of drop rules to the host of `rank` (before netns.sh's loss table)."""
        r = subprocess.run(
            ["ip", "netns", "exec", f"{self.prefix}-h{rank}", "nft", "-f", "-"],
            input=rules,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0, f"nft in host {rank}: {r.stderr}"

    def cut_link(self, a: int, b: int) -> None:
        """Drop every packet between the hosts of ranks a and b, both ways, at both ends."""
        for me, other in ((a, b), (b, a)):
            ip = host_ip(other)
            self.nft(
                me,
                "table inet seedflood_cut {\n"
                f"  chain input {{ type filter hook input priority -10; ip saddr {ip} drop; }}\n"
                f"  chain output {{ type filter hook output priority -10; ip daddr {ip} drop; }}\n"
                "}\n",
            )

    def cut_off(self, rank: int) -> None:
        """Drop every packet in and out of the host of `rank` on its link to the switch."""
        self.nft(
            rank,
            "table inet seedflood_cut {\n"
            '  chain input { type filter hook input priority -10; iifname "eth0" drop; }\n'
            '  chain output { type filter hook output priority -10; oifname "eth0" drop; }\n'
            "}\n",
        )

    def text(self, rank: int) -> str:
        return self.logs[rank].read_text(errors="replace") if self.logs[rank].is_file() else ""

    def logs_text(self, n: int = 20) -> str:
        """The last n lines of every rank's log (progress-bar redraws and gloo noise left out)."""
        out = []
        for r in range(self.world):
            lines = self.text(r).replace("\r", "\n").splitlines()
            kept = [x for x in lines if x and "debug_logger" not in x and "step/s" not in x]
            out.append(f"--- rank {r}\n" + "\n".join(kept[-n:]))
        return "\n".join(out)

    def close(self) -> None:
        self.procs.close()
        self.netns("down")
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert self.prefix + "-" not in left, f"namespaces left behind: {left}"


def _hosts(entry: str, tmp_path: Path, **kw):
    if entry != "seedflood":
        pytest.skip("churn needs the real `seedflood train` (the probe has no churn)")
    why = sup.netns_unavailable(("ip", "nft"))
    if why:
        pytest.skip(why)
    h = Hosts(tmp_path, **kw)
    try:
        h.up()
        yield h
    finally:
        h.close()


@pytest.fixture
def hosts(entry: str, tmp_path: Path):
    yield from _hosts(entry, tmp_path)


RING8_STEPS = 100  # 9 processes step at about half the rate: 90 steps (~7 s) after the cut
RING8 = (*SETS, "topology.nodes=8", "flood.hops_per_step=1", f"run.steps={RING8_STEPS}")


@pytest.fixture
def ring8(entry: str, tmp_path: Path):
    """F1 of the one-history issue: a ring of 8 clients, one hop per step."""
    yield from _hosts(entry, tmp_path, nodes=8, sets=RING8)


# The normal run takes well under a minute. A cut-off client reads the store (on host 0, out of
# its reach) between steps; each read is bounded by transport.timeout_s (bounded.BoundedStore),
# so it finds itself alone within seconds: without that bound it sat in one read until TCP gave
# up (about 15 minutes) with nothing logged: the wait's stall bound (180 s, tests/procs.py) fails
# it (the CI failure of stop 15). DEADLINE_S is only pytest-timeout's outer bound.
DEADLINE_S = 900


def run_with_cut(hosts: Hosts, out: Path, cut) -> list[int]:
    """Start the run, apply `cut(hosts)` once a few steps are logged, wait for every process."""
    hosts.start(out)
    runs.wait_for_steps(hosts.procs, out, CUT_AFTER)
    cut(hosts)
    assert all(hosts.procs.running(f"rank{r}") for r in range(hosts.world)), "the run ended before the cut"
    return hosts.procs.wait()


@pytest.mark.timeout(DEADLINE_S)
def test_a_cut_link_on_a_ring_is_survived_like_a_crash_of_that_edge(hosts: Hosts, tmp_path: Path) -> None:
    out = tmp_path / "link"
    a, b = (rank_of(n) for n in LINK)
    codes = run_with_cut(hosts, out, lambda h: h.cut_link(a, b))
    text = hosts.logs_text()
    assert codes == [0] * WORLD, f"exit codes {codes}:\n{text}"
    # the cut was seen: each end dropped the other (and only that edge: nobody else lost a peer)
    assert f"lost peer node {LINK[1]}" in hosts.text(a), text
    assert f"lost peer node {LINK[0]}" in hosts.text(b), text
    for r in range(1, WORLD):
        if r not in (a, b):
            assert "lost peer" not in hosts.text(r), text
    s = sup.read_summary(out)
    assert s["left"] == [] and not s["membership_changes"], s["membership_changes"]
    assert s["client_hashes"] == [s["param_hash"]] * NODES and s["consensus"], s["client_hashes"]
    steps = s["client_step_hashes"]
    assert all(hs == steps[0] for hs in steps) and len(steps[0]) == STEPS
    reader = LogReader(out / "log.bin")
    _, records = reader.read()
    assert len(records) == STEPS and not reader.changes
    assert sup.replay(out) == {"steps": STEPS, "param_hash": s["param_hash"]}


@pytest.mark.timeout(DEADLINE_S)
def test_a_host_cut_off_is_survived_like_a_crash_and_stops_itself(hosts: Hosts, tmp_path: Path) -> None:
    out = tmp_path / "node"
    victim = rank_of(VICTIM)
    codes = run_with_cut(hosts, out, lambda h: h.cut_off(victim))
    text = hosts.logs_text()
    assert [c for r, c in enumerate(codes) if r != victim] == [0] * (WORLD - 1), f"exit codes {codes}:\n{text}"
    assert codes[victim] == 1, f"exit codes {codes}:\n{text}"
    stops = [x for x in hosts.text(victim).splitlines() if "no reachable majority agrees" in x]
    assert len(stops) == 1 and f"node {VICTIM}:" in stops[0], text
    s = sup.read_summary(out)
    assert s["left"] == [VICTIM], s["membership_changes"]
    assert s["client_hashes"][VICTIM] is None
    survivors = [h for n, h in enumerate(s["client_hashes"]) if n != VICTIM]
    assert survivors == [s["param_hash"]] * (NODES - 1) and s["consensus"], s["client_hashes"]
    steps = [hs for n, hs in enumerate(s["client_step_hashes"]) if n != VICTIM]
    assert all(hs == steps[0] for hs in steps) and len(steps[0]) == STEPS
    reader = LogReader(out / "log.bin")
    _, records = reader.read()
    assert len(records) == STEPS
    ((step, change),) = reader.changes.items()
    assert change.leave == (VICTIM,) and 0 < step < STEPS
    assert f"step {step}: leave {VICTIM}" in s["membership_changes"][0]
    assert sup.replay(out) == {"steps": STEPS, "param_hash": s["param_hash"]}


@pytest.mark.timeout(DEADLINE_S)
def test_f1_a_cut_link_on_a_ring_of_eight_with_one_hop_per_step_forks_nothing(ring8: Hosts, tmp_path: Path) -> None:
    """The cut ring's diameter (7) exceeds the vote lag (4 steps of 1 hop), so the clients'
    proposals differ for a while after the cut: ballots settle them, nobody leaves, and every
    client ends on the evaluator's hash (the rule before majority commits forked this run into
    five states)."""
    out = tmp_path / "ring8"
    a, b = rank_of(0), rank_of(1)
    codes = run_with_cut(ring8, out, lambda h: h.cut_link(a, b))
    text = ring8.logs_text()
    assert codes == [0] * ring8.world, f"exit codes {codes}:\n{text}"
    s = sup.read_summary(out)
    assert s["left"] == [] and not s["membership_changes"], s["membership_changes"]
    assert s["client_hashes"] == [s["param_hash"]] * ring8.nodes and s["consensus"], s["client_hashes"]
    steps = s["client_step_hashes"]
    assert all(hs == steps[0] for hs in steps) and len(steps[0]) == RING8_STEPS
    assert sup.replay(out) == {"steps": RING8_STEPS, "param_hash": s["param_hash"]}
