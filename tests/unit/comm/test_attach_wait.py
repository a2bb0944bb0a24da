"""The evaluator's wait for an attach node (comm.attach.AttachInbox, docs/churn.md: "every client
goes silent at once"): with no client offering it an edge, its inbox gives up after `wait_s`
(max(transport.startup_timeout_s, 10 × transport.timeout_s) in a run) with the one line the
evaluator exits 1 on; the control, without the bound, still waits. An in-process store, no
client: a few seconds. The launched test (tests/dist/test_churn_gloo.py) also stops the clients
of a live stream, so the evaluator edge's heartbeat finds the silence first."""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from seedflood.comm.attach import AttachInbox
from seedflood.core.flood.transport import TransportError


def waiting(wait_s: float) -> AttachInbox:
    return AttachInbox(dist.HashStore(), 4, 10, incarnation=1, wait_s=wait_s, timeout_s=1.0)


def test_an_evaluator_no_client_streams_to_gives_up_within_its_wait():
    inbox = waiting(1.0)
    began = time.monotonic()
    try:
        with pytest.raises(TransportError, match=r"no client has streamed to it for 1 s \(after step -1 of 10\)"):
            inbox.get(timeout=30)
        assert time.monotonic() - began < 10
    finally:
        inbox.close()


def test_control_without_its_wait_bound_the_evaluator_waits_on():
    """The control: the same inbox with no bound (`wait_s` infinite) has given up nothing after
    three times the bound above."""
    inbox = waiting(float("inf"))
    try:
        with pytest.raises(TimeoutError):
            inbox.get(timeout=3)
    finally:
        inbox.close()
