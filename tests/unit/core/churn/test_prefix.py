"""A log server's prefix (core/churn/prefix.py): its bytes, the newcomer's check of it, and
the `Have` a newcomer tells its sponsor."""

from __future__ import annotations

import dataclasses

import pytest

from seedflood.core.churn import prefix
from seedflood.core.churn.agreement import Agreement
from seedflood.core.config import runconfig as config
from seedflood.core.flood import stepstream
from seedflood.core.flood.protocol import Protocol
from seedflood.core.membership.roster import Change
from seedflood.core.wire.message import FrameError, Message

HEADER = {"trajectory": {"run.seed": 7}, "base_hash": "abc", "config": {"ignored": True}}


def protocol() -> Protocol:
    return Protocol.of(config.load(None, ["topology.nodes=4", "churn.settle=1", "run.steps=10"]), 1)


def steps_of(p: Protocol, n: int, leave_at: int | None = None) -> list[tuple[int, bytes]]:
    """n decided steps of 4 origins; origin 3 leaves at `leave_at` (a change with that step)."""
    out = []
    for s in range(n):
        gone = leave_at is not None and s >= leave_at
        msgs = [Message.make(o, s, p.seed(o, s), 0.01 * (o + 1)) for o in range(3 if gone else 4)]
        change = Change(s, leave=(3,)) if s == leave_at else None
        out.append((s, stepstream.encode_step(msgs, change)))
    return out


def test_a_prefix_round_trips_with_the_run_identity_only_and_refuses_a_flipped_bit():
    p = protocol()
    steps = steps_of(p, 3)
    blob = prefix.encode(HEADER, steps)
    assert prefix.decode(blob) == ({"trajectory": {"run.seed": 7}, "base_hash": "abc"}, steps)
    for at in (0, 5, len(blob) // 2, len(blob) - 1):
        bad = bytearray(blob)
        bad[at] ^= 1
        with pytest.raises(FrameError):
            prefix.decode(bytes(bad))
    with pytest.raises(FrameError):
        prefix.decode(blob[:-3])


def test_check_ends_on_the_digest_the_chain_of_those_steps_has():
    p = protocol()
    steps = steps_of(p, 5, leave_at=2)
    have = prefix.check(steps, p)
    chain = Agreement(0, p.ids, p.perturbations, 0, p.roster())
    for s, payload in steps:
        chain.extend(s, *stepstream.decode_step(payload, s, seed_of=p.seed))
    assert have == prefix.Have(4, chain.prev) and have.digest == chain.digests[4]
    assert prefix.check([], p) == prefix.NOTHING
    # another scalar in step 1: still a well-formed prefix, but another chain from step 1 on
    msgs, _ = stepstream.decode_step(steps[1][1], 1, seed_of=p.seed)
    forked = [*steps[:1], (1, stepstream.encode_step([dataclasses.replace(msgs[0], scalar=9.0), *msgs[1:]]))]
    assert prefix.check(forked, p).digest != chain.digests[1]


@pytest.mark.parametrize(
    "defect, why",
    [
        ("gap", "jumps from step 0 to step 2"),
        ("not from 0", "jumps from step -1 to step 1"),
        ("a member's messages missing", "a complete step has"),
        ("a leaver's messages kept", "a complete step has"),
    ],
)
def test_check_refuses_a_prefix_that_is_not_a_run_of_complete_steps_from_0(defect, why):
    p = protocol()
    steps = steps_of(p, 4, leave_at=2)
    if defect == "gap":
        steps = [steps[0], *steps[2:]]
    elif defect == "not from 0":
        steps = steps[1:]
    elif defect == "a member's messages missing":
        msgs, _ = stepstream.decode_step(steps[1][1], 1, seed_of=p.seed)
        steps[1] = (1, stepstream.encode_step(msgs[1:]))
    else:
        msgs = [Message.make(o, 3, p.seed(o, 3), 0.5) for o in range(4)]
        steps[3] = (3, stepstream.encode_step(msgs))
    with pytest.raises(FrameError, match=why):
        prefix.check(steps, p)


def test_have_round_trips_and_refuses_other_bytes():
    have = prefix.Have(41, 2**64 - 1)
    assert prefix.Have.from_bytes(have.to_bytes()) == have
    assert prefix.Have.from_bytes(prefix.NOTHING.to_bytes()) == prefix.NOTHING
    for bad in (b"", have.to_bytes()[:-1], b"XX" + have.to_bytes()[2:], prefix.Have(-2, 0).to_bytes()):
        with pytest.raises(FrameError):
            prefix.Have.from_bytes(bad)
