"""The audit's verdict on one recomputed scalar (core/flood/audits.py `agrees`, `confirms`) and
the setting behind it, `trust.audit_tolerance` (docs/trust.md, Mixed hardware).

- Tolerance 0 (the default) is exact f32 equality, as before the setting existed, for the
  auditor's comparison and for a re-check; a NaN never agrees.
- The tolerance is absolute on the scalar: two honest scalars near zero of opposite sign agree
  (a relative or sign test would accuse them), a shift beyond it does not.
- A re-check takes a note only on its own verdict: a note claiming a value beyond the tolerance
  from an honest origin's scalar never convicts it, even when the claim agrees with this client's
  recomputation; an honest auditor's note does.
- The config: 0 by default, a loss difference in nats (scalar tolerance = it / 2·zo.eps), >= 0,
  only with trust.audit; not in the trajectory (a run's log header and hashes do not change).
"""

from __future__ import annotations

import math

import pytest

from seedflood.core.config import runconfig as config
from seedflood.core.config.configerror import ConfigError
from seedflood.core.flood import audits
from seedflood.core.flood.protocol import Protocol, trajectory


@pytest.mark.parametrize(
    "a, b",
    [(0.25, 0.25), (0.0, -0.0), (0.25, math.nextafter(0.25, 1.0)), (1e-9, -1e-9), (0.1, float("nan"))],
)
def test_without_a_tolerance_the_verdict_is_exact_equality(a, b):
    assert audits.agrees(a, b, 0.0) is (a == b)
    for mine, claimed, sent in [(a, a, b), (a, b, b), (b, a, a)]:
        assert audits.confirms(sent, claimed, mine, 0.0) is (mine == claimed and mine != sent)


def test_the_tolerance_is_absolute_on_the_scalar():
    tol = 5e-3
    assert audits.agrees(1e-4, -2e-4, tol)  # opposite signs near zero: honest within the tolerance
    assert audits.agrees(0.4, 0.4 + 0.9 * tol, tol) and audits.agrees(-0.4, -0.4 - 0.99 * tol, tol)
    assert not audits.agrees(0.4, 0.4 + 1.1 * tol, tol) and not audits.agrees(1e-4, 1e-4 - 1.1 * tol, tol)
    assert not audits.agrees(0.4, float("nan"), tol) and not audits.agrees(float("inf"), 0.4, tol)


def test_a_re_check_takes_a_note_on_its_own_verdict_only():
    tol = 5e-3
    sent, mine = 0.400, 0.402  # an honest origin; this client's kind computes 0.002 away
    framed = sent + 1.2 * tol  # a claim beyond the tolerance from what was sent, within it of mine
    assert audits.agrees(framed, mine, tol) and not audits.agrees(sent, framed, tol)
    assert not audits.confirms(sent, framed, mine, tol)  # the honest origin is never convicted
    lie = 0.400 + 3 * tol  # a liar; an honest auditor of a third kind recomputed 0.399
    assert audits.confirms(lie, 0.399, mine, tol)
    assert not audits.confirms(lie, 0.399 + 3 * tol, mine, tol)  # the note's claim is no recomputation


def _protocol(*sets: str) -> Protocol:
    return Protocol.of(config.load(None, list(sets)), 2)


def test_the_setting_is_a_loss_difference_shared_through_the_protocol_and_not_in_the_trajectory():
    exact = _protocol("trust.audit=1")
    assert exact.audit_tolerance == 0.0 and exact.scalar_tolerance == 0.0
    mixed = _protocol("trust.audit=1", "trust.audit_tolerance=1e-5", "zo.eps=1e-3")
    assert mixed.audit_tolerance == 1e-5 and mixed.scalar_tolerance == pytest.approx(5e-3, rel=1e-12)
    cfg = config.load(None, ["trust.audit=1"])
    tolerant = config.load(None, ["trust.audit=1", "trust.audit_tolerance=1e-5"])
    assert trajectory(tolerant, mixed, "d") == trajectory(cfg, exact, "d")


@pytest.mark.parametrize(
    "sets, said",
    [
        (
            ["trust.audit=1", "trust.audit_tolerance=-1e-5"],
            "trust.audit_tolerance: must be >= 0 (loss units; 0 = exact)",
        ),
        (["trust.audit_tolerance=1e-5"], "trust.audit_tolerance: needs trust.audit > 0"),
    ],
)
def test_a_bad_tolerance_is_refused_in_one_line(sets, said):
    with pytest.raises(ConfigError) as e:
        config.load(None, sets)
    assert str(e.value).startswith(said) and "\n" not in str(e.value)
