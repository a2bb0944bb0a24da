"""The log read as arrays: the same records, the same rejections and the same applied bits as
the per-message path (read + Protocol.check_step + Applier over Message lists)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from seedflood.core.config import runconfig as config
from seedflood.core.config.trainsections import SubspaceConfig
from seedflood.core.flood.columns import StepColumns
from seedflood.core.flood.protocol import Protocol
from seedflood.core.wire.message import Message
from seedflood.core.zo.directions import select_trainable
from seedflood.core.zo.replay import Applier, state_hash
from seedflood.core.zo.subcge import SubCGE
from seedflood.rundir.layout import CheckpointError
from seedflood.rundir.logfile import LogReader, LogWriter

RUN_SEED = 11


def protocol(*overrides: str) -> Protocol:
    cfg = config.load(None, ["topology.nodes=5", "zo.perturbations=2", f"run.seed={RUN_SEED}", *overrides])
    return Protocol.of(cfg, 1)


def scalar(o: int, step: int, k: int) -> float:
    """Varied scalars, one in eleven far out (what zo.clip clamps)."""
    return 9.0 if (o + step) % 11 == 0 and k == 0 else math.sin(1 + o + 7 * step + 3 * k)


def step_msgs(p: Protocol, step: int, scale: float = 1.0) -> list[Message]:
    return [
        Message.make(o, step, p.seed(o, step, k), scale * scalar(o, step, k), k)
        for o in p.origins(step)
        for k in range(p.perturbations)
    ]


def write(path: Path, p: Protocol, steps: int, bad: dict[int, list[Message]] | None = None) -> None:
    w = LogWriter(path, {"trajectory": {"run.seed": RUN_SEED, "topology.nodes": 5}})
    for s in range(steps):
        w.append(s, (bad or {}).get(s) or step_msgs(p, s))
    w.close()


def test_columns_are_the_records_and_every_check_agrees(tmp_path: Path) -> None:
    p = protocol()
    write(tmp_path / "log.bin", p, 30)
    _, listed = LogReader(tmp_path / "log.bin").read(check=p.check_step)
    _, cols = LogReader(tmp_path / "log.bin").read_columns(check=p)
    assert isinstance(cols, StepColumns) and cols == listed and list(cols) == listed
    assert cols[3:9] == listed[3:9] and cols[-1] == listed[-1] and len(cols[28:]) == 2
    assert cols.seeded_by == RUN_SEED


@pytest.mark.parametrize(
    "bad",
    [
        lambda p, s: step_msgs(p, s)[:-1],  # a message missing
        lambda p, s: step_msgs(p, s, scale=1e9),  # scalars beyond flood.max_scalar
        lambda p, s: [*step_msgs(p, s), Message.make(5, s, p.seed(5, s), 0.5)],  # an origin not in the run
        lambda p, s: [*step_msgs(p, s)[:-1], Message.make(4, s, p.seed(4, s, 1), math.inf, 1)],  # not finite
    ],
)
def test_a_rejected_record_gives_the_per_message_error(tmp_path: Path, bad) -> None:
    """The first rejected record raises with the message check_step's path gives, even when a
    later record is rejected too."""
    p = protocol()
    write(tmp_path / "log.bin", p, 20, {7: bad(p, 7), 12: bad(p, 12)})
    errors = []
    for check in (p.check_step, p):
        with pytest.raises(CheckpointError) as e:
            LogReader(tmp_path / "log.bin").read_columns(check=check)
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "(step 7)" in errors[0] and "rejected" in errors[0]
    assert len(LogReader(tmp_path / "log.bin").read_columns()[1]) == 20  # no check: structurally whole


def test_first_bad_finds_what_check_step_rejects_under_a_stride(tmp_path: Path) -> None:
    p = protocol("zo.stride={1: 2, 3: 3}")
    steps = [step_msgs(p, s) for s in range(12)]
    steps[5] = steps[5] + [Message.make(3, 5, p.seed(3, 5, 0), 0.1, 0)]  # node 3 is not due at step 5
    path = tmp_path / "log.bin"
    w = LogWriter(path, {"trajectory": {"run.seed": RUN_SEED, "topology.nodes": 5}})
    for s, ms in enumerate(steps):
        w.append(s, ms)
    w.close()
    cols = LogReader(path).read_columns()[1]
    assert p.first_bad(cols, [None] * len(cols)) == 5
    assert p.first_bad(cols[:5], [None] * 5) is None
    with pytest.raises(CheckpointError, match=r"\(step 5\)"):
        LogReader(path).read_columns(check=p)


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.a, self.b = nn.Linear(9, 8, bias=False), nn.Linear(8, 6, bias=False)
        for lin in (self.a, self.b):
            lin.weight.data = torch.randn(lin.weight.shape, generator=g)


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["zo.clip=2", "zo.warmup_steps=4", "zo.schedule=cosine", "run.steps=40"],
        ["zo.stride={2: 2}", "zo.aggregate=mean"],
    ],
)
@pytest.mark.parametrize("batch", [1 << 15, 7])
def test_applying_columns_gives_the_bits_of_applying_messages(tmp_path: Path, overrides, batch, monkeypatch) -> None:
    p = protocol(*overrides)
    write(tmp_path / "log.bin", p, 30)
    listed = LogReader(tmp_path / "log.bin").read()[1]
    cols = LogReader(tmp_path / "log.bin").read_columns(check=p)[1]
    monkeypatch.setattr(Applier, "BATCH_MESSAGES", batch)
    hashes, lasts = [], []
    for records in (listed, cols):
        model = TwoLayers()
        d = SubCGE(model, select_trainable(model, ["*"]), RUN_SEED, SubspaceConfig(rank=4, refresh=8, merge_every=2))
        app = Applier(d, p)
        app.apply_all(records[:11])
        app.apply_all(records[11:])
        hashes.append(state_hash(model, d))
        lasts.append((app.last_step, list(app.last_messages)))
    assert hashes[0] == hashes[1] and lasts[0] == lasts[1]
    coefs = np.concatenate([p.coefficients(m) for _, m in listed])
    from seedflood.core.flood import columnrules

    assert (columnrules.coefficients(p, cols) == coefs).all()
