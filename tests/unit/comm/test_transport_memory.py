"""In-memory transport (hops, byte counts, failures, evaluator inbox) and runtime's launcher parsing.

Also pins the transport layer's boundaries: steps are explicit arguments, the inbox reports
progress (`received`, `on_frame`), and only seedflood.comm.gloo imports torch.distributed.

Threads only, no processes: every test finishes in milliseconds (timeouts bound the failures).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from seedflood.comm.memory import InMemoryNetwork, MemoryTransport
from seedflood.comm.runtime import World, WorldError, check_world, expand_nodelist, free_port
from seedflood.core.flood.transport import EVALUATOR, HEADER, ByteCounter, Inbox, Transport, TransportError


def ring(n: int) -> dict[int, list[int]]:
    return {i: [(i - 1) % n, (i + 1) % n] for i in range(n)}


def frame(src: int, dst: int, hop: int) -> bytes:
    """Distinct per edge and hop, sizes 0..~40 bytes; every third hop empty."""
    return b"" if hop % 3 == 0 else f"{src}>{dst}@{hop}".encode() * (1 + (src + hop) % 3)


def run_nodes(net: InMemoryNetwork, body: Callable[[MemoryTransport], object], timeout: float = 10):
    """Run body(endpoint) on one thread per node; returns {node: result or exception}."""
    results: dict[int, object] = {}
    endpoints = {n: net.endpoint(n) for n in sorted(net.neighbors)}

    def target(n: int) -> None:
        try:
            with endpoints[n] as t:
                results[n] = body(t)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            results[n] = e

    threads = [threading.Thread(target=target, args=(n,), daemon=True) for n in endpoints]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout)
    assert not any(th.is_alive() for th in threads), "a node thread hung"
    return results


HOPS = 7


def hops(t: MemoryTransport) -> list[dict[int, bytes]]:
    got = []
    for h in range(HOPS):
        got.append(t.exchange({p: frame(t.node, p, h) for p in t.peers}, h // 2))  # two hops per step
    return got


def test_ring_of_five_exchanges_frames_and_counts_bytes_exactly():
    net = InMemoryNetwork(ring(5), timeout_s=5)
    results = run_nodes(net, hops)
    for n, got in results.items():
        assert not isinstance(got, BaseException), got
        assert got == [{p: frame(p, n, h) for p in ((n - 1) % 5, (n + 1) % 5)} for h in range(HOPS)]
    counter = net.counter()
    expect_edge = {
        (a, b): sum(HEADER + len(frame(a, b, h)) for h in range(HOPS))
        for a in range(5)
        for b in ((a - 1) % 5, (a + 1) % 5)
    }
    assert counter.per_edge_total() == expect_edge
    expect_step: dict[int, int] = {}
    for a, b in expect_edge:
        for h in range(HOPS):
            expect_step[h // 2] = expect_step.get(h // 2, 0) + HEADER + len(frame(a, b, h))
    assert counter.per_step_total() == expect_step
    assert counter.total() == sum(expect_edge.values())
    assert counter.mean_bytes_per_edge_per_step() == pytest.approx(
        sum(expect_edge.values()) / (10 * 4)  # 10 directed edges, steps 0..3
    )
    assert all(isinstance(e, Transport) for e in net._endpoints.values())


def test_byte_counter_rows_round_trip_and_merge():
    a, b = ByteCounter(), ByteCounter()
    a.add(0, 0, 1, 10)
    a.add(1, 0, 1, 5)
    a.add(1, 0, EVALUATOR, 100)
    b.add(0, 1, 0, 7)
    m = ByteCounter.merged([a, b])
    assert m.rows() == [(0, 0, 1, 10), (0, 1, 0, 7), (1, 0, -1, 100), (1, 0, 1, 5)]
    assert ByteCounter.from_rows(m.rows()).rows() == m.rows()
    assert m.per_edge_total() == {(0, 1): 15, (1, 0): 7, (0, EVALUATOR): 100}
    assert m.per_step_total() == {0: 17, 1: 105}
    assert m.per_step_total(include_evaluator=False) == {0: 17, 1: 5}
    assert m.mean_bytes_per_edge_per_step() == 22 / (2 * 2)
    assert m.mean_bytes_per_edge_per_step(include_evaluator=True) == 122 / (3 * 2)
    assert ByteCounter().mean_bytes_per_edge_per_step() == 0.0


def test_a_failing_node_makes_the_others_raise_not_hang():
    net = InMemoryNetwork(ring(5), timeout_s=30)  # a hang would show as ~30 s

    def body(t: MemoryTransport) -> None:
        for h in range(10):
            if t.node == 2 and h == 3:
                raise ValueError("boom")
            t.exchange({p: b"x" for p in t.peers}, h)

    start = time.monotonic()
    results = run_nodes(net, body)
    assert time.monotonic() - start < 5
    assert isinstance(results[2], ValueError)
    for n in (0, 1, 3, 4):
        assert isinstance(results[n], TransportError), results[n]
    assert "peer node 2" in str(results[1]) and "aborted" in str(results[1])


def test_a_silent_node_times_out_its_neighbours():
    net = InMemoryNetwork({0: [1], 1: [0]}, timeout_s=0.2)
    a = net.endpoint(0)
    net.endpoint(1)  # never speaks
    start = time.monotonic()
    with pytest.raises(TransportError, match=r"node 0: receive from peer node 1 failed: no frame within 0.2 s"):
        a.exchange({1: b"hi"}, 0)
    assert 0.15 < time.monotonic() - start < 2


def test_kill_fails_the_node_and_its_neighbours_cascade():
    net = InMemoryNetwork({0: [1], 1: [0, 2], 2: [1]}, timeout_s=30)
    net.kill(2)
    results = run_nodes(net, lambda t: [t.exchange({p: b"f" for p in t.peers}, s) for s in range(2)])
    assert str(results[2]) == "node 2: node 2 was killed"
    assert str(results[1]) == "node 1: receive from peer node 2 failed: node 2 was killed"
    # node 0 still got node 1's first frame, then saw node 1 go down.
    assert str(results[0]) == "node 0: receive from peer node 1 failed: node 1 aborted"


def test_cut_link_fails_only_its_receiver_and_stays_failed():
    net = InMemoryNetwork({0: [1], 1: [0]}, timeout_s=30)
    net.cut(1, 0)
    a, b = net.endpoint(0), net.endpoint(1)
    with pytest.raises(TransportError, match=r"node 0: receive from peer node 1 failed: link 1 -> 0 was cut"):
        a.exchange({1: b"x"}, 0)  # sent to node 1 before failing
    assert b.exchange({0: b"lost"}, 0) == {0: b"x"}
    with pytest.raises(TransportError, match=r"link 1 -> 0 was cut"):
        a.exchange({1: b"y"}, 1)


def _revived_pair() -> tuple[InMemoryNetwork, MemoryTransport, MemoryTransport]:
    """A 3-ring (churn mode) whose node 0 was killed and revived: its edges start unconnected."""
    net = InMemoryNetwork(ring(3), timeout_s=1.0, tolerate=True)
    first = net.endpoint(0)
    net.kill(0)
    first.close(abort=True)
    net.revive(0)
    return net, net.endpoint(0), net.endpoint(1)


def test_an_edge_connects_only_when_both_ends_meet_and_then_exchanges_in_step():
    """As links.EdgeTransport's meetings: a connect no other end answers within its timeout
    gives nothing at either end (a one-sided edge would wait on frames that never come)."""
    net, new, old = _revived_pair()
    old.peers = (2,)  # node 1 dropped the dead incarnation
    t0 = time.monotonic()
    assert new.connect([1], 0.2) == [] and new.peers == () and old.peers == (2,)
    assert 0.2 <= time.monotonic() - t0 < 2.0
    got: dict[str, list[int]] = {}
    th = threading.Thread(target=lambda: got.__setitem__("old", old.connect([0], 5.0)))
    th.start()
    assert new.connect([1], 5.0) == [1]
    th.join(5.0)
    assert got == {"old": [0]} and new.peers == (1,) and 0 in old.peers
    # both ends exchange from their next hop, frames paired in order
    out: dict[int, dict[int, bytes]] = {}
    th = threading.Thread(target=lambda: out.__setitem__(1, old.exchange({0: b"to0", 2: b""}, 0)))
    th.start()
    net.wires.queues[(2, 1)].put(b"from2")  # node 2 is not running here: play its frame
    out[0] = new.exchange({1: b"to1"}, 0)
    th.join(5.0)
    assert out[0] == {1: b"to0"} and out[1] == {0: b"to1", 2: b"from2"}


def test_a_cut_or_dead_link_never_meets():
    net, new, old = _revived_pair()
    old.peers = (2,)
    net.cut(0, 1)
    th = threading.Thread(target=old.connect, args=([0], 0.3))
    th.start()
    assert new.connect([1], 0.3) == []
    th.join(5.0)
    assert 0 not in old.peers
    with pytest.raises(ValueError, match="not topology neighbours"):
        new.connect([5], 0.1)


def test_a_revived_node_learns_its_sponsor_or_times_out():
    net, new, old = _revived_pair()
    with pytest.raises(TransportError, match="no neighbour sponsored the rejoin within 0.1 s"):
        new.sponsor(0.1)
    assert old.claim(0) == 1 and net.endpoint(2).claim(0) is None  # the first claim wins
    assert new.sponsor(0.1) == 1


def test_mutator_sees_every_frame_and_changes_what_arrives():
    seen = []

    def flip_last(src: int, dst: int, hop: int, data: bytes) -> bytes:
        seen.append((src, dst, hop))
        return data[:-1] + bytes([data[-1] ^ 0xFF]) if (src, hop) == (1, 1) and data else data

    net = InMemoryNetwork({0: [1], 1: [0]}, timeout_s=5, mutate=flip_last)
    results = run_nodes(net, lambda t: [t.exchange({1 - t.node: b"ab"}, s) for s in range(2)])
    assert results[0] == [{1: b"ab"}, {1: b"a\x9d"}]
    assert results[1] == [{0: b"ab"}, {0: b"ab"}]
    assert sorted(seen) == [(0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1)]
    assert net.counter().per_edge_total() == {(0, 1): 2 * (HEADER + 2), (1, 0): 2 * (HEADER + 2)}  # as sent


def test_evaluator_inbox_receives_pushes_in_order_then_end_of_stream():
    net = InMemoryNetwork(ring(3), timeout_s=5, attach=1)
    inbox = net.evaluator_inbox()
    pushed = [b"", b"one", bytes(range(256)) * 3]

    def body(t: MemoryTransport) -> None:
        for h in range(3):
            t.exchange({}, h)
            if t.node == 1:
                t.push(pushed[h], h)
        if t.node == 0:
            with pytest.raises(ValueError, match="not the evaluator's attach node"):
                t.push(b"x", 2)

    results = run_nodes(net, body)
    assert all(r is None for r in results.values()), results
    assert list(inbox) == pushed
    assert inbox.get(timeout=0) is None  # stays ended
    edges = net.counter().per_edge_total()
    assert edges[(1, EVALUATOR)] == sum(HEADER + len(f) for f in pushed) + HEADER  # + end marker


def test_evaluator_inbox_reports_a_failed_sender_and_timeouts():
    net = InMemoryNetwork({0: [1], 1: [0]}, timeout_s=5, attach=0)
    inbox = net.evaluator_inbox()
    with pytest.raises(TimeoutError, match="no frame from attach node 0 within 0.01 s"):
        inbox.get(timeout=0.01)
    t = net.endpoint(0)
    t.push(b"a", 0)
    t.close(abort=True)
    assert inbox.get(timeout=1) == b"a"
    for _ in range(2):
        with pytest.raises(TransportError, match="stream from attach node 0 failed: node 0 aborted"):
            inbox.get(timeout=1)


def test_bad_networks_and_frames_are_rejected():
    with pytest.raises(ValueError, match="symmetric"):
        InMemoryNetwork({0: [1], 1: []})
    with pytest.raises(ValueError, match="symmetric"):
        InMemoryNetwork({0: [0]})
    with pytest.raises(ValueError, match="attach node 7"):
        InMemoryNetwork({0: [1], 1: [0]}, attach=7)
    net = InMemoryNetwork({0: [1], 1: [0]})
    t = net.endpoint(0)
    with pytest.raises(ValueError, match="already has an endpoint"):
        net.endpoint(0)
    with pytest.raises(ValueError, match=r"non-neighbours \[5\]"):
        t.exchange({5: b"x"}, 0)
    with pytest.raises(ValueError, match="no evaluator"):
        net.evaluator_inbox()
    t.close()
    with pytest.raises(TransportError, match="closed"):
        t.exchange({}, 0)


# --- explicit steps, the inbox's progress hook, module boundaries -------------------------------


def test_bytes_are_counted_at_the_step_passed_and_the_end_marker_at_the_last_one():
    net = InMemoryNetwork({0: [1], 1: [0]}, timeout_s=5, attach=0)
    seen: dict[int, list[int]] = {0: [], 1: []}  # last_step after each call, per node

    def body(t: MemoryTransport) -> list[dict[int, bytes]]:
        assert not hasattr(t.counter, "step")  # no shared "current step" left to set
        seen[t.node].append(t.last_step)
        got = []
        # Steps need not be monotone or dense: each call is labelled with what the caller passes
        # (node 1 labels its steps +10: each sender's labels are its own business).
        for step, data in ((3, b"abc"), (1, b""), (3, b"z")):
            got.append(t.exchange({1 - t.node: data * (1 + t.node)}, step + 10 * t.node))
            seen[t.node].append(t.last_step)
        if t.node == 0:
            t.push(b"frame", 5)
            seen[0].append(t.last_step)
        got.append(t.exchange({}, 7))  # a hop after the last push (delayed flooding drains so)
        seen[t.node].append(t.last_step)
        return got

    results = run_nodes(net, body)
    assert results[0] == [{1: b"abcabc"}, {1: b""}, {1: b"zz"}, {1: b""}], results
    assert results[1] == [{0: b"abc"}, {0: b""}, {0: b"z"}, {0: b""}], results
    assert seen == {0: [0, 3, 1, 3, 5, 7], 1: [0, 13, 11, 13, 7]}
    assert net._endpoints[0].counter.rows() == [
        (1, 0, 1, HEADER),
        (3, 0, 1, 2 * HEADER + 4),
        (5, 0, EVALUATOR, HEADER + 5),
        (7, 0, EVALUATOR, HEADER),  # the end-of-stream marker, at the latest step
        (7, 0, 1, HEADER),
    ]
    assert net._endpoints[1].counter.rows() == [
        (7, 1, 0, HEADER),
        (11, 1, 0, HEADER),
        (13, 1, 0, 2 * HEADER + 8),
    ]
    assert list(net.evaluator_inbox()) == [b"frame"]


def test_end_marker_of_a_run_counts_at_its_last_step():
    net = InMemoryNetwork(ring(3), timeout_s=5, attach=2)

    def body(t: MemoryTransport) -> None:
        for step in range(4):
            t.exchange({}, step)
            if t.node == 2:
                t.push(b"s%d" % step, step)

    assert all(r is None for r in run_nodes(net, body).values())
    evaluator_rows = [r for r in net.counter().rows() if r[2] == EVALUATOR]
    pushed = HEADER + 2  # b"s0"...: 2 bytes
    assert evaluator_rows == [(0, 2, -1, pushed), (1, 2, -1, pushed), (2, 2, -1, pushed), (3, 2, -1, pushed + HEADER)]


def test_memory_inbox_counts_frames_and_calls_on_frame_in_push():
    net = InMemoryNetwork(ring(3), timeout_s=5, attach=1)
    inbox = net.evaluator_inbox()
    assert isinstance(inbox, Inbox) and inbox.received == 0 and inbox.on_frame is None
    calls: list[tuple[str, int]] = []  # (calling thread, received at the call)
    inbox.on_frame = lambda: calls.append((threading.current_thread().name, inbox.received))

    def body(t: MemoryTransport) -> str:
        threading.current_thread().name = f"node-{t.node}"
        for step in range(4):
            t.exchange({}, step)
            if t.node == 1:
                t.push(b"%d" % step, step)
        return threading.current_thread().name

    assert run_nodes(net, body)[1] == "node-1"
    # One call per frame, from the pushing node's thread, after the frame was counted and queued.
    assert calls == [("node-1", 1), ("node-1", 2), ("node-1", 3), ("node-1", 4)]
    assert inbox.received == 4
    assert list(inbox) == [b"0", b"1", b"2", b"3"]
    assert inbox.received == 4 and len(calls) == 4  # the end of stream is not a frame


def test_a_failing_on_frame_hook_breaks_neither_the_sender_nor_the_stream(caplog):
    net = InMemoryNetwork({0: [1], 1: [0]}, timeout_s=5, attach=0)
    inbox = net.evaluator_inbox()
    calls = []

    def hook() -> None:
        calls.append(inbox.received)
        raise RuntimeError("display bug")

    inbox.on_frame = hook
    t = net.endpoint(0)
    with caplog.at_level("WARNING", logger="seedflood.core.flood.transport"):
        t.push(b"a", 0)
        t.push(b"b", 1)
    assert calls == [1, 2]  # still called after it failed
    assert sum("on_frame raised" in r.getMessage() for r in caplog.records) == 1  # logged once
    t.close(abort=True)
    assert inbox.get(timeout=1) == b"a" and inbox.get(timeout=1) == b"b"
    with pytest.raises(TransportError, match="node 0 aborted"):
        inbox.get(timeout=1)
    assert inbox.received == 2  # a failure is not a frame either


def test_inbox_hook_can_be_given_at_construction():
    calls = []
    inbox = Inbox("test", on_frame=lambda: calls.append(1))
    inbox.put(b"x")
    assert (calls, inbox.received, inbox.get(timeout=0)) == ([1], 1, b"x")


def _imports(path) -> list[str]:
    import ast

    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def test_only_the_gloo_module_imports_torch_distributed():
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[3] / "src" / "seedflood"
    for module in ("core/flood/transport", "comm/memory"):
        bad = [n for n in _imports(src / f"{module}.py") if n.split(".")[0] == "torch"]
        assert bad == [], f"{module}.py imports {bad}"
    assert "torch.distributed" in _imports(src / "comm" / "gloo.py")
    # Neither module pulls torch in at all, so the run-time check is meaningful (torch itself
    # imports torch.distributed, which is why the core purity test only checks sources).
    code = (
        "import sys, seedflood.core.flood.transport, seedflood.comm.memory\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --- runtime: launcher environments -------------------------------------------------------------


def test_world_from_torchrun_env():
    env = {
        "RANK": "3",
        "WORLD_SIZE": "5",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "10.0.0.2",
        "MASTER_PORT": "29511",
        "TORCHELASTIC_RUN_ID": "none",
    }
    w = World.from_env(env)
    assert w == World(3, 5, 1, "10.0.0.2", 29511, "torchrun")
    assert (w.is_evaluator, w.client_node) == (False, 2)
    assert World.from_env({**env, "RANK": "0"}).is_evaluator


def test_world_from_plain_env_and_single():
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "evaluator", "MASTER_PORT": "1234"}
    assert World.from_env(env) == World(0, 2, 0, "evaluator", 1234, "env")
    assert World.from_env({}) == World(0, 1, 0, "127.0.0.1", 0, "single")
    assert World.from_env({"RANK": "0", "WORLD_SIZE": "1"}).world_size == 1
    assert World.from_env({}).client_node == EVALUATOR


def test_world_from_slurm_env():
    env = {
        "SLURM_PROCID": "4",
        "SLURM_NTASKS": "9",
        "SLURM_LOCALID": "0",
        "SLURM_JOB_NODELIST": "gpu[07-08,11],login",
        "SLURM_JOB_ID": "123456",
    }
    w = World.from_env(env)
    assert w == World(4, 9, 0, "gpu07", 20000 + 123456 % 20000, "slurm")
    w = World.from_env({**env, "MASTER_ADDR": "head", "MASTER_PORT": "4000"})
    assert (w.master_addr, w.master_port) == ("head", 4000)
    assert World.from_env({"SLURM_PROCID": "0", "SLURM_NPROCS": "2", "SLURM_NODELIST": "a,b"}).master_addr == "a"


@pytest.mark.parametrize(
    "env, message",
    [
        ({"RANK": "1", "WORLD_SIZE": "4"}, "MASTER_ADDR is not set"),
        ({"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h"}, "MASTER_PORT is not set"),
        ({"RANK": "x", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK='x' is not an integer"),
        ({"RANK": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "rank 4 is outside world size 4"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "not a TCP port"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-"}, "malformed SLURM nodelist"),
    ],
)
def test_world_errors_are_one_line(env, message):
    with pytest.raises(WorldError, match=message) as info:
        World.from_env(env)
    assert "\n" not in str(info.value)


def test_expand_nodelist():
    assert expand_nodelist("node[1-3,5]") == ["node1", "node2", "node3", "node5"]
    assert expand_nodelist("a,b") == ["a", "b"]
    assert expand_nodelist("n[08-10]-ib,x") == ["n08-ib", "n09-ib", "n10-ib", "x"]
    assert expand_nodelist("r[1-2]n[3,4]") == ["r1n3", "r1n4", "r2n3", "r2n4"]
    assert expand_nodelist("single") == ["single"]
    for bad in ("a[1-", "a]", "a,,b", "a[x]", "a[3-1]", "a[]"):
        with pytest.raises(WorldError, match="malformed SLURM nodelist"):
            expand_nodelist(bad)


def test_check_world_messages():
    check_world(World(0, 5, master_port=1, launcher="torchrun"), 4)
    with pytest.raises(WorldError) as info:
        check_world(World(1, 4, master_port=1, launcher="torchrun"), 4)
    assert str(info.value) == (
        "world size 4 does not match topology: 4 clients + 1 evaluator = 5 processes "
        "(launch with torchrun --nproc-per-node 5)"
    )
    with pytest.raises(WorldError, match=r"\(launch with srun --ntasks 9\)"):
        check_world(World(0, 3, master_port=1, launcher="slurm"), 8)
    with pytest.raises(WorldError, match=r"1 evaluator = 3 processes \(launch with torchrun"):
        check_world(World.from_env({}), 2)


def test_free_port_is_bindable():
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_gloo_transport_needs_a_process_group():
    from seedflood.comm.gloo import GlooTransport

    with pytest.raises(TransportError, match="no process group"):
        GlooTransport(0, [1])
    with pytest.raises(ValueError, match="lists itself"):
        GlooTransport(0, [0, 1])
