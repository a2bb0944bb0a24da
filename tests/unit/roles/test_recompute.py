"""Verification by recomputation through the real client loop, in process (docs/trust.md).

A ring of 4 clients on the debug config (tiny model, subcge directions), churn.settle 1 unless
strict. Every case checks what the clients end on, not only who was named:
- auditing changes no bit: trust.audit 0 and 1 end on the bits of a run without the key,
  every client, every step, strict (with overlap: the hop thread compares) and churn;
- a liar (×10, a random scalar, another zo.eps) is excluded at full audit rate by a committed
  step (the change's `audit` reason; step 0, so not even its first lie is applied), nothing it
  sent after it counts, and the survivors finish
  on one history: the same bits after every step, equal to a replay of the decided steps and
  to the log written from them;
- at a partial rate some clients take the evidence by re-checking another's RECOMPUTE note
  (recomputing on their snapshot), and a signed liar whose audit draws use the auditors'
  private signatures is excluded the same way;
- a RECOMPUTE note against an honest origin does not re-check: every client that re-checks
  drops it and counts it against its sender, and the run has the honest bits;
- in a strict run the auditor stops the run with one line naming the origin and the step;
- a RECOMPUTE note about a step older than the snapshots kept is dropped as stale;
- with `trust.audit_tolerance` (a run mixing kinds of hardware) a liar that shifts each scalar
  by just over the scalar tolerance is excluded as any liar, and one that shifts it by just under
  passes: nobody is excluded, every client ends on one history that includes its lie; the same
  shift without the tolerance is caught (the control), and an honest run's bits do not change;
  a strict run stops on it with a line saying how far apart the scalars are.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_churn import cfg_for, check_survivors, protocol_of  # the churn tests' run helpers

from seedflood.comm import identity
from seedflood.core.flood.hop import decode_hop, encode_hop
from seedflood.core.membership.notes import recompute_note
from seedflood.roles.audit import AuditError, Auditor
from seedflood.roles.inprocess import simulate
from seedflood.roles.lying import Lie

torch.set_num_threads(1)
RING = ("topology.kind=ring", "topology.nodes=4")  # diameter 2: each client audits 3 origins
LIAR = 2


def ring(*overrides: str, steps: int = 6):
    return cfg_for(*RING, *overrides, steps=steps)


@pytest.mark.parametrize("mode", [("churn.settle=1",), ("churn.settle=0", "flood.overlap=true")])
def test_auditing_changes_no_bit_of_an_honest_run(mode):
    # Nobody fails here, so no receive may time out: a 1 s timeout fired on a loaded machine (three
    # test workers and other jobs on 2 cores) and stopped the strict run; 10 s only waits if a peer hangs.
    mode = (*mode, "transport.timeout_s=10")
    plain = simulate(ring(*mode))
    off = simulate(ring(*mode, "trust.audit=0"))
    on = simulate(ring(*mode, "trust.audit=1"))
    assert len(set(plain.hashes.values())) == 1 and plain.exits == {} and on.exits == {}
    for r in (off, on):
        assert r.step_hashes == plain.step_hashes and r.records == plain.records and r.changes == {}
    assert off.audits == {}  # no auditor at all when off
    for a in on.audits.values():  # every client recomputed the 3 others' scalars of each of 6 steps
        assert a.recomputed == 3 * 6 and a.found == {} and a.sent == 0 and not a.false


def excluded(cfg, r, tmp_path: Path) -> None:
    """The liar left by a committed step for an audit, nothing of it counts after, one history."""
    assert r.exits.keys() == {LIAR} and "without this client" in r.exits[LIAR], r.exits
    (change,) = r.changes.values()
    assert change.leave == (LIAR,) and change.audit == (LIAR,)
    assert all(LIAR not in {m.origin for m in msgs} for s, msgs in r.records if s >= change.step)
    check_survivors(cfg, r, tmp_path)


@pytest.mark.parametrize("lie", [Lie("scale", 10.0), Lie("random", 1.0), Lie("eps", 1e-2)], ids=lambda x: x.kind)
def test_a_liar_is_excluded_at_full_audit_rate_and_the_others_finish_on_one_history(lie, tmp_path):
    cfg = ring("trust.audit=1")
    r = simulate(cfg, lies={LIAR: lie})
    excluded(cfg, r, tmp_path)
    for n in (0, 1, 3):  # each audited its first lie itself, at step 0, and said so
        assert r.audits[n].found == {LIAR: (0, 0)} and r.audits[n].sent >= 1
    assert list(r.changes) == [0]  # excluded from step 0 on: not even its first lie was applied


def test_control_no_audit_evidence_applies_the_lies(monkeypatch):
    """The control: with `Auditor._take` recording nobody (a recomputation that does not agree
    becomes no evidence), the same ×10 liar at full audit rate is excluded by no one, and every
    client ends on one history that holds its lies, off the bits of the honest run."""
    monkeypatch.setattr(Auditor, "_take", lambda self, origin, step, t, line: None)
    r = simulate(ring("trust.audit=1"), lies={LIAR: Lie("scale", 10.0)})
    assert r.exits == {} and r.changes == {} and len(set(r.hashes.values())) == 1, r.exits
    assert all(LIAR in {m.origin for m in msgs} for _, msgs in r.records)
    assert r.hashes != simulate(ring("trust.audit=0")).hashes


def test_at_a_partial_rate_evidence_is_re_checked_before_it_counts(tmp_path):
    cfg = ring("trust.audit=0.3")
    r = simulate(cfg, lies={LIAR: Lie("scale", 10.0)})
    excluded(cfg, r, tmp_path)
    (step,) = r.changes  # the bound: the first lie an honest auditor drew (every step lies here)
    assert step == min(r.audits[n].found[LIAR][0] for n in (0, 1, 3)), (step, r.audits)
    assert sum(r.audits[n].rechecked for n in (0, 1, 3)) > 0
    assert all(LIAR in r.audits[n].found for n in (0, 1, 3)) and not any(a.false for a in r.audits.values())


def test_a_signed_liar_drawn_by_private_samples_is_excluded(tmp_path):
    keys = tmp_path / "keys"
    identity.write_keys(keys, 4)
    cfg = ring("trust.sign=true", f"trust.keys={keys}", "trust.audit=0.5")
    r = simulate(cfg, lies={LIAR: Lie("scale", 10.0)})
    excluded(cfg, r, tmp_path)
    assert all(s.forged == 0 for s in r.flood.values())  # the lie was signed by its origin: authentic


def test_false_evidence_against_an_honest_origin_is_dropped_and_counted_against_its_sender():
    """Node 1 adds to every frame it sends from hop 4 on two RECOMPUTE notes claiming node 2's
    scalar of step 1 recomputes to 0.123 and to 0.456: it does not, so nobody takes them, and
    each client re-checks only the first (its sender is not re-checked again)."""
    cfg = ring("trust.audit=0.01")  # audits on (snapshots kept), next to no draws
    honest = simulate(cfg)
    limits = protocol_of(cfg).limits(0, 2**32 - 1)
    lies = [recompute_note(auditor=1, accused=2, step=1, k=0, scalar=x) for x in (0.123, 0.456)]

    def accuse(src: int, dst: int, hop: int, frame: bytes) -> bytes:
        if src != 1 or hop < 4 or not frame:
            return frame
        msgs, notes = decode_hop(frame, limits)
        return encode_hop(msgs, [*notes, *lies])

    r = simulate(cfg, mutate=accuse)
    assert r.exits == {} and r.changes == {} and r.step_hashes == honest.step_hashes
    for n in (0, 3):  # node 2 is the accused (it knows what it sent); node 1 never holds the notes
        assert r.audits[n].false == {1: 2} and r.audits[n].rechecked == 1 and r.audits[n].found == {}


@pytest.mark.parametrize("overlap", [False, True])  # with overlap the hop thread compares, the join raises
def test_in_a_strict_run_a_lie_stops_the_run_with_one_line_naming_the_origin_and_step(overlap):
    sets = ("churn.settle=0", "trust.audit=1", f"flood.overlap={str(overlap).lower()}")
    with pytest.raises(AuditError) as e:
        simulate(ring(*sets), lies={LIAR: Lie("scale", 10.0)})
    line = str(e.value)
    assert line.startswith(f"node {LIAR}'s scalar of step 0 (k 0) is ") and "\n" not in line
    assert line.endswith("a strict run has no exclusion, so it stops")


def test_evidence_about_a_step_older_than_the_snapshots_kept_is_dropped_as_stale():
    """docs/trust.md: a client keeps the state of the last 2 × (delay + 1) steps for re-checks.
    Node 1 adds to every frame from hop 14 (step 7 of the ring's 2 hops a step) a RECOMPUTE note
    against node 2's scalar of step 0, which no client can re-check any more: each drops it as
    stale, counts nothing against its sender or node 2, and the run has the honest bits."""
    cfg = ring("trust.audit=0.01", steps=10)
    p = protocol_of(cfg)
    assert 7 - 2 * (p.delay + 1) > 0  # step 0's snapshot is gone by step 7
    honest = simulate(cfg)
    limits = p.limits(0, 2**32 - 1)
    old = recompute_note(auditor=1, accused=2, step=0, k=0, scalar=0.123)

    def accuse(src: int, dst: int, hop: int, frame: bytes) -> bytes:
        if src != 1 or hop < 7 * p.hops or not frame:
            return frame
        msgs, notes = decode_hop(frame, limits)
        return encode_hop(msgs, [*notes, old])

    r = simulate(cfg, mutate=accuse)
    assert r.exits == {} and r.changes == {} and r.step_hashes == honest.step_hashes
    for n in (0, 3):
        assert r.audits[n].stale >= 1 and r.audits[n].rechecked == 0, r.audits[n]
        assert not r.audits[n].false and r.audits[n].found == {}


TOLERANCE = 1e-5  # nats on L+ − L−: 5e-3 on a scalar at the debug config's zo.eps 1e-3


@pytest.mark.parametrize("factor", [1.05, 0.95], ids=["above", "below"])
def test_a_liar_just_above_the_tolerance_is_excluded_and_one_just_below_passes(factor, tmp_path):
    cfg = ring("trust.audit=1", f"trust.audit_tolerance={TOLERANCE}")
    lie = Lie("shift", factor * protocol_of(cfg).scalar_tolerance)
    r = simulate(cfg, lies={LIAR: lie})
    if factor > 1:
        excluded(cfg, r, tmp_path)
        assert list(r.changes) == [0]  # not even its first lie was applied
        return
    assert r.exits == {} and r.changes == {} and len(set(r.hashes.values())) == 1, (r.exits, r.changes)
    assert not any(a.found or a.sent or a.false for a in r.audits.values())
    check_survivors(cfg, r, tmp_path)  # one history, the log and its replay
    honest = simulate(ring("trust.audit=1"))
    assert simulate(cfg).step_hashes == honest.step_hashes  # the tolerance changes no honest bit
    assert r.step_hashes != honest.step_hashes  # the lie was applied: it hid inside the tolerance
    exact = simulate(ring("trust.audit=1"), lies={LIAR: lie})  # control: the same shift, no tolerance
    excluded(ring("trust.audit=1"), exact, tmp_path / "exact")


def test_in_a_strict_run_a_lie_beyond_the_tolerance_stops_it_saying_how_far_apart():
    cfg = ring("churn.settle=0", "trust.audit=1", f"trust.audit_tolerance={TOLERANCE}")
    with pytest.raises(AuditError) as e:
        simulate(cfg, lies={LIAR: Lie("shift", 1.05 * protocol_of(cfg).scalar_tolerance)})
    line = str(e.value)
    assert line.startswith(f"node {LIAR}'s scalar of step 0 (k 0) is ") and "\n" not in line
    assert "(0.00525 apart, the audit tolerance is 0.005): it did not follow the estimator" in line, line
