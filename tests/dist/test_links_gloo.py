"""EdgeTransport / AttachInbox between real processes: churn on a triangle and the evaluator edge.

The test process hosts the TCPStore (port 0: the store picks a free port), so killing any worker
never kills it; only the store-gone test hosts it in a worker of its own, to kill that one.
Workers are this module run as a script (`python test_links_gloo.py ROLE JSON`), each in its own
session, killed by pid at the end. They print JSON lines; the last one is the report.

Frames carry (src, dst, per-connection sequence, flag), so a receiver checks every frame against
the one its sender must have built: pairing per edge stays FIFO across reconnects. Two
survivors stop together by agreement: each sends "I am done" as the flag of a hop and both stop
after the first hop in which both flags are set (a symmetric exchange shows both the same).
Timings are never asserted as performance; bounds below only tell a dead socket (at once)
from a timeout (timeout_s) with a wide margin for a shared machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

import procs as harness
from procs import Procs

HEADER = 4  # transport.HEADER: the u32 length before each frame
INLINE = 64  # small on purpose: frames above INLINE - HEADER take the two-message path
SIZES = [0, 1, 59, 60, 61, 88, 300, 0, 2000]
TRIANGLE = {0: [1, 2], 1: [0, 2], 2: [0, 1]}
VICTIM = 2  # the node that dies
SPONSOR = 0  # the survivor that hands the newcomer its blob
KILL_HOP = 4
BLOB_BYTES = 3 * 1024 * 1024 + 17
NOT_A_PEER = 99


def frame(src: int, dst: int, seq: int, flag: int = 0) -> bytes:
    body = bytes((src * 31 + dst * 7 + seq + i) % 251 for i in range(SIZES[(seq + src + 2 * dst) % len(SIZES)]))
    return f"{src}>{dst}#{seq}:{flag}|".encode() + body


ATTACH_DONE = "test/attach-done"  # the attach node set it after closing: the evaluator stops waiting


def pushed(seq: int) -> bytes:
    return frame(7, 9, seq)


def blob() -> bytes:
    chunk = hashlib.sha256(b"seedflood").digest()
    return (chunk * (BLOB_BYTES // len(chunk) + 1))[:BLOB_BYTES]


# --- the workers ---------------------------------------------------------------------------------


def _store(addr: str, timeout_s: float = 20.0):
    import torch.distributed as dist

    host, port = addr.rsplit(":", 1)
    return dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))


def say(**report: object) -> None:
    print(json.dumps(report), flush=True)


class Node:
    """A worker's node: hops with checked frames, per-connection sequence numbers."""

    def __init__(self, transport) -> None:
        self.t = transport
        self.sent: dict[int, int] = defaultdict(int)
        self.got: dict[int, int] = defaultdict(int)
        self.bad: list[str] = []
        self.lost: list[dict[str, object]] = []
        self.hop = 0

    def reset(self, peers: list[int]) -> None:  # a new connection starts its sequence at 0
        for p in peers:
            self.sent[p] = self.got[p] = 0

    def step(self, flag: int = 0) -> dict[int, int]:
        """One exchange (step = hop // 2); returns the flag of every peer that answered."""
        me, frames = self.t.node, {}
        for p in self.t.peers:
            frames[p] = frame(me, p, self.sent[p], flag)
            self.sent[p] += 1
        started = time.time()
        frames[NOT_A_PEER] = b"ignored"  # e.g. the flood one hop behind a drop: neither sent nor counted
        out = self.t.exchange(frames, self.hop // 2)
        flags = {}
        for p, f in out.items():
            m = re.match(rb"(\d+)>(\d+)#(\d+):(\d)\|", f)
            if m is None or f != frame(p, me, self.got[p], int(m[4])):
                self.bad.append(f"hop {self.hop}: from {p}: {f[:24]!r}, expected seq {self.got[p]}")
            else:
                flags[p] = int(m[4])
            self.got[p] += 1
        for p, why in self.t.take_lost().items():
            self.lost.append({"peer": p, "hop": self.hop, "at": time.time(), "started": started, "why": why})
        self.hop += 1
        return flags


def survive(node: Node, done, others: set[int], pause_s: float = 0.005, cap: int = 100_000, on_new=None) -> None:
    """Hop, take the lost, poll; stop after the first hop in which this node and every other
    survivor still connected flagged done."""
    while node.hop < cap:
        mine = int(bool(done()))
        flags = node.step(mine)
        if mine and all(flags.get(q) == 1 for q in others & set(node.t.peers)):
            return
        new = node.t.poll()
        node.reset(new)
        if on_new is not None:
            on_new(new)
        time.sleep(pause_s)


def worker(role: str, cfg: dict) -> int:
    import logging

    from seedflood.comm.attach import AttachInbox
    from seedflood.comm.links import EdgeTransport
    from seedflood.core.flood.stepstream import encode_push, encode_pushes
    from seedflood.core.flood.transport import EVALUATOR, ByteCounter, Transport

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if role == "storehost":
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        say(port=store.port)
        time.sleep(600)
        return 0
    store = _store(cfg["store"])
    if role == "eval":  # follows node 0 (node 1 never answers); the attach's ATTACH_DONE key ends it
        inbox = AttachInbox(
            store, 2, 10**6, inline_bytes=INLINE, wait_s=25, blob_wait_s=25, timeout_s=10.0, done_keys=[ATTACH_DONE]
        )
        report: dict[str, object] = {"inc": inbox.incarnation}
        seqs: list[int] = []
        try:
            for f in inbox:
                seqs.append(int(re.match(rb"7>9#(\d+)", f)[1]))
                ok = f == pushed(seqs[-1]) and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
                say(n=len(seqs), ok=ok, first=seqs[0], last=seqs[-1])
            report["end"] = "eos"
        except Exception as e:
            report["end"] = "attach done" if "every client has finished" in str(e) else str(e)
        ok = seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True
        say(**report, n=len(seqs), ok=ok, first=seqs[0] if seqs else None, last=seqs[-1] if seqs else None)
        return 0

    me = int(cfg["node"])
    neighbours = cfg.get("neighbours", TRIANGLE[me])
    counter = ByteCounter()
    t = EdgeTransport(
        me,
        neighbours,
        store,
        counter=counter,
        attach=bool(cfg.get("attach")),
        timeout_s=cfg.get("timeout_s", 10.0),
        close_timeout_s=cfg.get("close_timeout_s", 2.0),
        inline_bytes=INLINE,
        max_pending=cfg.get("max_pending", 1024),
    )
    node = Node(t)
    want = neighbours + ([EVALUATOR] if cfg.get("attach") else [])
    t0 = time.monotonic()
    connected = t.connect(want, 25.0)
    report = {"node": me, "inc": t.incarnation, "connected": connected, "is_transport": isinstance(t, Transport)}
    report["connect_s"] = time.monotonic() - t0  # a figure for the report, never asserted
    survivors = set(neighbours) - {VICTIM}

    if role == "triangle":
        for _ in range(12):
            node.step()
    elif role == "victim":  # hops until KILL_HOP (or forever, to be stopped from outside)
        while node.hop < cfg.get("die_at", 10**9):
            node.step()
            store.set(f"test/hop/{me}", str(node.hop))
            time.sleep(cfg.get("pause_s", 0.0))
        say(node=me, died_at=time.time(), hop=node.hop)
        os.kill(os.getpid(), signal.SIGKILL)
    elif role == "survivor":  # kill / stop: hop until the victim is lost, then a few more
        if cfg.get("bystander"):  # not the victim's neighbour: ready to stop whenever the others are
            survive(node, lambda: True, survivors)
        else:
            survive(node, lambda: node.lost and node.hop >= node.lost[0]["hop"] + 3, survivors)
    elif role == "sponsor":  # rejoin: hop until the newcomer did its hops with us and left

        def on_new(new: list[int]) -> None:
            if VICTIM in new:
                report.setdefault("rejoined", []).append(
                    {"hop": node.hop, "inc": t.incarnations[VICTIM], "blob": me == SPONSOR}
                )
                if me == SPONSOR:
                    t.send_blob(VICTIM, blob())

        survive(node, lambda: "rejoined" in report and VICTIM not in t.peers, survivors, on_new=on_new)
    elif role == "newcomer":
        t0 = time.monotonic()
        data = t.recv_blob(SPONSOR, 20.0)
        report["blob_s"] = time.monotonic() - t0
        report["blob_ok"] = hashlib.sha256(data).hexdigest() == hashlib.sha256(blob()).hexdigest()
        for _ in range(cfg["hops"]):
            node.step()
    elif role == "storegone":  # hop and poll (the victim's greeting is read every hop)
        gone = []

        def done() -> bool:
            if not t.rejoins_possible and not gone:
                gone.append(node.hop)
            return bool(gone) and node.hop >= gone[0] + 5

        survive(node, done, survivors)
        report["store_gone_hop"] = gone[0] if gone else None
    elif role == "attach":  # the evaluator's attach node (node 0) on the edge 0-1
        evals: list[dict[str, object]] = []
        durations: list[float] = []
        stopped: list[int] = []
        dropped: list[int] = []  # the hop at which the attach node had dropped the stalled evaluator
        counted: list[int] = []  # hops whose push was handed to the evaluator edge

        def on_new(new: list[int]) -> None:
            if EVALUATOR in new:  # every evaluator edge opens with the steps it lacks
                needs = t.evaluator_needs()
                evals.append({"hop": node.hop, "inc": t.incarnations[EVALUATOR], "needs": needs})
                t.send_blob(EVALUATOR, encode_pushes((s, pushed(s)) for s in range(needs, node.hop)))

        if EVALUATOR in connected:
            on_new([EVALUATOR])

        def done() -> bool:
            t0, before = time.monotonic(), t.pushes_discarded
            t.push(encode_push(node.hop, pushed(node.hop)), node.hop)
            durations.append(time.monotonic() - t0)
            if t.pushes_discarded == before:
                counted.append(node.hop)
            if cfg["until"] == "reconnected":  # every evaluator incarnation came, then 20 more hops
                return len(evals) >= cfg["evaluators"] and node.hop >= evals[-1]["hop"] + 20
            if not stopped and store.check(["test/stopped"]):
                stopped.append(node.hop)
            if cfg["until"] == "dropped":  # the bound dropped it (maybe before the flag came): hop on after
                if not dropped and not t.evaluator_connected:
                    dropped.append(node.hop)
                return bool(stopped) and bool(dropped) and node.hop >= dropped[0] + 3
            return bool(stopped) and node.hop >= stopped[0] + 10  # "stalled": close on a stalled evaluator

        survive(node, done, {1}, on_new=on_new)
        t0 = time.monotonic()
        t.close()
        store.set(ATTACH_DONE, "1")
        report.update(
            close_s=time.monotonic() - t0,
            evals=evals,
            stopped_hop=stopped[0] if stopped else None,
            dropped_hop=dropped[0] if dropped else None,
            discarded=t.pushes_discarded,
            push_max_s=max(durations),
            evaluator_rows=[r for r in counter.rows() if r[2] == EVALUATOR],
            counted=counted,
            last_step=t.last_step,
        )
    elif role == "partner":  # node 1 beside the attach node: always ready to stop
        survive(node, lambda: True, {0})
    else:
        raise SystemExit(f"unknown role {role}")
    report.update(bad=node.bad, lost=node.lost, hops=node.hop, rows=counter.rows(), peers=list(t.peers))
    t.close()
    say(**report)
    return 0


# --- the test side -------------------------------------------------------------------------------


class Cluster(Procs):
    """The worker processes of one test (tests/procs.py: each in its own session, outputs in
    files, all killed on the way out), with the store they meet at."""

    def __init__(self, tmp: Path, store, store_addr: str | None = None) -> None:
        super().__init__(tmp)
        self.store = store  # the test's own client of the store (None: hosted by a worker)
        self.store_addr = store_addr or f"127.0.0.1:{store.port}"

    def spawn(self, name: str, role: str, **cfg: object) -> None:
        """This module as a worker of `role` (see `worker`), named `name`."""
        argv = [sys.executable, __file__, role, json.dumps({"store": self.store_addr, **cfg})]
        self.start(name, argv, env=harness.env())

    def out(self, name: str) -> str:
        return self[name].stdout

    def err(self, name: str) -> str:
        return self[name].stderr

    def last(self, name: str) -> dict:
        return self[name].last_json()  # type: ignore[return-value]

    def until(self, what, why: str) -> None:
        """Until `what()` holds, bounded by the workers' progress (tests/procs.py)."""
        self.wait_for(what, why)

    def wait_ok(self, names: list[str]) -> None:
        codes = self.wait(names)
        bad = [n for n, c in zip(names, codes) if c != 0]
        assert not bad, f"{bad} failed\n{self.describe()}"


def _host_store():
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path, _host_store()) as c:
        yield c


def _hop(store, node: int) -> int:
    return int(store.get(f"test/hop/{node}")) if store.check([f"test/hop/{node}"]) else -1


@pytest.mark.dist
def test_triangle_exchanges_and_counts(cluster):
    for n in TRIANGLE:
        cluster.spawn(f"n{n}", "triangle", node=n)
    cluster.wait_ok([f"n{n}" for n in TRIANGLE])
    for n, nbrs in TRIANGLE.items():
        r = cluster.last(f"n{n}")
        assert r["connected"] == nbrs and r["bad"] == [] and r["lost"] == [] and r["hops"] == 12, r
        assert r["is_transport"], "EdgeTransport must satisfy transport.Transport"
        expect: dict[tuple[int, int, int], int] = defaultdict(int)
        for hop in range(12):
            for p in nbrs:
                expect[(hop // 2, n, p)] += HEADER + len(frame(n, p, hop))
        assert {tuple(k): v for *k, v in r["rows"]} == expect


@pytest.mark.dist
@pytest.mark.parametrize("how", ["kill", "stop", "stop-path"])
def test_dead_or_stalled_peer_is_dropped_and_the_rest_go_on(cluster, how):
    """kill: the dead socket is noticed at once. stop: silence (no heartbeat) after timeout_s.
    stop-path (0 - 1 - 2): node 0 waits for node 1 while node 1 waits out the stalled node 2;
    node 1 still beats, so node 0 keeps it (no cascade)."""
    timeout_s = 20.0 if how == "kill" else 3.0  # kill: must be noticed long before the timeout
    path = {0: [1], 1: [0, 2], 2: [1]}
    nbrs = path if how == "stop-path" else TRIANGLE
    for n in (0, 1):
        bystander = VICTIM not in nbrs[n]
        cluster.spawn(f"n{n}", "survivor", node=n, neighbours=nbrs[n], timeout_s=timeout_s, bystander=bystander)
    extra = {"die_at": KILL_HOP} if how == "kill" else {}
    cluster.spawn("victim", "victim", node=VICTIM, neighbours=nbrs[VICTIM], timeout_s=timeout_s, pause_s=0.005, **extra)
    if how != "kill":
        cluster.until(lambda: _hop(cluster.store, VICTIM) >= 5, "the victim's hop 5")
        stopped_at = cluster.signal("victim", signal.SIGSTOP)
    cluster.wait_ok(["n0", "n1"])
    for n in (0, 1):
        r = cluster.last(f"n{n}")
        assert r["bad"] == [] and r["peers"] == [1 - n], r
        if VICTIM not in nbrs[n]:
            assert r["lost"] == [], r  # kept its live neighbour that was waiting on the victim
            continue
        assert [x["peer"] for x in r["lost"]] == [VICTIM], r  # once, and only the victim
        lost = r["lost"][0]
        assert r["hops"] >= lost["hop"] + 4, r  # the survivors went on together
        if how == "kill":
            died = cluster.last("victim")
            assert died["hop"] == KILL_HOP
            assert lost["hop"] in (KILL_HOP, KILL_HOP + 1), r  # the hop it missed, or the next
            assert re.search(
                r"incarnation 1: (receive|send) failed: .*Connection (closed|reset) by peer", lost["why"]
            ), r
            assert lost["at"] - died["died_at"] < timeout_s / 2, r  # the dead socket, not the timeout
        else:
            assert lost["why"] == f"incarnation 1: silent for over {timeout_s:g} s (no heartbeat)", r
            assert lost["at"] - stopped_at < timeout_s + 8, r  # one timeout (+ a shared machine)


@pytest.mark.dist
def test_killed_node_restarts_and_rejoins_with_a_blob(cluster):
    for n in (0, 1):
        cluster.spawn(f"n{n}", "sponsor", node=n)
    cluster.spawn("victim", "victim", node=VICTIM, die_at=KILL_HOP, pause_s=0.005)
    cluster.until(lambda: cluster.exited("victim"), "the victim's death")
    cluster.spawn("newcomer", "newcomer", node=VICTIM, hops=10)
    cluster.wait_ok(["n0", "n1", "newcomer"])
    new = cluster.last("newcomer")
    assert new["inc"] == 2 and new["connected"] == [0, 1] and new["blob_ok"], new
    assert new["bad"] == [] and new["hops"] == 10 and new["lost"] == [], new
    for n in (0, 1):
        r = cluster.last(f"n{n}")
        assert r["bad"] == [] and r["peers"] == [1 - n], r
        assert r["rejoined"] == [{"hop": r["rejoined"][0]["hop"], "inc": 2, "blob": n == SPONSOR}], r
        # lost twice: the victim's death (a dead socket), then the newcomer leaving after its hops
        assert [x["peer"] for x in r["lost"]] == [VICTIM, VICTIM], r
        assert r["lost"][0]["hop"] in (KILL_HOP, KILL_HOP + 1), r
        assert r["lost"][1]["hop"] > r["rejoined"][0]["hop"], r


@pytest.mark.dist
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_store_gone_stops_rejoins_not_hops(tmp_path, how):
    """A killed store host refuses at once; a stopped one (as a host cut off by the network)
    never answers, and torch's TCPStore client would wait on it until TCP gives up: the
    transport's bounded store calls find it gone within timeout_s (10 s) either way."""
    with Cluster(tmp_path, None, "unused:0") as host:
        host.spawn("store", "storehost")
        host.until(lambda: "port" in host.out("store"), "the store host")
        c = Cluster(tmp_path, None, f"127.0.0.1:{host.last('store')['port']}")
        c.procs = host.procs  # one place to kill them all
        for n in (0, 1):
            c.spawn(f"n{n}", "storegone", node=n)
        c.spawn("victim", "victim", node=VICTIM, die_at=KILL_HOP, pause_s=0.005)
        c.until(lambda: c.exited("victim"), "the victim's death")
        time.sleep(0.3)  # the survivors poll for the victim's greeting every hop meanwhile
        c.signal("store", signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        c.wait_ok(["n0", "n1"])
        for n in (0, 1):
            r = c.last(f"n{n}")
            assert r["bad"] == [] and r["peers"] == [1 - n] and r["store_gone_hop"] is not None, r
            assert r["hops"] >= r["store_gone_hop"] + 5, r
            assert c.err(f"n{n}").count("rendezvous store unreachable") == 1, c.err(f"n{n}")


@pytest.mark.dist
def test_evaluator_edge_survives_an_evaluator_restart(cluster):
    from seedflood.core.flood.stepstream import encode_push

    # n0 hops until the second evaluator has connected (not a number of hops after the first:
    # on a loaded machine the restart may come later than any such count)
    cluster.spawn("n0", "attach", node=0, neighbours=[1], attach=True, until="reconnected", evaluators=2)
    cluster.spawn("n1", "partner", node=1, neighbours=[0])
    cluster.spawn("e1", "eval")
    cluster.until(lambda: '"n": 5' in cluster.out("e1"), "5 pushes at the first evaluator")
    cluster.signal("e1", signal.SIGKILL)
    cluster.until(lambda: cluster.exited("e1"), "the first evaluator's death")
    first = cluster.last("e1")
    assert first["ok"] and first["first"] == 0, first
    cluster.spawn("e2", "eval")
    cluster.wait_ok(["n0", "n1", "e2"])
    r, second = cluster.last("n0"), cluster.last("e2")
    assert r["bad"] == [] and r["connected"] == [-1, 1], r
    assert [(e["inc"], e["needs"]) for e in r["evals"]] == [(1, 0), (2, 0)], r
    # The restarted evaluator (nothing logged: it needs step 0) got every push from 0 on: the
    # ones made while no evaluator was connected from the catch-up blob, then the stream.
    assert {k: second[k] for k in ("inc", "end", "ok", "first")} == {
        "inc": 2,
        "end": "attach done",
        "ok": True,
        "first": 0,
    }
    assert second["last"] == r["hops"] - 1, (second, r)
    assert r["discarded"] > 0, r  # while no evaluator was connected
    # Counted at the sender: every push handed to an evaluator edge (discarded ones are not),
    # and the end marker at the last step.
    expect: dict[int, int] = defaultdict(int)
    for hop in r["counted"]:
        expect[hop] += HEADER + len(encode_push(hop, pushed(hop)))
    expect[r["last_step"]] += HEADER
    assert {s: n for s, _, _, n in r["evaluator_rows"]} == expect, r
    assert r["close_s"] < 5, r


@pytest.mark.dist
@pytest.mark.parametrize("until", ["dropped", "stalled"])
def test_stalled_evaluator_never_blocks_hops_or_close(cluster, until):
    pending = 16 if until == "dropped" else 1024  # the bound is reached / close meets a stalled one
    cluster.spawn(
        "n0", "attach", node=0, neighbours=[1], attach=True, until=until, max_pending=pending, close_timeout_s=1.0
    )
    cluster.spawn("n1", "partner", node=1, neighbours=[0])
    cluster.spawn("e", "eval")
    cluster.until(lambda: '"n": 5' in cluster.out("e"), "5 pushes at the evaluator")
    cluster.signal("e", signal.SIGSTOP)
    cluster.store.set("test/stopped", "1")
    cluster.wait_ok(["n0", "n1"])
    r = cluster.last("n0")
    assert r["bad"] == [] and r["push_max_s"] < 5, r  # a push never waited on the evaluator
    log = cluster.err("n0")
    if until == "dropped":  # hops went on after the drop (which may come before n0 sees the flag)
        assert r["hops"] >= r["dropped_hop"] + 3, r
        assert re.search(rf"evaluator dropped.*{pending} pushes pending", log), log
        assert r["close_s"] < 1.0, r  # nothing left to wait for
    else:
        assert r["hops"] >= r["stopped_hop"] + 3, r
        assert "evaluator did not take the last pushes" in log, log
        assert r["close_s"] < 1.0 + 4, r  # close_timeout_s, not the hop timeout (10 s)


if __name__ == "__main__":
    from seedflood.cli import exit_process

    # as `seedflood` ends: a heartbeat thread of an edge to a stopped peer (the evaluator edge
    # beats too) may still be in a gloo call, and a plain exit would then abort (cli.exit_process)
    exit_process(worker(sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}))
