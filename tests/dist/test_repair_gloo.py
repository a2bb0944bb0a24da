"""Graph repair in a launched run (docs/churn-design.md, Graph repair): 1 evaluator + 6 clients on
a ring as processes, one gloo group per edge, `churn.settle: 1`, paced steps.

Node 1 is sent SIGTERM (a graceful leave); once its leave is committed, node 4 is. Those two
leaves split the ring into 2-3 and 5-0, two of four members each. With `churn.repair` every
client that commits a leave grows the rule's edges (0-2 after node 1's, 3-5 after node 4's:
`EdgeSet.grow`), each heals over a new gloo pair at an exchange index both ends agreed on
through the store, and the four finish on one hash, the one `seedflood replay` of the log
gives. The control, the same run without `churn.repair`: no part holds a majority of the four,
and every one of them stops with its one line.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

import runs
from procs import World

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]
CLIENTS = 6
WORLD = CLIENTS + 1
STEPS = 40
LEAVERS = (1, 4)
STAYERS = (0, 2, 3, 5)
REPAIRED = ((0, 2), (3, 5))


def text(group: World) -> str:
    return "".join(p.stdout for p in group)


def two_leaves(tmp_path: Path, repair: bool) -> tuple[World, Path, str]:
    """Run the ring of 6, send node 1 SIGTERM a few steps in and node 4 once node 1 has left
    (and, with repair, once edge 0-2 healed at both ends); wait for every process to exit;
    returns the world, the run directory and everything the processes printed."""
    out = tmp_path / "run"
    sets = runs.churn(
        out,
        STEPS,
        "topology.kind=ring",
        f"topology.nodes={CLIENTS}",
        "run.step_delay_s=0.1",
        "transport.timeout_s=2",
        "run.hash_steps=true",
        *(["churn.repair=true"] if repair else []),
    )
    group = World(tmp_path / "procs", runs.train(*sets), WORLD, merge=True)
    group.watch(out / "log.bin")
    with group.start_all() as run:
        runs.wait_for_steps(run, out, 4)
        run.signal(str(LEAVERS[0] + 1), signal.SIGTERM)
        first = [f"node {LEAVERS[0]} left at step"]
        if repair:
            first += [f"node {a}: edge to node {b} healed at hop" for a, b in (REPAIRED[0], REPAIRED[0][::-1])]
        run.wait_for(lambda: all(f in text(run) for f in first), f"node {LEAVERS[0]}'s leave (and repair)")
        run.signal(str(LEAVERS[1] + 1), signal.SIGTERM)
        run.wait()
        said = text(run)
    return run, out, said


def test_two_leaves_that_split_a_launched_ring_of_six_are_repaired_and_the_four_finish(tmp_path):
    run, out, said = two_leaves(tmp_path, repair=True)
    assert run.codes() == [0] * WORLD, said[-8000:]
    for n in LEAVERS:
        assert f"node {n} left at step" in said, said[-8000:]
    for a, b in REPAIRED:  # the rule's edges, grown and healed at both ends
        for x, y in ((a, b), (b, a)):
            assert re.search(rf"node {x}: graph repair after step \d+ links node {y}\b", said), said[-8000:]
            assert f"node {x}: edge to node {y} healed at hop" in said, said[-8000:]
    linked = {tuple(map(int, m)) for m in re.findall(r"node (\d+): graph repair after step \d+ links node (\d+)", said)}
    assert linked == {e for a, b in REPAIRED for e in ((a, b), (b, a))}, linked
    assert "Traceback" not in said, said[-8000:]
    s = json.loads((out / "summary.json").read_text())
    assert sorted(s["left"]) == list(LEAVERS) and s["consensus"], s
    assert [s["client_hashes"][n] for n in STAYERS] == [s["param_hash"]] * len(STAYERS)
    steps = [s["client_step_hashes"][n] for n in STAYERS]
    assert all(hs == steps[0] for hs in steps) and len(steps[0]) == STEPS
    assert runs.replay(out) == {"steps": STEPS, "param_hash": s["param_hash"]}


def test_the_same_leaves_without_repair_stop_the_four(tmp_path):
    """The control: without churn.repair the two halves stay apart, neither holds a majority of
    the four, and each of the four stops with its one line."""
    run, _, said = two_leaves(tmp_path, repair=False)
    assert "graph repair" not in said, said[-8000:]
    for n in STAYERS:
        assert run.codes([str(n + 1)]) == [1], said[-8000:]
        assert re.search(rf"node {n}: step \d+ was not committed within", said), said[-8000:]
