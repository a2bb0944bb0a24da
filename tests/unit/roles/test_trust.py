"""Signed runs through the real client loop, in process (docs/trust.md, Identities).

- Signing changes no bit of the run: a signed run ends on the hash of the unsigned one, every
  client on it, with nothing counted as forged; its bytes grow by exactly 64 per message and
  68 per note sent plus the signed layout's 13 bytes per non-empty hop payload.
- A peer that forges (its own messages signed without its key, or someone else's changed in
  flight) has what it forged dropped and counted by its neighbours, never applied: under churn
  the forger's messages never count, so it is left out by a committed step and every honest
  client trains on to one history (checked against a replay of the decided steps and the log).
- A process without node i's key cannot start as node i, nor rejoin as node i: the sponsor's
  challenge (roles/rejoinproof.py) refuses its answer, no JOIN is flooded, and the run goes on
  without it; a genuine restart of a signed run passes the challenge and rejoins.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from pathlib import Path

import pytest
import torch
from test_churn import PACED, TORUS, cfg_for, check_survivors, protocol_of  # the churn tests' run helpers

from seedflood.comm import identity
from seedflood.core.churn.member import Member
from seedflood.core.flood.hop import decode_hop, encode_hop
from seedflood.core.flood.signing import Signing
from seedflood.core.wire.message import FrameError, Message
from seedflood.roles.inprocess import Event, SimResult, simulate

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("keys")
    identity.write_keys(out, 8)
    return out


def signed(keys: Path) -> tuple[str, str]:
    return ("trust.sign=true", f"trust.keys={keys}")


@functools.cache
def honest(*overrides: str, steps: int) -> SimResult:
    """The run of cfg_for(*overrides, steps=steps) without a fault, once per process: the tests
    that compare a faulty run with it share it (each asserts on it, none changes it)."""
    return simulate(cfg_for(*overrides, steps=steps))


def test_a_signed_run_has_the_bits_of_an_unsigned_one_and_pays_64_bytes_a_message(keys):
    plain = cfg_for(steps=6)
    r0 = simulate(plain)
    r1 = simulate(cfg_for(*signed(keys), steps=6))
    assert r1.exits == {} and set(r1.hashes.values()) == set(r0.hashes.values()) and len(set(r0.hashes.values())) == 1
    assert r1.records == r0.records
    assert all(s.forged == 0 for s in r1.flood.values()) and all(s.forged == 0 for s in r0.flood.values())
    # the same items travel; each pays its signature (messages 64 B, notes 4 + 64) and every
    # non-empty payload the signed layout's magic, frame length, note count and CRC
    sent = sum(s.forwarded for s in r1.flood.values())
    assert sent == sum(s.forwarded for s in r0.flood.values())
    grew = r1.counter.total() - r0.counter.total()
    assert 64 * sent <= grew <= 68 * sent + 13 * len(r1.counter.rows()), (grew, sent)


def forge(cfg, forger: int, how: str):
    """A frame rewriter: what `forger` sends carries forged signatures. `own`: its own messages
    with its signature replaced by 64 other bytes (signed without its key); `relay`: the
    messages of others it relays with another scalar (changed in flight, signatures kept)."""
    limits = protocol_of(cfg).limits(0, 2**32 - 1)

    def mutate(src: int, dst: int, hop: int, frame: bytes) -> bytes:
        if src != forger or not frame:
            return frame
        msgs, notes = decode_hop(frame, limits)

        def bad(m: Message) -> Message:
            if how == "own" and m.origin == forger:
                return dataclasses.replace(m, sig=os.urandom(64))
            if how == "relay" and m.origin != forger:
                return dataclasses.replace(m, scalar=m.scalar * 10)
            return m

        return encode_hop([bad(m) for m in msgs], notes, signed=True)

    return mutate


def test_a_client_that_forges_its_own_signatures_is_dropped_counted_and_left_out(keys, tmp_path):
    cfg = cfg_for(*signed(keys), steps=12)
    r = simulate(cfg, mutate=forge(cfg, 5, "own"))
    assert list(r.exits) == [5] and "without this client" in r.exits[5], r.exits
    assert sorted(r.hashes) == [0, 1, 2, 3, 4, 6, 7]
    (change,) = r.changes.values()
    assert change.leave == (5,) and change.step == 0  # the bound: the first step it forges (all of them)
    assert all(5 not in {m.origin for m in msgs} for s, msgs in r.records if s >= change.step)
    assert sum(r.flood[n].forged for n in (1, 4, 6)) > 0  # 5's neighbours on the 2×4 torus counted them
    check_survivors(cfg, r, tmp_path)


def test_control_unchecked_signatures_apply_forgeries(keys, monkeypatch):
    """The control: with `Signing.authentic` passing everything, the same forger is neither
    dropped nor left out, and its messages, signed without its key, are in every step applied."""
    monkeypatch.setattr(Signing, "authentic", lambda self, item: True)
    cfg = cfg_for(*signed(keys), steps=12)
    r = simulate(cfg, mutate=forge(cfg, 5, "own"))
    assert r.exits == {} and r.changes == {} and sorted(r.hashes) == list(range(8)), r.exits
    assert all(5 in {m.origin for m in msgs} for _, msgs in r.records) and not any(f.forged for f in r.flood.values())


def test_a_relay_that_changes_what_it_forwards_changes_nothing(keys, tmp_path):
    """The torus has other paths: every altered copy is dropped and counted, the honest ones
    arrive, and nobody leaves — the run has the bits of an honest one."""
    cfg = cfg_for(*signed(keys), steps=8)
    plain = honest(*signed(keys), steps=8)
    r = simulate(cfg, mutate=forge(cfg, 2, "relay"))
    assert r.exits == {} and r.hashes == plain.hashes and r.records == plain.records
    assert sum(s.forged for s in r.flood.values()) > 0
    check_survivors(cfg, r, tmp_path)


def test_a_process_without_the_nodes_key_cannot_start_as_that_node(keys, tmp_path):
    other = tmp_path / "other"
    identity.write_keys(other, 8)
    mixed = tmp_path / "mixed"  # this roster, but node 3's key file from another
    mixed.mkdir()
    (mixed / identity.ROSTER).write_bytes((keys / identity.ROSTER).read_bytes())
    for i in range(8):
        src = (other if i == 3 else keys) / f"node-{i}.key"
        dst = mixed / f"node-{i}.key"
        dst.write_bytes(src.read_bytes())
        dst.chmod(0o600)
    with pytest.raises(identity.IdentityError, match="node-3.key is not the key of node 3"):
        simulate(cfg_for(f"trust.keys={mixed}", "trust.sign=true", *TORUS, steps=2))


def test_in_a_strict_run_a_forgery_is_never_applied_and_a_missing_message_stops_the_run(keys, tmp_path):
    """Strict (churn.settle: 0) survives no missing message. Node 2 forging its own signatures:
    dropped by every neighbour, its step never completes, the run stops with one line naming the
    message. Node 2 altering what it relays: dropped and counted, and on the torus the genuine
    copies arrive by the other shortest paths, so the run ends on the honest bits."""
    from seedflood.core.flood.flooding import FloodError

    cfg = cfg_for(*signed(keys), "churn.settle=0", steps=8)
    # whichever client stops first: origin 2's message of step 0 completed nowhere
    with pytest.raises(FloodError, match=r"step 0 incomplete after its hops \(missing \[\(2, 0, 0\)\]\): .*forge"):
        simulate(cfg, mutate=forge(cfg, 2, "own"))
    # the run that must finish: a hop bound that a loaded CI machine (4 workers on 2 cores) keeps
    plain = honest(*signed(keys), "churn.settle=0", "transport.timeout_s=5", steps=8)
    cfg = cfg_for(*signed(keys), "churn.settle=0", "transport.timeout_s=5", steps=8)
    r = simulate(cfg, mutate=forge(cfg, 2, "relay"))
    assert r.hashes == plain.hashes and len(set(r.hashes.values())) == 1
    assert sum(s.forged for s in r.flood.values()) > 0


def test_a_peer_that_replays_an_old_frame_in_place_of_its_own_changes_nothing(keys, tmp_path):
    """Node 2 sends node 3, at each hop from the fourth on, the frame it sent three hops before:
    its messages are duplicates or old (dropped as seen), what it should have sent comes by the
    torus's other paths, and the run has the honest bits, signed or not."""
    for sets in ((), signed(keys)):
        cfg = cfg_for(*sets, steps=8)
        plain = honest(*sets, steps=8)
        sent: list[bytes] = []

        def replay(src: int, dst: int, hop: int, frame: bytes) -> bytes:
            if (src, dst) != (2, 3):
                return frame
            sent.append(frame)
            return sent[-4] if len(sent) > 3 else frame

        r = simulate(cfg, mutate=replay)
        assert r.exits == {} and r.hashes == plain.hashes and r.records == plain.records, r.exits


@pytest.mark.parametrize("sign", [False, True], ids=["unsigned", "signed"])
def test_a_peer_that_keeps_sending_an_old_frame_is_left_out_from_the_first_step_it_withholds(keys, sign, tmp_path):
    """From step 3 on, node 5 sends each torus neighbour, in place of every frame it owes, the
    last frame it sent it before: everything in it was seen (dropped as such), and node 5's own
    messages and votes from step 3 on never come. It is left out exactly from step 3 (the bound
    in docs/trust.md: the first step it withholds), like a silent client, and the seven others
    finish on one history."""
    cfg = cfg_for(*(signed(keys) if sign else ()), steps=10)
    first = 3 * protocol_of(cfg).hops  # the first hop of step 3
    last: dict[int, bytes] = {}

    def old(src: int, dst: int, hop: int, frame: bytes) -> bytes:
        if src != 5:
            return frame
        if hop < first:
            last[dst] = frame
            return frame
        return last[dst]

    r = simulate(cfg, mutate=old)
    assert list(r.exits) == [5] and "without this client" in r.exits[5], r.exits
    ((step, change),) = r.changes.items()
    assert change.leave == (5,) and step == 3, r.changes
    assert all(s.forged == 0 for s in r.flood.values())  # old, not forged: its signatures are its own
    check_survivors(cfg, r, tmp_path)


def test_in_a_strict_run_a_peer_stuck_on_an_old_frame_stops_the_run_naming_what_it_withholds():
    """Strict: node 5 sends from step 3 on the last frame it sent each neighbour before; what it
    carries was seen, and its own message of step 3 never comes: the run stops naming it."""
    from seedflood.core.flood.flooding import FloodError

    cfg = cfg_for("churn.settle=0", steps=6)
    first, last = 3 * protocol_of(cfg).hops, {}

    def old(src: int, dst: int, hop: int, frame: bytes) -> bytes:
        if src == 5 and hop < first:
            last[dst] = frame
        return last[dst] if src == 5 and hop >= first else frame

    with pytest.raises(FloodError, match=r"step 3 incomplete after its hops \(missing \[\(5, 3, 0\)\]\)"):
        simulate(cfg, mutate=old)


def test_in_a_strict_run_a_client_whose_weights_differ_is_seen_by_its_final_hash():
    """Strict has no audit: node 3's weight is changed before step 2; its messages stay well
    formed (estimated on its own weights), every client applies the same ones, the run ends,
    and only the final hashes tell: node 3's differs from the seven others' (the launched
    evaluator compares every client's hash with its own: summary.json's consensus)."""
    cfg = cfg_for("churn.settle=0", steps=4)
    r = simulate(cfg, events=[Event(2, 3, "corrupt", 1e-3)])
    others = {h for n, h in r.hashes.items() if n != 3}
    assert r.exits == {} and len(r.hashes) == 8 and len(others) == 1 and r.hashes[3] not in others


def times_ten(cfg, relay: int):
    """A frame rewriter: `relay` forwards the others' messages with 10 × their scalar (unsigned)."""
    limits = protocol_of(cfg).limits(0, 2**32 - 1)

    def mutate(src: int, dst: int, hop: int, frame: bytes) -> bytes:
        if src != relay or not frame:
            return frame
        msgs, notes = decode_hop(frame, limits)
        return encode_hop(
            [dataclasses.replace(m, scalar=10 * m.scalar) if m.origin != relay else m for m in msgs], notes
        )

    return mutate


def test_unsigned_a_relay_that_changes_what_it_forwards_makes_honest_origins_look_like_equivocators():
    """What an unsigned run does not cover (docs/trust.md: it assumes honest relays). Node 2 of
    the torus forwards every other origin's message with 10 × its scalar. Strict: a receiver
    that gets both copies stops, naming the conflict. Churn: the two copies are evidence against
    their honest origins, who are excluded; nothing forks (what every client applied is a prefix
    of one history), but the run is lost. Signed, the altered copies are dropped instead
    (test_a_relay_that_changes_what_it_forwards_changes_nothing)."""
    from seedflood.core.flood.flooding import FloodError

    strict = cfg_for("churn.settle=0", steps=4)
    with pytest.raises(FloodError, match="conflicting copies of message"):
        simulate(strict, mutate=times_ten(strict, 2))
    cfg = cfg_for(steps=6)
    r = simulate(cfg, mutate=times_ten(cfg, 2))
    excluded = [n for n, why in r.exits.items() if "without this client" in why]
    assert set(excluded) - {2}, r.exits  # honest origins convicted on the relay's copies
    applied = sorted((r.step_hashes[n] for n in range(8)), key=len)
    assert all(h == applied[-1][: len(h)] for h in applied)  # one history, however short


def test_a_client_that_signs_two_votes_in_one_ballot_is_excluded_and_the_others_keep_one_history(keys, tmp_path):
    """Signed churn on the 2×4 torus: node 5 sends neighbour 1 another vote (a value less one
    origin, signed with its own key) in every ballot, and the others its real one. Both signed
    votes flood as the proof (every client names node 5), the honest leave it out of their
    proposals, a committed step excludes it (as an audit: on evidence), and the seven honest
    clients finish on one history, equal to a replay of the decided steps."""
    from seedflood.core.churn.agreement import Vote
    from seedflood.core.flood import protocol as proto
    from seedflood.core.membership.notes import VOTE
    from seedflood.ml.workload import Workload
    from seedflood.roles.identities import signing_of

    cfg = cfg_for(*signed(keys), steps=10)
    p = protocol_of(cfg)
    liar = signing_of(cfg, proto.trajectory(cfg, p, Workload.build(cfg).train_digest()), 5)
    assert liar is not None
    limits = p.limits(0, 2**32 - 1)
    lies = []

    def double(src: int, dst: int, hop: int, frame: bytes) -> bytes:
        if src != 5 or dst != 1 or not frame:
            return frame
        msgs, notes = decode_hop(frame, limits)

        def other(n):
            if n.kind != VOTE or n.origin != 5:
                return n
            v = Vote.of(n, p.n_origins)
            drop = min(v.value.members - {5})
            lie = dataclasses.replace(v.value, members=v.value.members - {drop}, digest=v.value.digest ^ 1)
            lies.append(v.step)
            return liar.seal(dataclasses.replace(v, value=lie).note(p.n_origins))

        return encode_hop(msgs, [other(n) for n in notes], signed=True)

    r = simulate(cfg, mutate=double)
    assert lies and list(r.exits) == [5] and "without this client" in r.exits[5], r.exits
    assert sorted(r.hashes) == [0, 1, 2, 3, 4, 6, 7] and len(set(r.hashes.values())) == 1
    (change,) = r.changes.values()
    assert change.leave == (5,) and change.audit == (5,)  # left out on evidence, not silence
    assert change.step <= min(lies) + 1, (change.step, min(lies))  # the bound docs/trust.md states
    assert all(5 not in {m.origin for m in msgs} for s, msgs in r.records if s >= change.step)
    assert all(s.forged == 0 for s in r.flood.values())  # every lie was a valid signature
    check_survivors(cfg, r, tmp_path)


@pytest.mark.parametrize("what", ["garbage", "bogus-ids", "oversize"])
def test_a_peer_that_sends_frames_no_correct_peer_sends_is_cut_off_and_left_out(what, tmp_path):
    """From its tenth hop on, node 5 sends its torus neighbours frames that do not decode:
    random bytes, well-formed messages under ids no run holds (a step a million ahead, outside
    every receiver's window), or a 1 MiB frame. Each neighbour takes nothing of such a frame and
    closes the edge as if 5 had failed (strict would stop with the line naming 5); cut off, 5 is
    left out by a committed step like a silent client and the seven others finish on one history."""
    cfg = cfg_for(steps=12)
    p = protocol_of(cfg)
    bogus = encode_hop([Message.make(5, 10**6 + k, p.seed(5, 10**6 + k), 0.5) for k in range(64)], [])

    def bad(src: int, dst: int, hop: int, frame: bytes) -> bytes:
        if src != 5 or hop < 10:
            return frame
        return {"garbage": os.urandom(len(frame) or 64), "bogus-ids": bogus, "oversize": os.urandom(1 << 20)}[what]

    r = simulate(cfg, mutate=bad)
    assert list(r.exits) == [5], r.exits
    assert sorted(r.hashes) == [0, 1, 2, 3, 4, 6, 7]
    (change,) = r.changes.values()
    # the bound: its first bad frame is in step 10 // hops (3 here), after that step's first hop,
    # so what it sent before may still complete that step: left out from it or the next
    assert change.leave == (5,) and change.step <= 10 // p.hops + 1, change
    assert all(5 not in {m.origin for m in msgs} for s, msgs in r.records if s >= change.step)
    check_survivors(cfg, r, tmp_path)


def test_control_bad_frames_stop_receivers(monkeypatch):
    """The control: with `Member.on_bad_frame` raising (a strict receiver's reaction) instead of
    closing the edge, the same garbage from node 5 stops its neighbours instead of cutting 5 off."""

    def stop(self, peer, t, error):
        raise FrameError(f"node {self.node}: bad frame from node {peer} at step {t}: {error}")
        yield

    monkeypatch.setattr(Member, "on_bad_frame", stop)

    def bad(src: int, dst: int, hop: int, frame: bytes) -> bytes:
        return os.urandom(len(frame) or 64) if src == 5 and hop >= 10 else frame

    with pytest.raises(FrameError, match="node [146]: bad frame from node 5 at step"):
        simulate(cfg_for(steps=12), mutate=bad)


def test_in_a_strict_run_a_frame_that_does_not_decode_stops_its_receiver_naming_the_sender():
    cfg = cfg_for("churn.settle=0", steps=6)

    def bad(src: int, dst: int, hop: int, frame: bytes) -> bytes:
        return os.urandom(64) if (src, hop) == (5, 3) else frame

    with pytest.raises(FrameError, match="bad frame from node 5 at step"):
        simulate(cfg, mutate=bad)


def impostor_key(tmp_path: Path, node: int):
    """A signing function with a key that is not `node`'s (a roster of another run's keys)."""
    other = tmp_path / "impostor"
    identity.write_keys(other, 8)
    return identity.load_identity(other, node, identity.load_roster(other)).sign


@pytest.mark.parametrize("impostor", [False, True], ids=["genuine", "impostor"])
def test_only_a_process_with_the_nodes_key_rejoins_as_that_node(keys, tmp_path, impostor, caplog):
    """Signed churn on the torus: node 5 is killed before step 3 and a process restarts as node
    5 once the others reach step 7. The genuine one answers its sponsor's challenge with node 5's
    key and rejoins by replay (a committed JOIN, all eight finish on one history). An impostor (a
    process with another key, node 5's id) answers with the wrong key: its sponsor refuses it in
    one line, floods no JOIN and closes the edge, the impostor stops, and the seven others finish
    on one history without it (no join in the log)."""
    caplog.set_level(logging.WARNING, logger="seedflood")
    cfg = cfg_for(*signed(keys), PACED, steps=16)
    events = [Event(3, 5, "kill"), Event(7, 5, "restart")]
    r = simulate(cfg, events=events, impostors={5: impostor_key(tmp_path, 5)} if impostor else None)
    joins = [c.join for c in r.changes.values() if c.join]
    ((leave, change),) = [(s, c) for s, c in r.changes.items() if c.leave]
    assert change.leave == (5,) and leave == 3, r.changes  # killed before step 3: left out from step 3
    if impostor:
        assert list(r.exits) == [5] and joins == [], (r.exits, r.changes)
        # every life its supervisor starts is refused (the last may find nobody left to ask)
        assert "no neighbour sponsored the rejoin" in r.exits[5], r.exits
        refusals = [m for m in caplog.messages if "refused node 5's rejoin" in m]
        assert refusals and all(m.endswith("not signed with node 5's key") for m in refusals), refusals
        assert sorted(r.hashes) == [0, 1, 2, 3, 4, 6, 7]
        assert all(5 not in {m.origin for m in msgs} for s, msgs in r.records if s >= leave)
    else:
        assert r.exits == {} and joins == [((5, 1),)], (r.exits, r.changes)
        assert sorted(r.hashes) == list(range(8))
    assert all(s.forged == 0 for s in r.flood.values())  # refused before it sent anything
    check_survivors(cfg, r, tmp_path)


def test_a_process_signing_as_another_node_from_the_start_is_left_out(keys, tmp_path):
    """Node 5's process holds another key from its first step (it signs as node 5 with a key the
    roster does not name): everything it originates is dropped and counted as forged by its
    neighbours, it is left out by a committed step like a silent client, the others train on."""
    cfg = cfg_for(*signed(keys), steps=12)
    r = simulate(cfg, impostors={5: impostor_key(tmp_path, 5)})
    assert list(r.exits) == [5] and "without this client" in r.exits[5], r.exits
    ((step, change),) = r.changes.items()
    assert change.leave == (5,) and step == 0  # none of its messages ever counted
    assert sum(r.flood[n].forged for n in (1, 4, 6)) > 0
    check_survivors(cfg, r, tmp_path)
