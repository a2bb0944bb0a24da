"""A brand-new node id knocking at a launched run's store (docs/churn-design.md, A new id joins),
over a real TCPStore and no gloo group: `EdgeSet.knock` publishes the newcomer's incarnation,
a member's `newcomers` sees it once the knock counter moved, stops listing it once it is a
neighbour, once someone claimed it, or once the newcomer has waited its sponsor bound out; a
restarted newcomer knocks again. And the launch side: SEEDFLOOD_NODE makes a process a client
outside the launch's ranks, which `check_world` admits only as an id the run is open to."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from seedflood.comm.edgeset import EdgeSet
from seedflood.comm.rendezvous import KNOCKS_KEY, Knocks, knock, knock_key, peek, sponsor_key
from seedflood.comm.runtime import World, WorldError, check_world, free_port
from seedflood.core.flood.protocol import Protocol

RING = {0: (1, 3), 1: (0, 2), 2: (1, 3), 3: (0, 2)}
NEW = range(4, 6)  # churn.max_nodes = 6 over a ring of 4


@pytest.fixture
def store() -> dist.Store:
    return dist.TCPStore(
        "127.0.0.1", free_port(), is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )


def member(store: dist.Store, node: int, timeout_s: float = 5.0) -> EdgeSet:
    return EdgeSet(node, RING[node], store, timeout_s=timeout_s, joinable=NEW)


def test_a_knock_is_seen_by_the_members_until_its_sponsor_claims_it(store):
    m0, m2 = member(store, 0), member(store, 2)
    assert m0.newcomers() == [] and m2.newcomers() == []
    new = EdgeSet(4, (), store, timeout_s=5.0, joinable=NEW)
    assert not new.rejoining and new.incarnation == 1
    new.knock()
    assert new.rejoining  # a sponsor connects it, as a restart's
    assert m0.newcomers() == [4] and m0.newcomers() == [4]  # listed until claimed
    m0.grow([4])  # the join rule links 0 to it: it grows the edge, then claims
    assert m0.claim(4) == 1
    assert m0.newcomers() == []  # a neighbour now (its restarts are `revived`'s)
    assert m2.newcomers() == []  # claimed by another member
    assert new.sponsor(1.0) == 0 and 0 in new.neighbours  # its first neighbour: the sponsor
    # it restarts (a new incarnation) and knocks again: a member that is no neighbour sees it
    again = EdgeSet(4, (), store, timeout_s=5.0, joinable=NEW)
    again.knock()
    assert again.incarnation == 2 and m2.newcomers() == [4] and m0.newcomers() == []
    assert member(store, 1).newcomers() == [4]  # a member started later reads the knocks too


def test_a_knock_nobody_claims_is_forgotten_after_the_newcomers_own_bound(store):
    m = member(store, 1, timeout_s=0.02)
    EdgeSet(5, (), store, timeout_s=0.02, joinable=NEW).knock()
    assert m.newcomers() == [5]
    time.sleep(Protocol.LATE_FACTOR * 0.02 + 0.1)  # the newcomer has given up waiting for a sponsor
    assert m.newcomers() == []
    assert EdgeSet(1, RING[1], store, timeout_s=0.02).newcomers() == []  # a run without max_nodes reads nothing


def test_a_newcomer_waiting_for_its_sponsor_is_not_fooled_by_a_wake_before_the_claim(store):
    """torch's store wakes the waiters of a key that a compare_set found missing (a `peek`): the
    newcomer's wait must wake, find no sponsor yet, and wait on for the real claim."""
    own = store.clone()  # a process of its own: its own connection, whose calls time out fast
    own.set_timeout(timedelta(seconds=0.1))  # (a launched client's are bounded by the hop timeout)
    new = EdgeSet(4, (), own, timeout_s=5.0, joinable=NEW)
    new.knock()
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(new.sponsor(5.0)))
    waiter.start()
    time.sleep(0.2)
    assert peek(store, sponsor_key(4, 1)) is None  # wakes the waiter: nothing there yet
    time.sleep(0.2)
    m = member(store, 1)
    m.grow([4])
    assert m.claim(4) == 1
    waiter.join(10)
    assert got == [1]


def test_a_knock_slot_not_written_yet_is_read_later_and_one_never_written_is_given_up(store):
    early, late = Knocks(give_up_s=30.0), Knocks(give_up_s=0.05)
    store.add(KNOCKS_KEY, 1)  # number 1 taken, its slot not written yet (or its writer died there)
    knock(store, 5, 1)  # number 2
    assert early.read(store) == [(5, 1)] and late.read(store) == [(5, 1)]
    assert early.read(store) == [] and late.read(store) == []  # one store read: nothing new
    time.sleep(0.1)
    assert late.read(store) == []  # still not written past its bound: given up
    store.set(knock_key(1), "4:1")  # written at last: the patient reader takes it, the other gave up
    assert early.read(store) == [(4, 1)] and late.read(store) == []


def test_seedflood_node_is_a_client_outside_the_launchs_ranks():
    # a torchrun agent of its own sets RANK=0, WORLD_SIZE=1 and its own MASTER_*: SEEDFLOOD_NODE wins
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "7", "TORCHELASTIC_RUN_ID": "x"}
    w = World.from_env({**env, "SEEDFLOOD_NODE": "4"})
    assert (w.is_evaluator, w.client_node, w.rank, w.world_size, w.launcher) == (False, 4, 5, 0, "torchrun")
    check_world(w, 4, ids=6)
    for n, ids, message in [
        (4, None, "this run takes no new node ids"),
        (4, 4, "this run takes no new node ids"),
        (6, 6, r"the run's new node ids are 4\.\.5 \(churn.max_nodes=6"),
        (2, 6, r"the run's new node ids are 4\.\.5"),
    ]:
        with pytest.raises(WorldError, match=message) as info:
            check_world(World.from_env({"SEEDFLOOD_NODE": str(n)}), 4, ids=ids)
        assert "\n" not in str(info.value)
    with pytest.raises(WorldError, match="SEEDFLOOD_NODE=-1 is not a node id"):
        World.from_env({"SEEDFLOOD_NODE": "-1"})
