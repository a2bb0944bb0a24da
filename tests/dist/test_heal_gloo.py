"""Healed gloo edges (docs/churn-design.md, Healed edges).

The transport (`EdgeSet.heal`, `restore`): two processes drop their edge at one exchange, their
clocks drift apart (one jumps ahead, as a stalled client's would not, the other hops alone at
another pace), each asks to heal before every exchange, and both restore the edge right before
one exchange index: every frame after it carries the sender's exchange index, and each side
checks it equals its own (a heal agreed at two indices would pair frames of different
exchanges). Twice, so a second heal of one edge takes a new round and a new gloo pair.

A launched churn run: 1 evaluator + 4 clients on a ring as processes, `churn.settle: 2`, a 2 s
hop timeout. Nodes 1 and 3 (the ring's two non-adjacent clients) are stopped (SIGSTOP) until
nodes 0 and 2 have dropped both (their heartbeats silent past the timeout, so gloo closed every
edge of the ring for good); 0 and 2, each alone now, are stopped too, and 1.3 timeouts after the
first stop all four continue together. No part holds a quorum meanwhile (2 of 4; 3 are needed),
so nothing commits anyone out; past their patience the four wait `Protocol.HEAL_FACTOR`
timeouts for an edge to heal. With healing every edge comes back over a new gloo pair at an
exchange index both ends agreed on through the store, and all four finish on one hash, the
stopped clients in their first life; with healing made impossible (the control, this module run
as the wrapper that patches `EdgeSet.heal` to agree nothing), the edges stay down and every
client stops as a minority. (With 0 and 2 left running, the four edges heal some exchanges
apart, and a part of three that healed first may commit the step whose messages from the fourth
it missed without it: this test failed so 2 runs in 4, one client committed out. Waking all four
together lands the heals within a few exchanges of each other, well inside the steps a vote
takes: 16 runs in 16 passed. Once a step's hops end on the hop clock's phase (`loop.step_hops`),
the three woken clients whose edges heal first run a one-hop step to realign, so they reach the
vote a hop sooner: with `churn.settle: 1` the fourth, whose edges healed a few hops later, was
committed out in 2 of 17 runs (0 of 8 before that change); `churn.settle: 2` gives the vote the
step back, 12 of 12 passed.)
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

import procs as harness
import runs
from procs import Procs, World

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]
WORLD = 5
TIMEOUT_S = 2.0
STEPS = 40
STALLED = (1, 3)  # topology nodes (ranks 2, 4); nodes 0 and 2 are their only neighbours
AWAKE = (0, 2)


HEALS = 2  # heals of the one edge in the transport test
CONNECTED_HOPS = 5  # exchanges checked on the edge before each drop and after the last heal


def edge_worker(addr: str, node: int, ahead: int, pause_s: float, jumps: bool) -> dict[str, object]:
    """One end of edge 0-1: hop connected, drop the edge, move the clock `ahead`, hop alone
    (`pause_s` apart; jumping to the agreed index if `jumps`, as a client with no edge does)
    asking to heal before each exchange, restore at the agreed index; HEALS times."""
    import torch.distributed as dist

    from seedflood.comm.links import EdgeTransport

    host, port = addr.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30))
    other = 1 - node
    t = EdgeTransport(node, [other], store, timeout_s=TIMEOUT_S, inline_bytes=64)
    assert t.connect([other], 60.0) == [other]
    hop, bad, heals = 0, [], []

    def connected_hops() -> None:
        nonlocal hop
        for _ in range(CONNECTED_HOPS):
            got = t.exchange({other: f"{node}@{hop}".encode()}, hop)
            if got != {other: f"{other}@{hop}".encode()}:
                bad.append(f"hop {hop}: {got}")
            hop += 1

    for _ in range(HEALS):
        connected_hops()
        t.drop(other, "test: dropped at both ends")
        t.take_lost()
        hop += ahead
        agreed: dict[int, int] = {}
        while agreed.get(other) != hop:
            agreed.update(t.heal({} if agreed else {other: None}, hop))  # as edges.heal asks
            if jumps and agreed and hop < agreed[other]:
                hop = agreed[other]
            if agreed.get(other, hop + 1) < hop:
                bad.append(f"agreed at {agreed[other]}, passed at {hop}")
                break
            if agreed.get(other) != hop:
                t.exchange({}, hop)  # no edge: nobody to pair with
                hop += 1
                time.sleep(pause_s)
        t.restore(other)
        heals.append(hop)
    connected_hops()
    t.close()
    return {"node": node, "heals": heals, "bad": bad, "hops": hop}


def test_both_ends_of_a_dropped_edge_restore_it_before_one_exchange_index(tmp_path):
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    ends = {0: (0, 0.002, False), 1: (7, 0.02, True)}  # (clock ahead after each drop, pause, jumps)
    with Procs(tmp_path) as group:
        for n, (ahead, pause, jumps) in ends.items():
            cfg = json.dumps(
                {"addr": f"127.0.0.1:{store.port}", "node": n, "ahead": ahead, "pause_s": pause, "jumps": jumps}
            )
            group.start(f"n{n}", [sys.executable, __file__, "edge", cfg], env=harness.env())
        assert group.wait(["n0", "n1"]) == [0, 0], group.describe()
        r0, r1 = (group[f"n{n}"].last_json() for n in (0, 1))
    assert r0["bad"] == [] and r1["bad"] == [], (r0, r1)  # type: ignore[index]
    assert r0["heals"] == r1["heals"] and len(r0["heals"]) == HEALS, (r0, r1)  # type: ignore[index]
    for n in (0, 1):  # each heal built a new pair under a round of its own
        rounds = [int(r) for r in re.findall(r"agreed at hop \d+ \(round (\d+)\)", group[f"n{n}"].stderr)]
        assert len(rounds) == HEALS and rounds == sorted(set(rounds)), group.describe()


def sets(out: Path) -> tuple[str, ...]:
    return runs.churn(
        out,
        STEPS,
        "run.step_delay_s=0.1",
        f"transport.timeout_s={TIMEOUT_S:g}",
        "run.hash_steps=true",
        "churn.settle=2",
    )


def stall_both_until_dropped(tmp_path: Path, heal: bool) -> tuple[World, Path, str]:
    """Run the world, stop nodes 1 and 3 after a few steps, and once nodes 0 and 2 have dropped
    both stop those too; continue all four 1.3 timeouts after the first stop, wait for every
    process to exit; returns the world, the run directory and everything the processes printed."""
    out = tmp_path / "run"
    argv = runs.train(*sets(out))
    if not heal:
        argv = [sys.executable, __file__, *argv[3:]]  # this module as `seedflood`, healing off
    group = World(tmp_path / "procs", argv, WORLD, merge=True)
    group.watch(out / "log.bin")
    with group.start_all() as run:
        runs.wait_for_steps(run, out, 5)
        for n in STALLED:
            run.signal(str(n + 1), signal.SIGSTOP)
        stopped = time.monotonic()
        dropped = [f"node {a}: lost peer node {b}" for a in AWAKE for b in STALLED]
        run.wait_for(lambda: all(d in text(run) for d in dropped), "nodes 0 and 2 to drop nodes 1 and 3")
        for n in AWAKE:  # each alone now: stopped too, so that all four wake together
            run.signal(str(n + 1), signal.SIGSTOP)
        time.sleep(max(0.0, stopped + 1.3 * TIMEOUT_S - time.monotonic()))
        for n in range(4):
            run.signal(str(n + 1), signal.SIGCONT)
        run.wait()
        said = text(run)
    return run, out, said


def text(group: World) -> str:
    return "".join(p.stdout for p in group)


def test_clients_stalled_past_the_timeout_wake_their_edges_heal_and_all_four_finish(tmp_path):
    run, out, said = stall_both_until_dropped(tmp_path, heal=True)
    assert run.codes() == [0] * WORLD, said[-6000:]
    for a in AWAKE:
        for b in STALLED:  # each of the four ring edges healed, at both ends
            assert f"node {a}: edge to node {b} healed at hop" in said, said[-6000:]
            assert f"node {b}: edge to node {a} healed at hop" in said, said[-6000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["left"] == [] and s["membership_changes"] == [] and s["consensus"], s
    assert s["client_hashes"] == [s["param_hash"]] * 4
    steps = s["client_step_hashes"]
    assert all(hs == steps[0] for hs in steps) and len(steps[0]) == STEPS
    assert runs.replay(out) == {"steps": STEPS, "param_hash": s["param_hash"]}
    # never restarted: one process each, in its first life (incarnation 1 in the store)
    assert all(len(run.procs[str(n + 1)].codes) == 1 for n in range(4))
    watched = harness.run([sys.executable, "-m", "seedflood", "watch", str(out), "--json"])
    assert watched.returncode == 0, watched.stderr
    rows = {r["name"]: r for r in json.loads(watched.stdout)["rows"]}
    assert [rows[f"node-{n}"]["incarnation"] for n in range(4)] == [1] * 4, rows


def test_the_same_stall_without_healing_leaves_the_edges_down_and_every_client_stops(tmp_path):
    """The control: the same run and faults, with `EdgeSet.heal` agreeing nothing (gloo edges as
    they were before they healed). The edges stay down, no part reaches a quorum, and every
    client stops with its one line once its wait runs out."""
    run, _, said = stall_both_until_dropped(tmp_path, heal=False)
    assert "healed" not in said, said[-6000:]
    assert all(c == 1 for c in run.codes()[1:]), said[-6000:]
    for n in range(4):  # each alone, a minority of one
        assert re.search(rf"node {n}: step \d+ was not committed within", said), said[-6000:]


if __name__ == "__main__":
    if sys.argv[1] == "edge":  # one end of the transport test
        import logging

        from seedflood.cli import exit_process

        logging.basicConfig(level=logging.INFO)
        cfg = json.loads(sys.argv[2])
        print(json.dumps(edge_worker(cfg["addr"], cfg["node"], cfg["ahead"], cfg["pause_s"], cfg["jumps"])), flush=True)
        exit_process(0)
    else:  # the control's `seedflood`: gloo edges that never heal
        from seedflood.cli import console
        from seedflood.comm.edgeset import EdgeSet

        EdgeSet.heal = lambda self, want, hop: {}  # type: ignore[method-assign]
        sys.argv = ["seedflood", *sys.argv[1:]]
        console()
