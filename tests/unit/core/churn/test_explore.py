"""The schedule explorer (tests/explorer.py): the real agreement through every small fault schedule.

CI runs a bounded set: every one-fault schedule (a crash in every round with every subset of its
last frame delivered, a stall, every cut link, every partition, a crash and a restart) on every
listed graph of up to 5 nodes, a seeded sample of two-fault schedules, and random deeper
schedules (3 to 5 faults, restarts included) on graphs of 6 to 8 nodes. `SEEDFLOOD_EXPLORE=deep`
runs every two-fault schedule and more random ones (tens of minutes). Each test prints how many
schedules it explored; every one must be safe (one history, the evaluator's log a prefix of
it), and every one that leaves a connected majority must see that majority finish.
"""

from __future__ import annotations

import os
import random

import networkx as nx
import pytest

import explorer as ex
from seedflood.core.churn import ballots  # the quorum rules tally reads: the controls patch them there
from seedflood.core.flood.protocol import Protocol
from seedflood.core.membership import roster

DEEP = os.environ.get("SEEDFLOOD_EXPLORE", "") == "deep"
SMALL = ex.graphs(5)


def cases(names=None, delayed=True):
    """(name, graph, protocol) with full flooding, and one hop per step on lines and rings
    (delayed flooding: votes pipelined over several steps)."""
    for name, g in SMALL.items():
        if names and name not in names:
            continue
        yield f"{name}/full", g, ex.protocol_for(g, steps=3)
        if delayed and name.startswith(("line", "ring")) and nx.diameter(g) > 1:
            yield f"{name}/1hop", g, ex.protocol_for(g, steps=3, hops=1)


def rounds_of(p) -> int:
    """Rounds in which a fault can matter: until the last step's votes are in."""
    return (p.steps + p.delay + 1) * p.hops


def check(report: ex.Report) -> None:
    print(report.summary())
    assert report.schedules > 0
    assert not report.unsafe, "\n".join(f"{n}: {[str(f) for f in fs]}: {why}" for n, fs, why in report.unsafe[:5])
    assert not report.stuck, "\n".join(f"{n}: {[str(f) for f in fs]}: {why}" for n, fs, why in report.stuck[:5])


def test_without_faults_every_graph_finishes_with_one_history():
    for name, g, p in cases():
        out = ex.World(g, p).run()
        assert out.safe and out.live, (name, out.problem)
        assert set(out.states.values()) == {"done"} and all(len(h) == p.steps for h in out.histories.values())
        assert out.log == out.histories[0]  # the evaluator logged every step


def test_every_single_fault_schedule_is_safe_and_a_connected_majority_finishes():
    report = ex.Report()
    names = None if DEEP else ["line3", "star4", "ring4", "complete4", "ring5", "wheel5", "complete5", "chord5"]
    for name, g, p in cases(names):
        for faults in ex.single_faults(g, rounds_of(p)):
            report.add(name, faults, ex.World(g, p, faults).run())
    check(report)


def test_two_fault_schedules_are_safe_and_a_connected_majority_finishes():
    rnd = random.Random(20261124)
    report = ex.Report()
    per_case = None if DEEP else 120
    for name, g, p in cases():
        if per_case is None:
            schedules = list(ex.pairs(g, rounds_of(p)))
        else:  # = rnd.sample(list(ex.pairs(...)), ...) without making every pair (the test below)
            schedules = ex.sample_pairs(g, rounds_of(p), rnd, per_case)
        for faults in schedules:
            report.add(name, faults, ex.World(g, p, faults).run())
    check(report)


def test_a_sample_of_pairs_is_the_sample_of_every_pair_made():
    """`sample_pairs` draws what random.sample draws from the list of every pair (the same
    schedules in the same order, the generator left in the same state), for samples smaller
    than the pairs (and, on line3, larger), on graphs and protocols the two-fault test samples."""
    for name, g, p in cases(["line3", "star4", "ring4", "torus2x2"]):
        every = list(ex.pairs(g, rounds_of(p)))
        assert len(every) > 120, name
        for k in (1, 120, *([len(every) + 1] if name.startswith("line3/") else [])):
            made, drawn = random.Random(k), random.Random(k)
            assert ex.sample_pairs(g, rounds_of(p), made, k) == drawn.sample(every, min(k, len(every))), (name, k)
            assert made.getstate() == drawn.getstate(), (name, k)


def test_random_deeper_schedules_on_larger_graphs_are_safe():
    rnd = random.Random(7)
    big = ex.larger_graphs()
    report = ex.Report()
    for name, g in big.items():
        for hops in (0, 1):
            p = ex.protocol_for(g, steps=6, hops=hops)
            for _ in range(200 if DEEP else 15):
                faults = ex.random_schedule(g, rounds_of(p), rnd, rnd.randint(3, 5))
                out = ex.World(g, p, faults).run()
                report.add(f"{name}/h{p.hops}", faults, out)
    print(report.summary())
    # safety on every schedule; liveness is checked above, where the faults are few enough to
    # leave a connected majority that votes its way through (docs/churn-design.md, Liveness, says when not)
    assert not report.unsafe, [(n, [str(f) for f in fs], why) for n, fs, why in report.unsafe[:5]]


# -- the reviewer's failures, as named schedules ----------------------------------------------
def ring8(hops: int = 1):
    g = nx.cycle_graph(8)
    return g, ex.protocol_for(g, steps=12, hops=hops)


def test_f1_one_cut_link_on_a_ring_of_eight_forks_nothing_and_everyone_trains_on():
    g, p = ring8()
    out = ex.World(g, p, [ex.Fault(4 * p.hops, "cut", edges=frozenset({(0, 1)}))]).run()
    assert out.safe and set(out.states.values()) == {"done"}, out.problem
    assert len({tuple(h) for h in out.histories.values()}) == 1


def test_f3_a_cut_then_an_even_split_stops_everyone_and_nobody_forks():
    g, p = ring8()
    cuts = [ex.Fault(4, "cut", edges=frozenset({(0, 1)})), ex.Fault(9, "cut", edges=frozenset({(4, 5)}))]
    out = ex.World(g, p, cuts).run()
    assert out.safe, out.problem
    assert set(out.states.values()) == {"stopped"}  # 4 of 8 on each side: no majority anywhere
    assert all("no reachable majority agrees" in why for why in out.why.values())


def test_f4_the_connected_rim_of_a_wheel_trains_on_when_its_hub_dies():
    g = nx.wheel_graph(11)  # hub 0 joined to a rim ring of 10
    p = ex.protocol_for(g, steps=8)
    out = ex.World(g, p, [ex.Fault(3 * p.hops, "crash", 0)]).run()
    assert out.safe and out.live, out.problem
    assert all(out.states[i] == "done" for i in range(1, 11))


def test_a_partition_leaves_the_majority_training_and_the_minority_stopped():
    g, p = ring8(hops=0)
    split = frozenset({(0, 1), (3, 4)})  # {1, 2, 3} against {4, ..., 0}
    out = ex.World(g, p, [ex.Fault(2 * p.hops + 1, "cut", edges=split)]).run()
    assert out.safe and out.live, out.problem
    assert {i for i, s in out.states.items() if s == "done"} == {0, 4, 5, 6, 7}
    assert {i for i, s in out.states.items() if s == "stopped"} == {1, 2, 3}


def test_the_explorer_finds_a_fork_when_the_quorum_is_not_a_majority(monkeypatch):
    """The checker can fail: with half the roster as a quorum, both halves of an even split
    commit their own step, and the explorer names the schedule."""
    monkeypatch.setattr(ballots, "quorum", lambda members, ballot: members // 2)
    g = nx.cycle_graph(4)
    p = ex.protocol_for(g, steps=3)
    report = ex.Report()
    for faults in ex.single_faults(g, rounds_of(p), restarts=False):
        report.add("ring4", faults, ex.World(g, p, faults).run())
    print(report.summary())
    assert report.unsafe


@pytest.mark.parametrize("n", [3, 4, 5])
def test_the_evaluator_log_is_a_prefix_of_the_history_when_its_attach_client_crashes(n):
    g = nx.cycle_graph(n) if n > 3 else nx.path_graph(3)
    p = ex.protocol_for(g, steps=5)
    for r in range(rounds_of(p)):
        out = ex.World(g, p, [ex.Fault(r, "crash", 0), ex.Fault(r + 3, "restart", 0)]).run()
        assert out.safe, out.problem
        assert out.log and out.log == max(out.histories.values(), key=len)[: len(out.log)]


def test_control_evaluator_without_follow_logs_nothing(
    monkeypatch,
):
    """The control of the evaluator's follow: node 0 crashes in round 2 of a ring of 4, and the
    evaluator, following node 1 once a committed step leaves 0 out, logs every step; with
    `roster.next_attach` keeping the attach node on 0, it logs none (0 sent it nothing yet)."""
    g = nx.cycle_graph(4)
    p = ex.protocol_for(g, steps=5)
    out = ex.World(g, p, [ex.Fault(2, "crash", 0)]).run()
    assert out.safe and out.live and len(out.log) == p.steps, out.log
    monkeypatch.setattr(roster, "next_attach", lambda current, members, n_origins: current)
    out = ex.World(g, p, [ex.Fault(2, "crash", 0)]).run()
    assert out.safe and out.live and out.log == [], out.log


def test_every_single_equivocation_is_safe_and_the_honest_majority_excludes_the_liar():
    """A node sends another copy of its message (another scalar) to some neighbours and the
    first copy to the rest, at any hop: every schedule keeps one history; where the honest nodes
    stay connected without the liar they all finish, and if its lie reached anyone they excluded
    it (the COPY evidence reached every voter). Where the liar is a cut vertex (line3's middle,
    star4's centre) nobody can hold both copies: one history still, but no liveness promise."""
    report = ex.Report()
    lies = excluded = 0
    for name, g, p in cases(["line3", "star4", "ring4", "complete4", "ring5", "wheel5", "chord5", "torus2x2"]):
        for faults in ex.equivocations(g, rounds_of(p)):
            out = ex.World(g, p, faults).run()
            report.add(name, faults, out)
            liar = faults[0].node
            if out.lied and nx.is_connected(g.subgraph(set(g.nodes) - {liar})):
                lies += 1
                excluded += out.states[liar] == "stopped" and "without this client" in out.why[liar]
                honest = {i: out.states[i] for i in g.nodes if i != liar}
                assert set(honest.values()) == {"done"}, (name, str(faults[0]), honest, out.why)
                assert "without this client" in out.why[liar], (name, str(faults[0]), out.states[liar], out.why[liar])
    print(
        f"{lies} schedules where a lie reached a client of a graph still connected without the liar: {excluded} excluded it"
    )
    check(report)


# -- lying voters (signed votes, f < n/3) -----------------------------------------------------------
def test_every_lying_voter_on_four_nodes_is_safe_the_honest_finish_and_a_double_voter_is_excluded():
    """n = 4, f = 1, signed: every node as a liar (mute, a bogus value, a two-faced bridge, two
    values to each proper subset of its neighbours) from every round. One history everywhere;
    where the honest three stay connected without the liar they all finish; a double vote cast
    on step 0 is excluded through a committed step (both signed votes flood as its proof; with
    full flooding, where the proof reaches the proposals of the 3-step run's later steps)."""
    report = ex.Report()
    doubles = 0
    for name, g, p in cases(["ring4", "complete4", "star4"]):
        for faults in ex.lying_voters(g, rounds_of(p)):
            w = ex.World(g, p, faults, signed=True)
            out = w.run()
            report.add(name, faults, out)
            liar = faults[0].node
            full = name.endswith("/full")  # one hop a step: 3 steps end before the proof reaches a proposal
            if full and w.doubled.get(liar) == 0 and nx.is_connected(g.subgraph(set(g.nodes) - {liar})):
                doubles += 1
                assert "without this client" in out.why[liar], (name, str(faults[0]), out.states[liar], out.why[liar])
    print(f"{doubles} schedules with a double vote on step 0 and the honest connected: each excluded its voter")
    assert doubles > 0
    check(report)


def test_lying_voters_on_five_to_seven_nodes_are_safe_alone_and_beside_another_fault():
    """A seeded sample on rings, complete graphs and a line of 5-7 (f = 1, f = 2 on 7): one liar
    alone (the honest finish where they stay connected), two liars on 7, and a liar beside a
    crash, stall, cut or partition (safety only: a liar and a crash together can leave fewer
    than a quorum of honest voters, docs/churn-design.md, Liveness)."""
    rnd = random.Random(20261201)
    alone, beside = ex.Report(), ex.Report()
    graphs = {"line5": nx.path_graph(5), "ring6": nx.cycle_graph(6), "complete6": nx.complete_graph(6)}
    graphs |= {"ring7": nx.cycle_graph(7), "complete7": nx.complete_graph(7), "complete5": nx.complete_graph(5)}
    for name, g in graphs.items():
        p = ex.protocol_for(g, steps=3)
        liars = list(ex.lying_voters(g, rounds_of(p)))
        singles = list(ex.single_faults(g, rounds_of(p), restarts=False))
        for faults in rnd.sample(liars, 40):
            alone.add(name, faults, ex.World(g, p, faults, signed=True).run())
        for _ in range(30):
            a, b = rnd.choice(liars), rnd.choice(singles if g.number_of_nodes() < 7 else liars)
            if b[0].node != a[0].node:
                beside.add(name, a + b, ex.World(g, p, a + b, signed=True).run())
    check(alone)
    print(beside.summary())
    assert beside.schedules > 100 and not beside.unsafe, [
        (n, [str(f) for f in fs], w) for n, fs, w in beside.unsafe[:3]
    ]


def test_the_explorer_finds_a_fork_when_signed_votes_are_counted_by_the_plain_majority(monkeypatch):
    """The checker can fail: a two-faced bridge in the middle of a line of 5 tells each side it
    voted that side's value; counted by the crash rule (f = 0: a later ballot commits on 3 of
    5), each side commits its own step. With f = 1 (quorum 4) the same schedules are safe."""
    g = nx.path_graph(5)
    p = ex.protocol_for(g, steps=3)
    schedules = [[ex.Fault(r, "split", 2)] for r in range(rounds_of(p))]
    safe = ex.Report()
    for faults in schedules:
        safe.add("line5", faults, ex.World(g, p, faults, signed=True).run())
    assert safe.schedules and not safe.unsafe
    monkeypatch.setattr(ballots, "faults", lambda members: 0)
    forked = ex.Report()
    for faults in schedules:
        forked.add("line5", faults, ex.World(g, p, faults, signed=True).run())
    print(forked.summary())
    assert forked.unsafe


# -- healed edges (in process: docs/churn-design.md, Healed edges) ------------------------------------
HEAL_GRAPHS = ["line3", "star4", "ring4", "complete4", "ring5", "wheel5", "complete5", "chord5"]


def heal_delays(p) -> tuple[int, ...]:
    """Rounds from a fault to its heal: at once, a few rounds, a run's fault window, and just past
    the patience (the heal comes while the clients wait past it)."""
    return (1, 3, rounds_of(p), p.patience_hops + 2)


def check_heals(report: ex.Report, behind: int) -> None:
    print(report.summary(), f"({behind} with a healed client left behind by an applied step)")
    assert report.schedules > 0
    assert not report.unsafe, "\n".join(f"{n}: {[str(f) for f in fs]}: {why}" for n, fs, why in report.unsafe[:5])
    assert not report.stuck, "\n".join(f"{n}: {[str(f) for f in fs]}: {why}" for n, fs, why in report.stuck[:5])


def run_heals(name, g, p, faults, report: ex.Report) -> int:
    """Run one schedule into `report`; where the only clients of the connected majority that did
    not finish are healed ones left behind by an applied step (`ex.excuse_left_behind`), it counts as live.
    Returns 1 if a client was left behind so."""
    out, behind = ex.excuse_left_behind(faults, ex.World(g, p, faults).run())
    report.add(name, faults, out)
    return int(behind)


def test_every_cut_and_its_heal_and_every_stall_and_its_wake_up_is_safe_and_a_connected_majority_finishes():
    """Each cut link and partition and its heal, each stall and its wake-up, in every round, at
    each delay of `heal_delays` (a seeded sample in CI, all with SEEDFLOOD_EXPLORE=deep): one
    history on every schedule; where the final graph (every heal in) has a connected majority it
    finishes, but for a healed client left behind by a step applied before its heal."""
    rnd = random.Random(20261127)
    report, behind = ex.Report(), 0
    for name, g, p in cases(HEAL_GRAPHS):
        schedules = list(ex.heals(g, rounds_of(p), heal_delays(p)))
        for faults in schedules if DEEP else rnd.sample(schedules, min(40, len(schedules))):
            behind += run_heals(name, g, p, faults, report)
    check_heals(report, behind)


def test_a_cut_or_stall_with_its_heal_beside_one_other_fault_is_safe():
    """A heal pair beside any one other fault (a crash with any partial last frame, a stall, a cut,
    a partition) in any round: one history on every schedule. Liveness is printed, not asserted:
    some pairs leave a connected majority that does not finish (not yet triaged)."""
    rnd = random.Random(20261128)
    report, behind = ex.Report(), 0
    for name, g, p in cases(HEAL_GRAPHS):
        healing = list(ex.heals(g, rounds_of(p), heal_delays(p)))
        singles = list(ex.single_faults(g, rounds_of(p), restarts=False))
        for _ in range(len(healing) if DEEP else 25):
            faults = rnd.choice(healing) + rnd.choice(singles)
            behind += run_heals(name, g, p, faults, report)
    print(report.summary())
    assert report.schedules > 200 and not report.unsafe, [
        (n, [str(f) for f in fs], w) for n, fs, w in report.unsafe[:3]
    ]


def test_the_ring_of_eight_whose_cut_and_stalled_bridge_stopped_everyone_trains_on_once_the_bridge_wakes():
    """One hop a step: link 0-1 is cut, then node 4 stalls before step 0 commits, and the ring
    falls into {1, 2, 3}, {4}, {5, 6, 7, 0}: no majority anywhere, every client stops (the model
    without heals, as gloo). With in-process heals node 4 wakes a few rounds later, its edges to
    3 and 5 heal at an index both ends agreed on, and all eight finish on one history."""
    g, p = ring8()
    cut, stall = ex.Fault(3, "cut", edges=frozenset({(0, 1)})), ex.Fault(6, "stall", 4)
    out = ex.World(g, p, [cut, stall]).run()
    assert out.safe and set(out.states.values()) == {"stopped"}, out.states
    for wake in (7, 9, 6 + p.patience_hops, 6 + 2 * p.patience_hops):
        w = ex.World(g, p, [cut, stall, ex.Fault(wake, "heal", 4)])
        out = w.run()
        assert out.safe and set(out.states.values()) == {"done"}, (wake, out.problem)
        assert len({tuple(h) for h in out.histories.values()}) == 1 and len(out.histories[0]) == p.steps
        assert {e for _, e in w.healed} == {(3, 4), (4, 5)}, w.healed


def test_a_cut_link_that_heals_on_a_graph_it_never_split_leaves_everyone_finishing():
    """A cut that leaves the graph connected, healed at any delay: every client finishes, one
    history, and the link is connected again where both ends still ran when it could be."""
    healed = 0
    for name, g, p in cases(["ring4", "ring5", "chord5"]):
        for r in range(0, rounds_of(p), 3):
            for a, b in sorted(g.edges):
                faults = [
                    ex.Fault(r, "cut", edges=frozenset({(a, b)})),
                    ex.Fault(r + 2, "heal", edges=frozenset({(a, b)})),
                ]
                w = ex.World(g, p, faults)
                out = w.run()
                assert out.safe and set(out.states.values()) == {"done"}, (name, [str(f) for f in faults], out.problem)
                if min(w.closed_at[a], w.closed_at[b]) >= r + 2 + Protocol.HEAL_AHEAD:  # both ran to the heal
                    healed += 1
                    assert any(e == ex.edge(a, b) for _, e in w.healed), (name, r, (a, b), w.healed)
    assert healed > 20


def test_a_stall_under_the_bound_returns():
    """The stall bound (docs/churn.md): full flooding on a ring of 8 (4 hops a step, vote lag 1).
    A member stalled at a step's first hop is dropped at once (the explorer's stall is one past
    `transport.timeout_s`); woken within vote_lag · hops = 4 hops it is still a member, its
    edges heal and it finishes, at every position, without a restart. Control: woken a hop
    later, the others have voted that step without its messages and it is committed out, at
    every position but node 0 (both its edges healed a hop before the vote, so two voters
    proposed it and ballot 0 did not commit without it)."""
    g = nx.cycle_graph(8)
    p = ex.protocol_for(g, steps=8)
    bound, at = p.vote_lag * p.hops, 2 * p.hops
    assert bound == 4
    for v in g.nodes:
        out = ex.World(g, p, [ex.Fault(at, "stall", v), ex.Fault(at + bound, "heal", v)]).run()
        assert out.safe and set(out.states.values()) == {"done"}, (v, out.problem, out.repro)
    for v in sorted(g.nodes)[1:]:
        out = ex.World(g, p, [ex.Fault(at, "stall", v), ex.Fault(at + bound + 1, "heal", v)]).run()
        assert out.safe and out.live and out.states[v] == "stopped", (v, out.states)
        assert "committed step 2 without this client" in out.why[v], out.why[v]
