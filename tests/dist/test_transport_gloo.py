"""GlooTransport and EvaluatorInbox between real processes: 1 evaluator + 4 clients on a ring.

Bytes are counted at the step each call passes (4 hops per step, then one empty hop at a later
step, after the last push, where the end-of-stream marker must be counted too); the evaluator
checks its inbox's progress hook (`on_frame` from the receiver thread, `received`).

The module is also its own worker: `python test_transport_gloo.py ring|kill` runs one rank
(RANK/WORLD_SIZE/MASTER_* set by the `run_world` fixture) and prints one JSON line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

import pytest

from seedflood.core.flood.transport import HEADER  # 4: the u32 length before each frame

N = 4  # clients; ranks 1..N, the evaluator is rank 0 and attaches to node ATTACH
ATTACH = 0
HOPS = 20
INLINE = 64  # small on purpose: frames above INLINE - HEADER = 60 bytes take the two-message path
SIZES = [0, 1, 59, 60, 61, 16 + 24 * 3, 300, 0, 2000]


def neighbours(node: int) -> list[int]:
    return sorted({(node - 1) % N, (node + 1) % N})


def frame(src: int, dst: int, hop: int) -> bytes:
    size = SIZES[(hop + src + 2 * dst) % len(SIZES)]
    return bytes((src * 31 + dst * 7 + hop + i) % 251 for i in range(size))


def pushed(hop: int) -> bytes:
    return frame(7, 9, hop)


def worker(scenario: str) -> int:
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    from seedflood.comm.gloo import EvaluatorInbox, GlooTransport
    from seedflood.comm.runtime import World, process_group
    from seedflood.core.config.systemsections import TransportConfig
    from seedflood.core.flood.transport import ByteCounter, TransportError

    world = World.from_env()
    timeout = 20.0 if scenario == "ring" else 60.0  # kill: failures must beat the timeout by far
    report: dict[str, object] = {"rank": world.rank}
    with process_group(world, TransportConfig(timeout_s=timeout)):
        if world.is_evaluator:
            calls: list[tuple[str, int]] = []  # (calling thread, inbox.received at the call)

            class Counted(EvaluatorInbox):
                """The hook reads its own inbox through `self`, bound before the receiver thread
                starts (a closure over the variable `inbox` raced the first frame under load)."""

                def __init__(self, **kw) -> None:
                    hook = lambda: calls.append((threading.current_thread().name, self.received))  # noqa: E731
                    super().__init__(**kw, on_frame=hook)

            inbox = Counted(src_rank=ATTACH + 1, src_node=ATTACH, inline_bytes=INLINE)
            frames: list[bytes] = []
            try:
                for f in inbox:
                    frames.append(f)
            except TransportError as e:
                report["error"] = str(e)
            report["frames_ok"] = frames == [pushed(h) for h in range(len(frames))]
            report["frames"] = len(frames)
            # The hook ran once per frame, on the receiver thread, after counting it; all of
            # that happened before the end of stream (or the failure) reached us.
            report["hook_ok"] = calls == [("seedflood-inbox", i + 1) for i in range(len(frames))]
            report["received"] = inbox.received
        else:
            node = world.client_node
            counter = ByteCounter()
            transport = GlooTransport(
                node,
                neighbours(node),
                lambda n: n + 1,
                counter,
                evaluator_rank=0 if node == ATTACH else None,
                inline_bytes=INLINE,
            )
            bad, start = [], time.perf_counter()
            try:
                with transport:
                    for hop in range(HOPS):
                        if scenario == "kill" and node == 2 and hop == 5:
                            print(json.dumps({"rank": world.rank, "died_at": time.time()}), flush=True)
                            os.kill(os.getpid(), signal.SIGKILL)
                        step = hop // 4
                        got = transport.exchange({p: frame(node, p, hop) for p in transport.peers}, step)
                        bad += [(p, hop) for p in transport.peers if got[p] != frame(p, node, hop)]
                        if node == ATTACH:
                            transport.push(pushed(hop), step)
                    # One more (empty) hop at a later step, after the last push: the end
                    # marker must be counted at this step, the transport's last_step.
                    got = transport.exchange({}, HOPS // 4)
                    bad += [(p, HOPS) for p in transport.peers if got[p] != b""]
                    report["last_step"] = transport.last_step
            except TransportError as e:
                report.update(error=str(e), raised_at=time.time())
            report.update(bad=bad, rows=counter.rows(), hop_ms=1e3 * (time.perf_counter() - start) / HOPS)
        if scenario == "ring":
            # All ranks alive here: monitored_barrier's small tags must coexist with ours.
            dist.monitored_barrier(timeout=timedelta(seconds=timeout), wait_all_ranks=True)
    print(json.dumps(report), flush=True)
    return 0


@pytest.mark.dist
def test_ring_exchanges_pushes_and_counts(run_world, procs_ok):
    procs = run_world([sys.executable, __file__, "ring"], N + 1)
    procs_ok(procs)
    evaluator, *clients = [p.last_json() for p in procs]
    assert evaluator == {"rank": 0, "frames_ok": True, "frames": HOPS, "hook_ok": True, "received": HOPS}
    for rank, r in enumerate(clients, start=1):
        node = rank - 1
        assert "error" not in r and r["bad"] == [] and r["last_step"] == HOPS // 4, r
        expect = {}
        for hop in range(HOPS):
            for p in neighbours(node):
                key = (hop // 4, node, p)
                expect[key] = expect.get(key, 0) + HEADER + len(frame(node, p, hop))
            if node == ATTACH:
                key = (hop // 4, node, -1)
                expect[key] = expect.get(key, 0) + HEADER + len(pushed(hop))
        for p in neighbours(node):
            expect[(HOPS // 4, node, p)] = HEADER  # the final empty hop
        if node == ATTACH:
            expect[(HOPS // 4, node, -1)] = HEADER  # the end-of-stream marker, at last_step
        assert {tuple(k): n for *k, n in r["rows"]} == expect


@pytest.mark.dist
def test_killed_peer_makes_neighbours_raise_at_once(run_world):
    # every rank must exit (a stall fails the wait); one that waited out the 60 s group timeout
    # instead of seeing the dead socket fails the `raised_at` check below
    procs = run_world([sys.executable, __file__, "kill"], N + 1)
    reports = {p.rank: p.last_json() for p in procs}
    died_at = reports[3]["died_at"]  # node 2 = rank 3
    for node in (1, 3):  # its neighbours
        r = reports[node + 1]
        assert re.match(rf"node {node}: (receive from|send to) peer node 2 \(rank 3\) failed", r["error"]), r
        assert r["raised_at"] - died_at < 5, "raised only after the timeout"  # timeout is 60 s
    assert "error" in reports[1]  # node 0 fails through the cascade
    assert "evaluator: stream from attach node 0 (rank 1) failed" in reports[0]["error"]
    assert reports[0]["frames_ok"]  # an in-order prefix (an aborted sender may lose its last pushes)
    assert reports[0]["hook_ok"] and reports[0]["received"] == reports[0]["frames"]


@pytest.mark.dist
def test_single_process_group_comes_up_and_down():
    import torch.distributed as dist

    from seedflood.comm.runtime import World, process_group
    from seedflood.core.config.systemsections import TransportConfig

    with process_group(World.from_env({}), TransportConfig(timeout_s=10)) as group:
        assert dist.is_initialized() and dist.get_world_size() == 1 and group.world.is_evaluator
    assert not dist.is_initialized()


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1]))
