"""wirecost.py: the model-free byte count equals hand-computed frame sizes and a real run's counter."""

from __future__ import annotations

import networkx as nx
import pytest
import torch

from seedflood.bench import wirecost
from seedflood.core.config import runconfig as config
from seedflood.core.flood.transport import HEADER
from seedflood.core.topology import builders
from seedflood.roles.inprocess import simulate

torch.set_num_threads(1)


def test_ring_of_4_full_flooding_matches_the_frame_sizes_by_hand():
    """Ring 0-1-2-3, diameter 2, K = 1: on edge i -> j hop 1 carries origin i, hop 2 origin
    i - (j - i) (the node behind i). One message a frame: v2 header 13 (1-byte count) + record
    (origin width 0 for origin 0, else 1) + 4-byte scalar; v1 16 + 24."""
    steps = 3
    for version, size in ((2, lambda o: 13 + (o != 0) + 4), (1, lambda o: 16 + 24)):
        want = {}
        for s in range(steps):
            for i in range(4):
                for j in ((i + 1) % 4, (i - 1) % 4):
                    behind = (i - (j - i)) % 4
                    want[(s, i, j)] = 2 * HEADER + size(i) + size(behind)
        got = wirecost.count(builders.ring(4), steps, hops_per_step=0, version=version)
        assert {(s, a, b): n for s, a, b, n in got.rows()} == want, version


def test_hops_beyond_the_diameter_send_empty_frames_and_count_their_length_header():
    """Two nodes, 2 hops a step (diameter 1, delay 0): hop 1 carries each node's message, hop 2
    an empty frame (v2: zero bytes, v1: a 16-byte header), whose transport length still counts."""
    pair = nx.path_graph(2)
    for version, first, empty in ((2, lambda o: 13 + (o != 0) + 4, 0), (1, lambda o: 16 + 24, 16)):
        got = wirecost.count(pair, 3, hops_per_step=2, version=version).rows()
        assert got == [(s, i, 1 - i, 2 * HEADER + first(i) + empty) for s in range(3) for i in (0, 1)], version


def test_ring_of_16_steady_state_by_hand_and_v2_below_v1():
    """16-ring, K = 1. One hop a step: each edge carries 8 messages of 8 steps a hop (offsets and
    origins 1 byte each in v2). Full flooding: 8 hops of one message each."""
    ring = builders.ring(16)
    got = {(v, h): wirecost.measure(ring, 40, hops_per_step=h, version=v) for v in (1, 2) for h in (0, 1)}
    assert got[(2, 1)].per_step_steady == HEADER + 13 + 8 * (1 + 1 + 4)  # 65
    assert got[(1, 1)].per_step_steady == HEADER + 16 + 8 * 24  # 212
    assert got[(1, 0)].per_step_steady == 8 * (HEADER + 16 + 24)  # 352
    assert (got[(1, 1)].delay, got[(1, 0)].delay, got[(1, 0)].hops) == (7, 0, 8)
    for h in (0, 1):
        assert got[(2, h)].per_run < got[(1, h)].per_run
    # The paper's budget, about 400 KB per edge per run of 5,000 steps: 80 B a step in steady state.
    assert got[(2, 1)].per_step_steady * 5000 <= 400_000


def test_a_networkx_graph_counts_like_its_topology():
    g = nx.relabel_nodes(nx.cycle_graph(5), {i: f"n{i}" for i in range(5)})
    assert wirecost.count(g, 4).rows() == wirecost.count(builders.ring(5), 4).rows()


def test_rows_have_one_cell_per_header():
    res = wirecost.project(builders.ring(4), 5)
    assert [(r.version, r.hops) for r in res] == [(1, 2), (1, 1), (2, 2), (2, 1)]
    assert all(len(row) == len(wirecost.HEADERS) for row in wirecost.rows(res))


@pytest.mark.parametrize("kind", ["ring", "torus"])
@pytest.mark.parametrize("hops", [0, 1])
def test_equals_the_bytes_a_real_simulated_run_counts(hops, kind):
    """The tiny model through the real clients, codec and in-memory transport (drain included)."""
    cfg = config.load(
        None,
        [
            "model.name=tiny",
            "task.name=synthetic",
            "run.threads=1",
            "task.batch_size=4",
            "task.train_examples=64",
            "task.dev_examples=16",
            "task.test_examples=16",
            f"topology.kind={kind}",
            f"topology.nodes={5 if kind == 'ring' else 9}",
            "zo.perturbations=2",
            f"flood.hops_per_step={hops}",
            "run.steps=3",
        ],
    )
    top = builders.ring(5) if kind == "ring" else builders.torus(9)
    real = simulate(cfg, hash_every_step=False).counter.rows()
    assert real == wirecost.count(top, 3, hops_per_step=hops, perturbations=2).rows()
    if kind == "torus":  # the runtime forwards along shortest paths only: fewer bytes than to all
        unrouted = wirecost.count(top, 3, hops_per_step=hops, perturbations=2, routed=False)
        assert sum(r[-1] for r in real) < sum(r[-1] for r in unrouted.rows())
