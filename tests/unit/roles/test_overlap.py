"""Communication behind compute (`flood.overlap`): the hops of step t run on a thread while step
t+1 is estimated. The reference is exact: an overlapped client with delay D + 1 produces the bits
of a plain client whose protocol has delay D + 1, on every node after every step (docs/design.md, Processes and the step loop).
Also: resume from every prefix, failures on the hop thread reach every client within the
timeout with the transport's message, and listeners see each step once, in order.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest
import torch

from seedflood.comm.memory import InMemoryNetwork
from seedflood.core.config import runconfig as config
from seedflood.core.flood.protocol import Protocol, trajectory
from seedflood.core.flood.transport import TransportError
from seedflood.core.topology import resolve as topo
from seedflood.core.wire import message
from seedflood.core.zo import estimate as zo
from seedflood.ml.workload import Workload
from seedflood.roles.client import Client
from seedflood.roles.inprocess import SimResult, simulate

torch.set_num_threads(1)
DEBUG = Path(__file__).resolve().parents[3] / "launch" / "configs" / "debug.yaml"


def cfg_for(*overrides: str) -> config.Config:
    return config.load(DEBUG, ["run.steps=5", *overrides])


def protocols(cfg: config.Config) -> tuple[Protocol, Protocol]:
    """(overlapped protocol, its reference: plain client, same delay D + 1)."""
    p = Protocol.of(cfg, topo.build(cfg.topology).diameter)
    assert p.overlap
    return p, dataclasses.replace(p, overlap=False)


def assert_same_bits(a: SimResult, b: SimResult, steps: int) -> None:
    assert a.step_hashes == b.step_hashes  # every node, every step
    assert all(len(hs) == steps for hs in a.step_hashes.values())
    assert len({hs[-1] for hs in a.step_hashes.values()}) == 1
    assert a.hashes == b.hashes
    assert a.records == b.records


GRAPHS = {
    # name: overrides (ring of 4: diameter 2; 3×3 torus: diameter 2)
    "ring": ("topology.kind=ring", "topology.nodes=4"),
    "torus": ("topology.kind=torus", "topology.nodes=9", "topology.rows=3"),
}


def overlap_cfg(graph: str, hops: int) -> config.Config:
    return cfg_for(*GRAPHS[graph], f"flood.hops_per_step={hops}", "flood.overlap=true")


@pytest.fixture(scope="module")
def uninterrupted():
    """(graph, hops) -> the overlapped run of `overlap_cfg`, hashed after every step: simulated
    once for the tests that check different properties of it (its bits against the reference,
    resumes from its log, the log an early stop leaves)."""
    done: dict[tuple[str, int], SimResult] = {}

    def get(graph: str, hops: int) -> SimResult:
        if (graph, hops) not in done:
            done[graph, hops] = simulate(overlap_cfg(graph, hops), hash_every_step=True)
        return done[graph, hops]

    return get


@pytest.mark.parametrize("hops", [1, 0])
@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_overlap_has_the_bits_of_a_plain_client_with_one_more_step_of_delay(uninterrupted, graph, hops):
    cfg = overlap_cfg(graph, hops)
    p, ref_p = protocols(cfg)
    assert p.delay == {1: 2, 0: 1}[hops]  # diameter 2: D = 1 with one hop, 0 with full flooding
    overlapped = uninterrupted(graph, hops)
    reference = simulate(cfg, hash_every_step=True, protocol=ref_p)
    assert_same_bits(overlapped, reference, cfg.run.steps)
    # and the extra step of staleness is real: the plain client of delay D ends elsewhere
    plain = simulate(cfg_for(*GRAPHS[graph], f"flood.hops_per_step={hops}"), hash_every_step=False)
    assert set(plain.hashes.values()) != set(overlapped.hashes.values())


@pytest.mark.parametrize("hops", [1, 0])
def test_resume_from_every_prefix_equals_the_uninterrupted_overlapped_run(uninterrupted, hops):
    cfg = overlap_cfg("ring", hops)
    straight = uninterrupted("ring", hops)
    assert [s for s, _ in straight.records] == list(range(cfg.run.steps))
    for n in range(len(straight.records) + 1):
        resumed = simulate(cfg, hash_every_step=False, resume=straight.records[:n])
        assert set(resumed.hashes.values()) == set(straight.hashes.values()), n
        assert resumed.records == straight.records, n


def test_a_run_stopped_early_logs_what_the_reference_logs_and_resumes_from_it(uninterrupted):
    """A kill after 3 steps (hops of step 2 joined, never applied), then a relaunch."""
    cfg = overlap_cfg("ring", 1)
    p, ref_p = protocols(cfg)
    stopped = simulate(cfg, hash_every_step=False, stop=3)
    assert stopped.records == simulate(cfg, hash_every_step=False, stop=3, protocol=ref_p).records
    assert len(stopped.records) == 3 - p.delay
    straight = uninterrupted("ring", 1)
    resumed = simulate(cfg, hash_every_step=False, resume=stopped.records)
    assert resumed.hashes == straight.hashes


def test_overlap_is_in_the_fingerprint_through_the_delay_only():
    on = cfg_for("flood.overlap=true")
    off = cfg_for()
    t_on = trajectory(on, Protocol.of(on, 2), "d")
    t_off = trajectory(off, Protocol.of(off, 2), "d")
    assert {k for k in t_on if t_on[k] != t_off[k]} == {"flood.delay"}
    assert t_on["flood.delay"] == t_off["flood.delay"] + 1


# -- failures and listeners: clients driven directly, so each node's outcome is visible ----------


def run_clients(
    cfg: config.Config,
    *,
    kill: tuple[int, int] | None = None,
    mutate=None,
    timeout_s: float = 5.0,
    stop: int | None = None,
    after=None,
):
    """Every client of `cfg` on its own thread over an InMemoryNetwork with `timeout_s`, run to
    `stop`; kill=(node, hop): crash that node as it sends its frames of that hop; `after(client,
    transport)` runs once run() returned. Returns ({node: exception or None}, {node: [steps its
    listener saw]}, seconds until all ended)."""
    top = topo.build(cfg.topology)
    p = Protocol.of(cfg, top.diameter)
    network: InMemoryNetwork

    def faults(src: int, dst: int, hop: int, frame: bytes) -> bytes:
        if kill is not None and (src, hop) == kill:
            network.kill(src)
        return mutate(src, dst, hop, frame) if mutate is not None else frame

    network = InMemoryNetwork({i: top.neighbors(i) for i in top.nodes}, timeout_s=timeout_s, mutate=faults)
    outcome: dict[int, BaseException | None] = {}
    seen: dict[int, list[int]] = {i: [] for i in top.nodes}
    workloads = {i: Workload.build(cfg) for i in top.nodes}  # here: lazy imports are not thread-safe
    threads_seen: set[str] = set()  # threads listeners ran on

    def run(node: int) -> None:
        wl = workloads[node]
        try:
            with network.endpoint(node) as transport:
                c = Client(
                    node,
                    top.neighbors(node),
                    p,
                    wl.direction,
                    lambda s: wl.loss(node, s),
                    transport,
                    hop_timeout_s=timeout_s * (p.hops + 1),
                )
                c.listeners.append(lambda s, msgs: seen[node].append(s))
                c.listeners.append(lambda s, msgs: threads_seen.add(threading.current_thread().name))
                c.run(stop)
                if after is not None:
                    after(c, transport)
            outcome[node] = None
        except BaseException as e:  # noqa: BLE001 - reported to the test
            outcome[node] = e

    t0 = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,), name=f"client-{i}", daemon=True) for i in top.nodes]
    for th in threads:
        th.start()
    for th in threads:
        th.join(4 * timeout_s + 60)
    assert not any(th.is_alive() for th in threads), "a client hung"
    assert not any(th.name.startswith("seedflood-hops") for th in threading.enumerate()), "a hop thread outlived"
    assert threads_seen <= {f"client-{i}" for i in top.nodes}, "listeners run on the client's own thread"
    return outcome, seen, time.monotonic() - t0


def test_listeners_see_each_step_once_in_order_and_hop_threads_end():
    cfg = cfg_for(*GRAPHS["ring"], "flood.hops_per_step=1", "flood.overlap=true")
    outcome, seen, _ = run_clients(cfg)
    assert outcome == {i: None for i in range(4)}
    assert seen == {i: list(range(cfg.run.steps)) for i in range(4)}


def test_a_run_stopped_early_hands_back_a_transport_no_hop_thread_uses():
    cfg = cfg_for(*GRAPHS["ring"], "flood.hops_per_step=1", "flood.overlap=true")

    def after(c: Client, transport) -> None:
        assert c.mode.inflight is None  # joined: the caller may close the transport
        assert transport.hop == 3 * c.protocol.hops  # the hops of steps 0, 1, 2 all ran

    outcome, seen, _ = run_clients(cfg, stop=3, after=after)
    assert outcome == {i: None for i in range(4)}, outcome
    assert seen == {i: [0] for i in range(4)}  # delay 2: steps 0..stop-1-delay


def test_a_node_killed_on_its_hop_thread_fails_every_client_promptly():
    cfg = cfg_for(*GRAPHS["ring"], "flood.hops_per_step=1", "flood.overlap=true", "run.steps=8")
    outcome, seen, took = run_clients(cfg, kill=(2, 3), timeout_s=20.0)
    assert all(isinstance(e, TransportError) for e in outcome.values()), outcome
    assert "node 2 was killed" in str(outcome[2])
    for n in (1, 3):  # its neighbours name it
        assert "receive from peer node 2 failed: node 2 was killed" in str(outcome[n]), outcome[n]
    assert "failed" in str(outcome[0])  # node 0 hears of it through 1 and 3
    assert took < 20.0, "a kill is seen at once (poisoned queues), never by timing out"
    assert all(s == list(range(len(s))) for s in seen.values())  # applied steps still in order


def test_a_corrupt_frame_on_the_hop_thread_fails_the_run_with_the_codec_message():
    def flip(src: int, dst: int, hop: int, frame: bytes) -> bytes:
        if hop == 2 and src == 1 and frame:  # any non-empty frame (v2: an empty one is b"")
            frame = frame[:-1] + bytes([frame[-1] ^ 0xFF])
        return frame

    cfg = cfg_for(*GRAPHS["ring"], "flood.hops_per_step=1", "flood.overlap=true")
    outcome, _, took = run_clients(cfg, mutate=flip, timeout_s=20.0)
    bad = [e for e in outcome.values() if isinstance(e, message.FrameError)]
    assert bad and all("bad frame from node 1 at step 2" in str(e) for e in bad), outcome
    assert all(e is not None for e in outcome.values()), "every client must fail"
    assert took < 20.0
    with pytest.raises(message.FrameError, match="bad frame from node 1 at step 2"):
        simulate(cfg, mutate=flip, hash_every_step=False)


def test_an_error_on_the_main_thread_waits_for_the_hops_in_flight():
    """A diverged estimate while hops run: the hop thread has ended before the error leaves the
    client, so the caller closes a transport no other thread uses."""
    cfg = cfg_for(*GRAPHS["ring"], "flood.hops_per_step=1", "flood.overlap=true")
    top = topo.build(cfg.topology)
    p = Protocol.of(cfg, top.diameter)

    def slow(src: int, dst: int, hop: int, frame: bytes) -> bytes:
        if (src, hop) == (1, 1):
            time.sleep(1.0)  # node 1's hops of step 1 are still running when its estimate fails
        return frame

    network = InMemoryNetwork({i: top.neighbors(i) for i in top.nodes}, timeout_s=20.0, mutate=slow)
    errors: dict[int, BaseException] = {}
    workloads = {i: Workload.build(cfg) for i in top.nodes}

    def run(node: int) -> None:
        wl = workloads[node]

        def loss(s: int) -> float:
            if node == 1 and s == 2:
                raise zo.EstimateError("loss is not finite at step 2 (test)")
            return wl.loss(node, s)

        try:
            with network.endpoint(node) as transport:
                c = Client(node, top.neighbors(node), p, wl.direction, loss, transport, hop_timeout_s=60.0)
                try:
                    c.run()
                finally:
                    if node == 1:
                        assert c.mode.inflight is None
        except BaseException as e:  # noqa: BLE001
            errors[node] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in top.nodes]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads)
    assert "loss is not finite at step 2" in str(errors[1])
    assert all(isinstance(errors[n], TransportError) for n in (0, 2, 3)), errors
