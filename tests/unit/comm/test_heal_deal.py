"""The gloo heal negotiation's store deal (comm/healing.py `Heals`) with one proposer that stops
wanting the edge: it withdraws its open proposal, so the other end can no longer take it, or,
where the other end took it first, learns the index all the same (it then connects and closes
the edge, so the taker is not left waiting on an end that never comes: CI's chaos seed 1)."""

from __future__ import annotations

import torch.distributed as dist

from seedflood.comm.bounded import BoundedStore
from seedflood.comm.healing import Deal, Heals, heal_key
from seedflood.comm.rendezvous import inc_key, peek


def two_ends() -> tuple[dist.Store, Heals, Heals]:
    raw = dist.HashStore()
    for node in (0, 1):
        raw.add(inc_key(node), 1)  # both in their first life
    store = BoundedStore(raw, 5.0)
    return raw, Heals(0, 1, store, 1.0, 0), Heals(1, 1, store, 1.0, 0)


def deal(raw: dist.Store) -> Deal | None:
    return Deal.parse(peek(raw, f"{heal_key(0, 1, 1, 1)}/deal"))


def test_an_open_proposal_nobody_took_is_withdrawn_and_cannot_be_taken():
    raw, a, b = two_ends()
    assert a.ask(1, None, 10) is None  # a asks; b not yet
    assert b.ask(0, None, 12) is None  # both ask: b proposes 14
    assert deal(raw) == Deal(1, "p", 14, 1)
    assert b.forgo({}) == {}  # b commits 0 out: withdrawn
    assert deal(raw) == Deal(1, "w", 14, 1)
    assert a.ask(1, None, 11) is None  # nothing left to take
    a.close()
    b.close()


def test_a_proposal_taken_first_is_handed_back_to_the_proposer_that_forgoes_it():
    raw, a, b = two_ends()
    a.ask(1, None, 10)
    b.ask(0, None, 12)  # b proposes 14
    assert a.ask(1, None, 11) == 14  # a takes it (and starts building its end)
    assert b.forgo({0: None}) == {}  # still wanted: left alone
    assert b.forgo({}) == {0: 14}  # forgone after a took it: agreed after all
    assert deal(raw) == Deal(1, "a", 14, 1)
    a.close()
    b.close()
