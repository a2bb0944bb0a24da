"""How the two ends of an edge meet through the store, and process incarnations.

Owns the store keys, `register` / `incarnation_of` (process incarnations in the store),
`await_start` (start-up: wait for every client to be up), a brand-new id's `knock` and the
readers' cursor over the knocks (`Knocks`), the greetings, and `link` /
`build_edge`: meeting a peer and building the edge's 2-rank group (the evaluator's side is
attach.py). The store is used only to (re)connect, never on the hop path.

Store keys (under the store the caller passes):
  seedflood/inc/{node}                  latest incarnation of node (an add counter; 0 = none yet)
  seedflood/up/{node}                   node's first incarnation is up (start-up, `await_start`)
  seedflood/started                     some client started training (a later start is a rejoin)
  seedflood/hello/{src}/{dst}/{dst_inc}  "src_inc:try": src is waiting to connect to dst_inc
  seedflood/edge/{a}-{b}/{inc_a}-{inc_b}/{try_a}-{try_b}/...   gloo's rendezvous, a < b
  seedflood/evaluator/{inc}/next        the next step evaluator incarnation inc needs
  seedflood/sponsor/{node}/{inc}        the neighbour that catches incarnation inc of node up
  seedflood/knocks                      how many knocks of brand-new ids (an add counter: a knock
                                        takes the next number, then writes its slot)
  seedflood/knock/{seq}                 "node:inc": knock number seq, brand-new id node's
                                        incarnation inc waiting for a sponsor (`knock`, `Knocks`)
  seedflood/heal/{a}-{b}/...            a down edge's heal (healing.py: the negotiation; its group
                                        under seedflood/edge/{a}-{b}/{inc_a}-{inc_b}/heal-{round})
Meeting (`link`): each side reads the other's incarnation, greets it, and waits (re-reading the
incarnation every POLL_S, so it follows a peer that restarts meanwhile) until the other greets
its own incarnation; both then build the group under the prefix named by the two greetings and
withdraw their greeting. `try` numbers this process's attempts, so two live incarnations can
connect again after a failed attempt or a dropped edge without reusing a rendezvous prefix.
Whoever comes first waits; a running client answers greetings only in `poll()` between steps,
so a side that connects to running clients must wait at least one of their steps.

Assumes: every process of a run shares one store; `link` runs on a store clone of its own (a
Store is used by one thread at a time) and never raises.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from seedflood.comm.bounded import BoundedStore
from seedflood.comm.edge import Edge, who
from seedflood.comm.framing import device, reason

log = logging.getLogger(__name__)

POLL_S = 0.02  # how often a side waiting to meet re-reads the store (s)
MIN_BUILD_S = 0.5  # the least a group build is given once both sides greeted (s)
STARTUP_POLL_S = 0.25  # how often a process waiting for the others to start looks (s)
STARTUP_REPORT_S = 10.0  # how often it says on screen whom it waits for (s)
_ABSENT = "\x00absent"  # compare_set's answer for a missing key (never a real value)
_TRIES = itertools.count(1)  # this process's connection attempts (unique per incarnation)


def inc_key(node: int) -> str:
    """Where `node`'s latest incarnation is counted (`register`, `incarnation_of`)."""
    return f"seedflood/inc/{node}"


def greeting(inc: int) -> str:
    """A new greeting 'inc:try' of this process's incarnation `inc` (tries never repeat)."""
    return f"{inc}:{next(_TRIES)}"


def hello_key(src: int, dst: int, dst_inc: int) -> str:
    return f"seedflood/hello/{src}/{dst}/{dst_inc}"


def edge_prefix(node: int, inc: int, tries: int, peer: int, peer_inc: int, peer_tries: int) -> str:
    """Store prefix of one connection attempt of edge {node, peer}, smaller node first."""
    (a, ia, ta), (b, ib, tb) = sorted([(node, inc, tries), (peer, peer_inc, peer_tries)])
    return f"seedflood/edge/{a}-{b}/{ia}-{ib}/{ta}-{tb}"


def evaluator_next_key(inc: int) -> str:
    """Where incarnation `inc` of the evaluator keeps the next step it needs (`attach.py`), so a
    catch-up blob to it can leave out what it holds."""
    return f"seedflood/evaluator/{inc}/next"


def sponsor_key(node: int, inc: int) -> str:
    """Where the neighbour that catches incarnation `inc` of `node` up writes its id."""
    return f"seedflood/sponsor/{node}/{inc}"


KNOCKS_KEY = "seedflood/knocks"


def knock_key(seq: int) -> str:
    """Knock number `seq` (1, 2, ...): "node:inc" (`knock`)."""
    return f"seedflood/knock/{seq}"


def knock(store: dist.Store | BoundedStore, node: int, inc: int) -> None:
    """Brand-new id `node`, as incarnation `inc`, asks the members to sponsor its join
    (docs/churn-design.md, A new id joins): it takes the next knock number, then writes it."""
    seq = int(store.add(KNOCKS_KEY, 1))
    store.set(knock_key(seq), f"{node}:{inc}")


class Knocks:
    """One reader's cursor over the run's knocks (a member's `EdgeSet.newcomers`, the evaluator's
    offers): `read` returns (node, incarnation) of every knock numbered since its last call, in
    order; one store read when nothing is new, one more per new knock, whatever churn.max_nodes.
    A number whose slot is not written yet (its writer between its two calls, or dead there) is
    read again at later calls for at most `give_up_s`."""

    def __init__(self, give_up_s: float) -> None:
        self.give_up_s = give_up_s
        self.seen = 0  # the highest knock number taken into `_unread`
        self._unread: dict[int, float] = {}  # knock number -> when it was first counted (monotonic)

    def read(self, store: dist.Store | BoundedStore) -> list[tuple[int, int]]:
        now = time.monotonic()
        last = int(store.add(KNOCKS_KEY, 0))
        for seq in range(self.seen + 1, last + 1):
            self._unread[seq] = now
        self.seen = max(self.seen, last)
        out = []
        for seq, since in sorted(self._unread.items()):
            text = peek(store, knock_key(seq))
            if text is None:
                if now - since > self.give_up_s:
                    del self._unread[seq]
                continue
            del self._unread[seq]
            out.append(parse_greeting(text))  # the same "a:b" form as a greeting
        return out


def register(store: dist.Store | BoundedStore, node: int) -> int:
    """Take the next incarnation of `node` (1, 2, ...) and publish it: one atomic store.add, so
    a restarted process gets a new one without asking anybody."""
    return int(store.add(inc_key(node), 1))


def incarnation_of(store: dist.Store | BoundedStore, node: int) -> int:
    """The latest incarnation `node` registered (0 = none yet); one store read."""
    return int(store.add(inc_key(node), 0))


def peek(store: dist.Store | BoundedStore, key: str) -> str | None:
    """The value at `key`, or None when absent, in one round trip without blocking (get waits)."""
    value = store.compare_set(key, _ABSENT, _ABSENT).decode()
    return None if value == _ABSENT else value


def names(nodes: Sequence[int], shown: int = 16) -> str:
    """'[1, 2, 3]', or the first `shown` and how many more (a screen line stays one line)."""
    nodes = list(nodes)
    head = ", ".join(map(str, nodes[:shown]))
    return f"[{head}{f', ... (+{len(nodes) - shown} more)' if len(nodes) > shown else ''}]"


def up_key(node: int) -> str:
    """Set by a client once it is up at start-up (`await_start`); nobody else writes it (an
    incarnation key may be created at 0 by any reader, so its existence says nothing)."""
    return f"seedflood/up/{node}"


STARTED_KEY = "seedflood/started"
"""Set by the first client that starts training: a client that finds it at its own start came
later than the others' start-up bound and joins as a restarted one would (by a sponsor)."""


def await_start(
    store: dist.Store | BoundedStore,
    node: int,
    nodes: Sequence[int],
    timeout_s: float,
    report_s: float = STARTUP_REPORT_S,
) -> list[int]:
    """Say that `node` is up (model loaded, store reached), then wait until every one of `nodes`
    is, at most timeout_s (transport.startup_timeout_s), saying on screen every report_s which
    ones it waits for; returns those that did not come. One store check per STARTUP_POLL_S (a
    per-node check only when it reports)."""
    store.set(up_key(node), "1")
    keys = {n: up_key(n) for n in nodes if n != node}
    start = time.monotonic()
    report = start + report_s
    while not store.check(list(keys.values())):
        now = time.monotonic()
        if now - start >= timeout_s or now >= report:
            missing = [n for n, k in keys.items() if not store.check([k])]
            if not missing:
                break
            if now - start >= timeout_s:
                return missing
            log.warning(
                "node %d: waiting for nodes %s to start (%.0f s of %g)", node, names(missing), now - start, timeout_s
            )
            report = now + report_s
        time.sleep(STARTUP_POLL_S)
    return []


def parse_greeting(greeting: str) -> tuple[int, int]:
    """'inc:try' -> (inc, try)."""
    inc, _, tries = greeting.partition(":")
    return int(inc), int(tries)


@dataclass
class Attempt:
    """What one `link` call came to: an edge, or an error; `greeting` = the peer's greeting it
    acted on (remembered so a stale greeting is answered only once)."""

    peer: int
    edge: Edge | None = None
    greeting: str | None = None
    error: str | None = None


def link(
    store: dist.Store,
    node: int,
    inc: int,
    peer: int,
    deadline: float,
    answered: str | None,
    inline: int,
    heartbeat_s: float | None,
) -> Attempt:
    """Meet `peer` through the store (module docstring) and build the edge's group; never raises.
    `answered`: a greeting of this peer already acted on, ignored here. `heartbeat_s`: start the
    edge's heartbeat with this timeout as soon as it is built (None: none)."""
    mine = greeting(inc)
    addressed = 0  # the peer incarnation our greeting is addressed to (0 = none yet)
    attempt = Attempt(peer)
    try:
        while True:
            peer_inc = incarnation_of(store, peer)
            if peer_inc and peer_inc != addressed:  # greet (again, if the peer restarted)
                if addressed:
                    store.delete_key(hello_key(node, peer, addressed))
                store.set(hello_key(node, peer, peer_inc), mine)
                addressed = peer_inc
            theirs = peek(store, hello_key(peer, node, inc))
            if theirs is not None and theirs != answered and parse_greeting(theirs)[0] == peer_inc:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                attempt.error = f"{who(peer)} did not answer within the connect timeout"
                return attempt
            time.sleep(min(POLL_S, left))
        attempt.greeting = theirs
        attempt.edge = build_edge(store, node, mine, peer, peer_inc, theirs, deadline, inline, heartbeat_s)
        return attempt
    except Exception as e:  # a store error or a failed build
        attempt.error = reason(e)
        return attempt
    finally:
        if addressed:
            try:
                store.delete_key(hello_key(node, peer, addressed))  # the peer has read it, or gave up
            except Exception:
                pass


def build_edge(
    store: dist.Store,
    node: int,
    mine: str,
    peer: int,
    peer_inc: int,
    theirs: str,
    deadline: float,
    inline: int,
    heartbeat_s: float | None,
) -> Edge:
    """Build the edge both sides greeted for (`mine` / `theirs`: the greetings 'inc:try' each
    acted on), under the prefix they name; raises if the build fails by the deadline."""
    prefix = edge_prefix(
        node, parse_greeting(mine)[0], parse_greeting(mine)[1], peer, peer_inc, parse_greeting(theirs)[1]
    )
    rank = 0 if node < peer else 1
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [device()]
    opts._threads = 1  # worker threads serve collectives only; an edge runs none
    opts._timeout = timedelta(seconds=max(deadline - time.monotonic(), MIN_BUILD_S))
    group = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, 2, opts)
    edge = Edge(peer, peer_inc, group, 1 - rank, inline)
    if heartbeat_s is not None:  # at once: the peer's watcher is already counting
        edge.heartbeat(heartbeat_s)
    return edge
