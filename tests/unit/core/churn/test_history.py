"""A member's packed history (core/churn/history.py): it reads back exactly what was appended,
signatures included, past its decoded window, and holds a few bytes a message."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from seedflood.core.churn.history import RECENT, History
from seedflood.core.config import runconfig as config
from seedflood.core.flood.protocol import Protocol
from seedflood.core.wire.message import Message


def protocol() -> Protocol:
    return Protocol.of(config.load(None, ["topology.nodes=16", "churn.settle=1", "run.steps=10"]), 1)


def step(p: Protocol, s: int, origins: int = 16, signed: bool = False) -> tuple[int, list[Message]]:
    """Step s: one message per origin in canonical order (a step with s % 7 == 3 is empty)."""
    msgs = [Message.make(o, s, p.seed(o, s), (-1) ** o * 0.001 * (s + 1) * (o + 1)) for o in range(origins)]
    if signed:  # some with a signature, some without (a dropped origin's evidence)
        msgs = [dataclasses.replace(m, sig=bytes([o + 1]) * 64) if o % 3 else m for o, m in enumerate(msgs)]
    return s, ([] if s % 7 == 3 else msgs)


@pytest.mark.parametrize("signed", [False, True], ids=["plain", "signed"])
def test_every_step_reads_back_as_appended_past_the_decoded_window(signed):
    p = protocol()
    steps = [step(p, s, signed=signed) for s in range(3 * RECENT)]
    h = History(p.seed, steps[:10])
    for s, msgs in steps[10:]:
        h.append(s, msgs)
    assert len(h) == len(steps) and h == steps and list(h) == steps
    assert h[0] == steps[0] and h[-1] == steps[-1] and h[5:9] == steps[5:9] and h[len(h) :] == []
    sigs = [[m.sig for m in msgs] for _, msgs in h]  # Message equality leaves signatures out
    assert sigs == [[m.sig for m in msgs] for _, msgs in steps]
    assert list(reversed(h))[: RECENT + 5] == steps[::-1][: RECENT + 5]


def test_a_step_out_of_order_or_past_the_end_is_refused():
    p = protocol()
    h = History(p.seed, [step(p, 0)])
    with pytest.raises(ValueError, match="step 2 appended after step 0"):
        h.append(*step(p, 2))
    with pytest.raises(IndexError):
        h[1]


def test_packed_steps_take_a_few_bytes_a_message_against_a_list_of_messages():
    """The point of packing: 16 origins a step hold ~6 B a message here, the objects ~40× more."""
    p = protocol()
    steps = [step(p, s) for s in range(1000)]
    h = History(p.seed, steps)
    messages = sum(len(msgs) for _, msgs in steps)
    objects = sum(
        sys.getsizeof(msgs) + sum(sys.getsizeof(m) + sys.getsizeof(m.scalar) for m in msgs) for _, msgs in steps
    )
    assert h.packed_bytes() / messages < 8
    assert objects / h.packed_bytes() > 10
