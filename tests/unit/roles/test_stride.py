"""zo.stride: a slow client originates its K messages only on every m-th step (docs/churn.md,
Unequal speeds). Every client knows the schedule, so each step's expected origins are a pure
function of it: strict and churn runs stay bit-identical and replay from their logs, the strided
node's messages are there exactly on its steps, it runs no forward on the others, and with the
setting off nothing changes."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import oracle
from seedflood.core.churn.agreement import Agreement
from seedflood.core.config import runconfig as config
from seedflood.core.config.configerror import ConfigError
from seedflood.core.flood.flooding import Flood
from seedflood.core.flood.protocol import Protocol, digest, trajectory
from seedflood.core.wire import message
from seedflood.core.wire.message import FrameError, Message
from seedflood.core.zo.replay import Applier, state_hash
from seedflood.ml.workload import Workload
from seedflood.roles import sharedmodel
from seedflood.roles.inprocess import SimResult, simulate
from seedflood.rundir.logfile import LogWriter

torch.set_num_threads(1)

BASE = [
    "model.name=tiny",
    "task.name=synthetic",
    "run.threads=1",
    "zo.lr=1.0",
    "zo.aggregate=mean",
    "task.batch_size=8",
    "task.train_examples=256",
    "task.dev_examples=64",
    "task.test_examples=64",
    "topology.nodes=4",
    "run.steps=7",
]
STRIDE = "zo.stride={1: 3, 2: 2}"  # node 1 on steps 0, 3, 6; node 2 on 0, 2, 4, 6
DUE = [[0, 1, 2, 3], [0, 3], [0, 2, 3], [0, 1, 3], [0, 2, 3], [0, 3], [0, 1, 2, 3]]


def cfg_for(*overrides: str) -> config.Config:
    return config.load(None, BASE + list(overrides))


@pytest.fixture(scope="module", params=["strict", "churn"])
def strided(request) -> tuple[config.Config, SimResult, list[tuple[int, int]]]:
    """A strided in-process run; the (node, step) of every forward's loss, recorded."""
    cfg = cfg_for(STRIDE, *(["churn.settle=1"] if request.param == "churn" else []))
    calls: list[tuple[int, int]] = []
    loss = Workload.loss

    def recorded(self: Workload, node: int, step: int) -> float:
        calls.append((node, step))
        return loss(self, node, step)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Workload, "loss", recorded)
        result = simulate(cfg)
    return cfg, result, calls


def test_every_client_is_identical_after_every_step_and_equals_a_replay_of_the_log(strided):
    cfg, r, _ = strided
    assert not r.exits and not r.changes  # churn: a skipped step is no leave
    per_step = list(zip(*r.step_hashes.values()))
    assert len(per_step) == 7 and all(len(set(hs)) == 1 for hs in per_step)
    w = Workload.build(cfg)
    protocol = Protocol.of(cfg, 2)
    for s, msgs in r.records:
        protocol.check_step(s, msgs)  # the log's check: exactly the due origins' messages
    Applier(w.direction, protocol).apply_all(r.records)
    assert state_hash(w.model, w.direction) == r.hashes[0]


def test_a_strided_node_originates_exactly_on_its_steps_and_runs_no_forward_on_the_others(strided):
    _, r, calls = strided
    assert [sorted({m.origin for m in msgs}) for _, msgs in r.records] == DUE
    assert [len(msgs) for _, msgs in r.records] == [len(d) for d in DUE]  # K = 1 each
    # 2 forwards per message (the two-point estimate), none on a skipped step: a launched slow
    # client's paced sleep (train._paced) runs inside this loss, so it is skipped with them
    for node in range(4):
        assert sorted({s for n, s in calls if n == node}) == [s for s, d in enumerate(DUE) if node in d]
        assert len([c for c in calls if c[0] == node]) == 2 * sum(node in d for d in DUE)


def test_the_independent_oracle_reaches_the_same_bits_from_the_log(strided, tmp_path):
    """tests/oracle.py applies the log without Protocol, Flood or Applier: each step holds the
    due origins' messages and mean divides by how many there are."""
    cfg, r, _ = strided
    log = tmp_path / "log.bin"
    header = {"base_identity": "tiny (test)", "base_hash": r.workloads[0].loaded.base_hash}
    writer = LogWriter(log, {**header, "trajectory": {"run.seed": cfg.run.seed}, "config": {}})
    for step, msgs in r.records:
        writer.append(step, msgs)
    writer.close()
    assert oracle.oracle_hash(cfg, log) == (7, r.hashes[0])
    assert oracle.oracle_hash(cfg, log, upto=1) == (2, r.step_hashes[0][1])


def test_the_shared_model_simulation_has_the_bits_of_the_in_process_run(strided):
    """Strict; and churn without a fault, which commits every due origin: the bits of a strict
    run with churn's delay."""
    cfg, r, _ = strided
    delay = Protocol.of(cfg, 2).delay
    strict = cfg_for(STRIDE)
    sim = sharedmodel.simulate(strict, protocol=replace(Protocol.of(strict, 2), delay=delay))
    assert sim.hash == r.hashes[0] and sim.records == [(s, list(m)) for s, m in r.records]


def test_the_mean_is_over_the_clients_that_originate_at_the_step():
    p = Protocol.of(cfg_for(STRIDE), 2)
    assert [p.weight_at(s) for s in range(3)] == [1 / 4, 1 / 2, 1 / 3]
    m = Message.make(0, 1, p.seed(0, 1), 0.5)
    assert p.coefficient(m) == -1.0 * (1 / 2) * 0.5
    assert Protocol.of(cfg_for(STRIDE, "zo.aggregate=sum"), 2).weight_at(1) == 1.0


def test_a_message_off_its_origins_schedule_is_refused_and_a_step_without_it_is_complete():
    p = Protocol.of(cfg_for(STRIDE), 2)
    off = Message.make(1, 1, p.seed(1, 1), 0.5)
    with pytest.raises(FrameError, match=r"origin 1 does not originate at step 1 \(zo.stride\)"):
        message.decode(message.encode([off]), p.wire_limits(1))
    step1 = [Message.make(o, 1, p.seed(o, 1), 0.5) for o in (0, 3)]
    p.check_step(1, step1)
    with pytest.raises(FrameError, match=r"origin 1 does not originate at step 1"):
        p.check_step(1, [*step1, off])
    with pytest.raises(FrameError, match="step 2 holds 2 messages .2 distinct., a complete step has 3"):
        p.check_step(2, [Message.make(o, 2, p.seed(o, 2), 0.5) for o in (0, 3)])  # node 2 is due
    f = Flood(0, [1], range(4), due=p.due)
    f.originate(step1[:1])
    f.receive(1, step1[1:])
    assert f.is_complete(1) and not f.is_complete(0) and f.missing(0) == [(o, 0, 0) for o in range(4)]


def test_churn_proposes_an_origin_present_on_a_step_it_skips_and_absent_on_its_own_step_without_it():
    p = Protocol.of(cfg_for(STRIDE, "churn.settle=1"), 2)
    ag = Agreement(0, 4, 1, due=p.due)
    none = lambda s, origins: []  # noqa: E731 (the digest's messages do not matter here)
    v0 = ag.propose(0, {0: 1, 1: 1, 2: 1, 3: 1}, none, {})
    assert v0 is not None and v0.members == {0, 1, 2, 3}
    ag.vote(0, 0, v0)  # this client's vote on step 0 is the basis of its proposal for step 1
    v1 = ag.propose(1, {0: 1, 3: 1}, none, {})
    assert v1 is not None and v1.members == {0, 1, 2, 3}  # nodes 1 and 2 skip step 1: no leave
    ag.vote(1, 0, v1)
    v2 = ag.propose(2, {0: 1, 3: 1}, none, {})
    assert v2 is not None and v2.members == {0, 1, 3}  # node 2 is due at step 2 and sent nothing: out


def test_control_churn_ignoring_stride(monkeypatch):
    """The control of the churn run above: with `Agreement.expected` owing K messages of every
    origin at every step (the stride schedule ignored), the same strided clients 1 and 2 are
    committed out at the first step they skip (step 1), and only 0 and 3 train on."""
    monkeypatch.setattr(Agreement, "expected", lambda self, origin, step: self.per_origin)
    r = simulate(cfg_for(STRIDE, "churn.settle=1"))
    assert {o: s for s, c in r.changes.items() for o in c.leave} == {1: 1, 2: 1}, r.changes
    assert sorted(r.hashes) == [0, 3] and sorted(r.exits) == [1, 2], r.exits


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (["zo.stride={7: 2}"], "zo.stride: must name nodes of the topology, 0..3, got [7]"),
        (["zo.stride={1: 0}"], "zo.stride: node 1: m must be >= 1 (it originates on steps s % m == 0), got 0"),
        (["zo.stride={1: 2.5}"], "zo.stride[1]: must be an integer, got 2.5"),
        (["zo.stride={-1: 2}"], "zo.stride: must name node ids >= 0, got -1"),
        (["zo.stride=3"], "zo.stride: must be a mapping, got 3"),
    ],
)
def test_a_bad_stride_is_refused_in_one_line(overrides, error):
    with pytest.raises(ConfigError) as e:
        cfg_for(*overrides)
    assert str(e.value) == error


def test_a_stride_with_audits_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^zo.stride: not supported together with trust.audit yet; set one of them$"):
        Protocol.of(cfg_for(STRIDE, "trust.audit=0.5", "churn.settle=1"), 2)


def test_off_the_trajectory_and_the_bits_are_those_of_a_run_without_the_key():
    def traj(*o: str) -> dict:
        cfg = cfg_for(*o)
        return trajectory(cfg, Protocol.of(cfg, 2), "d")

    base = traj()
    # the fingerprint of this config before the key existed (computed on the commit before it):
    # pinned, so every existing log header still matches
    assert digest([base]) == "ca56a3b0fde56596"
    assert traj("zo.stride={}") == traj("zo.stride={1: 1}") == base  # m = 1 changes no bit
    assert traj(STRIDE) == {**base, "zo.stride": [[1, 3], [2, 2]]}
