"""What a restarted run says about where it resumed from: summary.json's
`resumed_from_step` is the step of the checkpoint actually restored (the logged steps after it
are replayed; `resumed_log_steps` says how many the log held), and the attach node's line about
the catch-up it sent a (re)connected evaluator names an ascending range of steps it really sent,
or says it sent none and why."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from seedflood.core.config import rng
from seedflood.core.config import runconfig as config
from seedflood.core.flood import stepstream
from seedflood.core.flood.protocol import Protocol
from seedflood.core.topology.resolve import build
from seedflood.core.wire.message import Message
from seedflood.ml.workload import Workload
from seedflood.roles import sharedmodel
from seedflood.roles.churn import Churn
from seedflood.roles.evaluator import Restored, restore_run
from seedflood.rundir.logfile import LogReader

ROOT = Path(__file__).resolve().parents[3]
DEBUG = ROOT / "launch" / "configs" / "debug.yaml"  # 6 steps, 4 clients on a ring (delay 0)
torch.set_num_threads(1)


def debug_cfg(out: Path, *extra: str) -> config.Config:
    return config.load(DEBUG, [f"run.out_dir={out}", "checkpoint.every=2", "checkpoint.hf_model=false", *extra])


@pytest.fixture
def crashed(tmp_path) -> Path:
    """A run directory whose log holds 5 steps and whose newest intact checkpoint is step 4: a
    5-step run (checkpoints after steps 4 and 5 kept) whose step_000005 state is then damaged."""
    out = tmp_path / "run"
    sharedmodel.run(debug_cfg(out, "run.steps=5"), progress=False)
    state = out / "checkpoints" / "step_000005" / "state.pt"
    state.write_bytes(state.read_bytes() + b"\0")  # its sha256 no longer matches meta.json
    return out


def test_restore_run_names_the_checkpoint_it_restored_not_the_logs_length(crashed, caplog):
    cfg = debug_cfg(crashed)
    w = Workload.build(cfg)
    p = Protocol.of(cfg, build(cfg.topology).diameter)
    _, records = LogReader(crashed / "log.bin").read()
    with caplog.at_level(logging.INFO, logger="seedflood"):
        assert restore_run(w, p, crashed, records) == Restored(steps=5, checkpoint=4)
    assert any("restored checkpoint step_000004" in r.getMessage() for r in caplog.records)


def test_summary_says_the_checkpoint_a_resume_restored_and_the_steps_its_log_held(crashed):
    """The resumed run (to 6 steps) restored step_000004 and replayed step 4 from the log: its
    summary says so, not resumed_from_step 5 (the log's length, what it used to say)."""
    assert Protocol.of(debug_cfg(crashed), build(debug_cfg(crashed).topology).diameter).delay == 0
    summary = sharedmodel.run(debug_cfg(crashed), progress=False).to_dict()
    assert summary["resumed_from_step"] == 4 and summary["resumed_log_steps"] == 5


def test_a_new_run_resumed_from_nothing(tmp_path):
    summary = sharedmodel.run(debug_cfg(tmp_path / "run", "run.steps=2"), progress=False).to_dict()
    assert summary["resumed_from_step"] == 0 and summary["resumed_log_steps"] == 0


# -- the attach node's catch-up line ----------------------------------------------------------------
class Transport:
    """The attach node's evaluator feed as `Churn.follow` uses it: one new edge whose evaluator
    published that it needs the steps from `needs` on; the blob sent is kept."""

    def __init__(self, needs: int) -> None:
        self.needs = needs
        self.evaluator_connected = True
        self.evaluator_links = 1
        self.blobs: list[bytes] = []

    def evaluator_needs(self) -> int:
        return self.needs

    def send_blob(self, peer: int, data: bytes) -> None:
        self.blobs.append(data)


def steps(n: int) -> list[tuple[int, list[Message]]]:
    r = random.Random(n)
    return [(s, [Message.make(o, s, rng.derive(9, o, s), r.uniform(-1, 1)) for o in range(4)]) for s in range(n)]


@pytest.mark.parametrize(
    "needs, decided, said, sent",
    [
        (3, 6, "sent it steps 3..5", [3, 4, 5]),
        (0, 2, "sent it steps 0..1", [0, 1]),
        # a restarted evaluator ahead of this node's decided steps: nothing to send (was "293..50")
        (293, 51, "sent it no steps: it needs steps from 293 on, this node has decided steps 0..50", []),
        # the run's start: nothing decided yet (was "0..-1")
        (0, 0, "sent it no steps: it needs steps from 0 on, this node has decided no step yet", []),
    ],
)
def test_the_attach_node_names_the_steps_its_catch_up_held(needs, decided, said, sent, caplog):
    transport = Transport(needs)
    flood = SimpleNamespace(signing=None)  # unsigned: no seals
    node = SimpleNamespace(
        host=SimpleNamespace(node=2, flood=flood),
        _fed=0,
        history=steps(decided),
        # the member a step's payload reads (`joining.step_payload`)
        member=SimpleNamespace(flood=flood, roster=SimpleNamespace(changes={}), certificates={}),
    )
    with caplog.at_level(logging.WARNING, logger="seedflood"):
        Churn.follow(node, transport)  # type: ignore[arg-type]
    (blob,) = transport.blobs
    assert [s for s, _ in stepstream.decode_pushes(blob)] == sent
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"node 2: the evaluator follows this node; {said}"]
