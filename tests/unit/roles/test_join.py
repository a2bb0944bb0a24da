"""A brand-new node id joins a running run, in process (docs/churn-design.md, A new id joins).

Every case runs the real client loop over the in-memory network with the debug model, as
test_churn.py and test_leave.py do (churn.settle=1, transport.timeout_s=1), on a ring of 5 open
to ids up to 7 (churn.max_nodes=8), and checks the clients' bits after every step against a
replay of the decided steps and the log written from them (`check_survivors`)."""

from __future__ import annotations

import logging

import pytest
from test_churn import PACED, cfg_for, check_survivors, joined, left, protocol_of

from seedflood.comm import identity
from seedflood.core import config
from seedflood.core.churn import joining
from seedflood.core.config.configerror import ConfigError
from seedflood.core.membership.growth import Growth
from seedflood.core.topology import resolve as topo
from seedflood.roles.inprocess import Event, SimResult, simulate

RING5 = ("topology.kind=ring", "topology.nodes=5", "churn.max_nodes=8")
LINE4 = ("topology.kind=tree", "topology.nodes=4", "churn.max_nodes=5", "flood.hops_per_step=1")
"""The line 3-1-0-2 (a binary tree of 4), one hop a step: delay 6, a vote's spread of 3 hops."""


def ring5(*overrides: str, steps: int = 16) -> config.Config:
    return cfg_for(*RING5, PACED, *overrides, steps=steps)  # every run here has a join: paced


def counted_from(r: SimResult, node: int) -> int:
    """The first step whose record holds `node`'s messages; every later one holds them too."""
    steps = [s for s, msgs in r.records if any(m.origin == node for m in msgs)]
    assert steps and steps == list(range(steps[0], steps[-1] + 1)), steps
    return steps[0]


def edges_of(node: int, cfg: config.Config, r: SimResult) -> tuple[int, ...]:
    """The join rule's edges for `node`, from the committed changes (as every client computes them)."""
    top = topo.build(cfg.topology)
    g = Growth.of({i: top.neighbors(i) for i in top.nodes}, protocol_of(cfg).delay)
    return g.edges(node, joined(r)[node], r.changes)


@pytest.fixture
def sponsors(caplog):
    """The 'sponsoring node N' lines: who sponsored whom."""
    caplog.set_level(logging.WARNING, logger="seedflood.roles")

    def said() -> dict[int, int]:
        out = {}
        for rec in caplog.records:
            m = rec.getMessage()
            if ": sponsoring node " in m:
                out[int(m.split()[4])] = int(m.split()[1].rstrip(":"))
        return out

    return said


def test_a_new_id_joins_a_ring_of_five_and_all_six_finish_on_one_history(tmp_path, sponsors):
    """Node 5 (not in the ring) joins mid-run: a member the join rule links it to sponsors it,
    a committed step admits it (logged as its join, incarnation 0), its messages are in every
    step from that one on and in none before, and all six end on one hash equal to a replay of
    the log, whose reader takes the roster of 6 over the topology of 5 (churn.max_nodes)."""
    cfg = ring5()
    r = simulate(cfg, events=[Event(4, 5, "join")])
    assert r.exits == {} and sorted(r.hashes) == list(range(6)), r.exits
    assert len(set(r.hashes.values())) == 1
    (change,) = r.changes.values()
    assert change.join == ((5, 0),) and change.leave == ()
    assert counted_from(r, 5) == joined(r)[5] > 4
    assert edges_of(5, cfg, r) == (0, 1)  # founders with the fewest links, lowest ids first
    assert sponsors()[5] in (0, 1)
    check_survivors(cfg, r, tmp_path)


def test_control_unsponsored_new_id_stops(monkeypatch):
    """The control: with `joining.knock` sponsoring nobody, the same new id is never admitted;
    it stops with one line and the five founders finish without it."""

    def nobody(m, t, hop):
        yield from ()

    monkeypatch.setattr(joining, "knock", nobody)
    r = simulate(ring5(), events=[Event(4, 5, "join")])
    assert r.changes == {} and sorted(r.hashes) == list(range(5)) and list(r.exits) == [5], r.exits


def test_two_new_ids_join_one_after_another(tmp_path, sponsors):
    """Nodes 5 and 6 join in turn; the second's edges come from the graph the first's committed
    join grew (the founders it links to are the ones still with the fewest links), and all seven
    end on one history."""
    cfg = ring5(steps=28)
    # Node 6 knocks at step 14: its join step e reads the graph committed through e - lag
    # (Growth.lag = 6 here), which must hold node 5's join. Knocking at step 9 left that to timing:
    # on a loaded machine node 5 was admitted at step 10 and node 6 at 15, whose graph (through 9)
    # rightly lacked node 5, so node 6 linked to 0 and 1 as well.
    r = simulate(cfg, events=[Event(3, 5, "join"), Event(14, 6, "join")])
    assert r.exits == {} and sorted(r.hashes) == list(range(7)), r.exits
    lag = Growth.of({}, protocol_of(cfg).delay).lag
    assert joined(r)[5] <= joined(r)[6] - lag, (joined(r), lag)  # the premise: 6's graph holds 5's join
    assert counted_from(r, 5) == joined(r)[5] and counted_from(r, 6) == joined(r)[6]
    assert edges_of(5, cfg, r) == (0, 1) and edges_of(6, cfg, r) == (2, 3)
    assert sponsors()[6] in (2, 3)
    check_survivors(cfg, r, tmp_path)


def test_a_new_id_joins_while_a_member_crashes(tmp_path):
    """Node 5 joins while node 3 is killed: the crash commits as a leave, the join as a join, and
    the five others finish on one history."""
    cfg = ring5(steps=20)
    r = simulate(cfg, events=[Event(4, 5, "join"), Event(6, 3, "kill")])
    assert r.exits == {3: "killed at step 6"} and sorted(r.hashes) == [0, 1, 2, 4, 5], r.exits
    assert left(r) == {3: 6} and 5 in joined(r)
    assert counted_from(r, 5) == joined(r)[5]
    check_survivors(cfg, r, tmp_path)


def test_a_new_id_joins_then_leaves_gracefully(tmp_path):
    """Node 5 joins, then is asked to leave: a committed step leaves it out, it stops with its one
    line, and the five founders finish on one history that holds its messages in between only."""
    cfg = ring5(steps=24)
    r = simulate(cfg, events=[Event(3, 5, "join"), Event(14, 5, "leave")])
    assert r.exits == {5: f"node 5 left at step {left(r)[5]}"}, r.exits
    assert sorted(r.hashes) == list(range(5))
    assert joined(r)[5] < left(r)[5]
    steps = [s for s, msgs in r.records if any(m.origin == 5 for m in msgs)]
    assert steps == list(range(joined(r)[5], left(r)[5]))
    check_survivors(cfg, r, tmp_path)


def test_a_new_id_whose_edge_is_the_only_bridge_to_an_end_that_missed_its_note_lets_all_five_finish(
    tmp_path, sponsors, caplog
):
    """The explorer's most common stuck join, in process: on the line 3-1-0-2 new id 4 links to
    the ends 2 and 3, and the middle link 0-1 is cut at step 16, a step after its sponsor (an
    end) claims it or the same (its claim waits 2·spread + 1 exchanges: `joining.knock`), so
    its JOIN note never crosses to the other end; each half holds two of four members, so
    neither commits anything alone, the step admitting the newcomer included, and the other
    end's edge to the newcomer is the only bridge. That end saw the knock, so it expects the
    newcomer and both heal that edge before admission: all five finish on one hash equal to a
    replay of the log, the newcomer admitted at its JOIN step."""
    cfg = cfg_for(*LINE4, PACED, steps=30)
    r = simulate(cfg, events=[Event(2, 4, "join"), Event(16, 0, "cut", 1)])
    assert r.exits == {} and sorted(r.hashes) == list(range(5)), r.exits
    sponsor = sponsors()[4]
    claimed = joined(r)[4] - protocol_of(cfg).delay - 1  # the step whose start it was claimed at
    # the note reaches the middle (0 or 1) at the claimed step, crosses 0-1 at the next: cut by then
    assert sponsor in (2, 3) and claimed >= 16 - 1, (sponsor, claimed)
    other = 5 - sponsor
    said = [rec.getMessage() for rec in caplog.records]
    assert any(m.startswith(f"node {other}: edge to node 4 healed at hop ") for m in said), said
    assert counted_from(r, 4) == joined(r)[4]
    check_survivors(cfg, r, tmp_path)


@pytest.mark.parametrize(
    ("events", "overrides", "said"),
    [
        ([Event(3, 2, "join")], (), "join of node 2: it is a member already (the topology's nodes are 0..4)"),
        ([Event(3, 8, "join")], (), "join of node 8: churn.max_nodes is 8, so new ids are 5..7"),
        (
            [Event(3, 5, "join"), Event(6, 5, "join")],
            (),
            "join of node 5: it joins once (at step 3); restart it instead",
        ),
        (
            [Event(3, 5, "join")],
            ("churn.max_nodes=0",),
            "join of node 5: the run takes no new ids (set churn.max_nodes above 5)",
        ),
    ],
    ids=["member", "beyond", "twice", "closed"],
)
def test_a_join_the_run_cannot_take_is_refused_in_one_line(events, overrides, said):
    with pytest.raises(ValueError, match=r"^join of node \d+: [^\n]*$") as e:
        simulate(ring5(*overrides), events=events)
    assert said in str(e.value)


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (("churn.max_nodes=4",), "churn.max_nodes: must be 0 or at least topology.nodes (5), got 4"),
        (("churn.max_nodes=6", "churn.settle=0"), "churn.max_nodes: needs churn.settle >= 1"),
        (("churn.max_nodes=-1",), "churn.max_nodes: must be in 0..100000, got -1"),
    ],
)
def test_a_bad_max_nodes_is_a_one_line_config_error(overrides, said):
    with pytest.raises(ConfigError, match=r"^[^\n]*$") as e:
        ring5(*overrides)
    assert said in str(e.value)


def test_a_signed_run_refuses_a_new_id_without_a_key_and_admits_one_with_its_key(tmp_path):
    """With trust.sign a new id needs its key in the run's keys: with keys for the five founders
    only, its join is refused in one line before anything runs; with a key for node 5 too, it
    passes its sponsor's rejoin challenge, what it signs is taken (nothing counted as forged),
    its messages count from its join step, and the six finish on one history."""
    five, six = tmp_path / "five", tmp_path / "six"
    identity.write_keys(five, 5)
    identity.write_keys(six, 6)
    with pytest.raises(ValueError, match=r"^join of node 5: trust\.sign is on and [^\n]*$"):
        simulate(ring5("trust.sign=true", f"trust.keys={five}"), events=[Event(4, 5, "join")])
    r = simulate(ring5("trust.sign=true", f"trust.keys={six}"), events=[Event(4, 5, "join")])
    assert r.exits == {} and sorted(r.hashes) == list(range(6)), r.exits
    assert all(s.forged == 0 for s in r.flood.values())
    assert counted_from(r, 5) == joined(r)[5]
    check_survivors(ring5("trust.sign=true", f"trust.keys={six}"), r, tmp_path)


class _Knocking:
    """What `joining.knock` reads of a growing transport: `knocking` ids wait for a sponsor,
    and every `claim` is recorded (and lost: another member wins, so nothing more is asked)."""

    peers: tuple[int, ...] = ()

    def __init__(self, neighbours: tuple[int, ...], knocking: list[int]) -> None:
        self.neighbours = neighbours
        self.knocking = knocking
        self.claimed: list[int] = []

    def revived(self) -> list[int]:
        return []

    def newcomers(self) -> list[int]:
        return list(self.knocking)

    def grow(self, peers) -> None:
        self.neighbours = tuple(sorted({*self.neighbours, *peers}))

    def claim(self, node: int) -> None:
        self.claimed.append(node)


def test_a_knocking_id_that_is_a_member_is_not_sponsored_by_the_join_rule():
    """Launched, a process of an id that is a member already can knock (a whole-group relaunch
    forgets who joined, a second process of the id): the join path must not admit a new process
    as a member's old self. Its restart is its neighbours' `revived` rejoin, which waits until a
    committed step has left the old life out. The control: the same id, not a member, is claimed
    by the member the rule links it to."""
    from seedflood.core.membership.roster import Change
    from seedflood.core.wire.message import Message
    from seedflood.ml.workload import Workload
    from seedflood.roles.churnstart import ChurnStrategy
    from seedflood.roles.client import Client

    cfg = ring5(steps=30)
    p, top = protocol_of(cfg), topo.build(cfg.topology)
    growth = Growth.of({i: top.neighbors(i) for i in top.nodes}, p.delay)
    direction = Workload.build(cfg).direction

    def member_0(records, changes) -> tuple[Client, _Knocking]:
        t = _Knocking(top.neighbors(0), [5])
        # connected to its ring neighbours: a member with no edge up claims nobody (joining.knock)
        c = Client(0, top.neighbors(0), p, direction, lambda _s: 0.0, t, strategy=ChurnStrategy(t, growth=growth))  # type: ignore[arg-type]
        c.resume(records, changes)
        return c, t

    def step(s: int, origins: range) -> list[Message]:
        return [Message.make(o, s, p.seed(o, s), 0.01) for o in origins]

    logged = 12

    def exchanges(c: Client) -> None:
        """The looks before as many exchanges as a claim waits for, and one more (`joining.knock`)."""
        for _ in range(2 * c.churn.agreement.quiet + 2):
            c.churn._knock(logged)
            c.churn.member.clock += 1  # one exchange: the member's hop clock and its count
            c.churn.member.exchanges += 1

    c, t = member_0([(s, step(s, range(5))) for s in range(logged)], {})
    assert 0 in growth.edges(5, logged + p.delay + 1, {})  # ring of 5: node 5 links to 0 and 1
    exchanges(c)
    assert t.claimed == [5]  # a newcomer: claimed
    e = 4  # node 5 admitted at step 4, its first life
    records = [(s, step(s, range(6 if s >= e else 5))) for s in range(logged)]
    c, t = member_0(records, {e: Change(e, join=((5, 1),))})
    assert 5 in c.churn.roster.members
    exchanges(c)
    assert t.claimed == []
