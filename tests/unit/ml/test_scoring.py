"""scoring.py against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from seedflood.ml import scoring


def test_accuracy_and_loss():
    scores = np.array([[0.0, 0.0], [math.log(3.0), 0.0], [-1.0, 2.0]])
    labels = np.array([0, 1, 1])
    # Row 0: tie -> argmax picks candidate 0 (correct); row 1 predicts 0 (wrong); row 2 correct.
    assert scoring.accuracy(scores, labels) == pytest.approx(2 / 3)
    # CE: ln 2; −log(1/4) = ln 4; −log(e²/(e⁻¹+e²)) = log(1 + e⁻³).
    expected = (math.log(2) + math.log(4) + math.log1p(math.exp(-3))) / 3
    assert scoring.ce_loss(scores, labels) == pytest.approx(expected)


def test_loss_is_stable_for_large_scores():
    scores = np.array([[-1e4, 0.0]])
    assert scoring.ce_loss(scores, np.array([1])) == pytest.approx(0.0)
    assert scoring.ce_loss(scores, np.array([0])) == pytest.approx(1e4)


def test_shape_and_label_checks():
    with pytest.raises(ValueError, match="N×C"):
        scoring.accuracy(np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="labels must lie"):
        scoring.accuracy(np.zeros((2, 2)), np.array([0, 2]))


def test_average_ranks_share_ties():
    np.testing.assert_allclose(scoring._average_ranks(np.array([3.0, 1.0, 3.0, 2.0])), [3.5, 1, 3.5, 2])


def test_auc_without_and_with_ties():
    assert scoring.auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == pytest.approx(0.75)
    # Pairs (pos, neg): (1,1) tie = ½, (1,0) = 1, (2,1) = 1, (2,0) = 1 -> 3.5 / 4.
    assert scoring.auc(np.array([1.0, 1.0, 2.0, 0.0]), np.array([1, 0, 1, 0])) == pytest.approx(0.875)
    assert scoring.auc(np.zeros(4), np.array([0, 1, 0, 1])) == pytest.approx(0.5)
    assert math.isnan(scoring.auc(np.array([1.0, 2.0]), np.array([1, 1])))


def test_best_threshold_separable_and_ties():
    t, acc = scoring.best_threshold(np.array([-2.0, -1.0, 0.5, 1.0, 3.0]), np.array([0, 0, 0, 1, 1]))
    assert (t, acc) == (0.75, 1.0)
    # All-positive (t = −1) and the 0.5 split both get 2/3; the one closer to 0 wins.
    t, acc = scoring.best_threshold(np.array([0.0, 0.0, 1.0]), np.array([0, 1, 1]))
    assert (t, acc) == (0.5, pytest.approx(2 / 3))
    # All negative: the best rule predicts 0 everywhere (threshold above the maximum).
    t, acc = scoring.best_threshold(np.array([1.0, 2.0]), np.array([0, 0]))
    assert acc == 1.0 and t > 2.0


def test_threshold_accuracy_is_strict():
    m = np.array([-1.0, 0.0, 1.0])
    assert scoring.threshold_accuracy(m, np.array([0, 0, 1]), 0.0) == 1.0
    assert scoring.threshold_accuracy(m, np.array([0, 1, 1]), 0.0) == pytest.approx(2 / 3)


def test_metrics_summary_with_dev_threshold():
    # A biased model: every margin is positive, but dev shows that label 1 means margin > 2.
    dev = np.array([[0.0, 1.0], [0.0, 1.5], [0.0, 3.0], [0.0, 4.0]])
    dev_y = np.array([0, 0, 1, 1])
    test = np.array([[0.0, 0.5], [0.0, 2.5], [0.0, 5.0], [0.0, 1.0]])
    test_y = np.array([0, 1, 1, 0])
    m = scoring.metrics(test, test_y, dev, dev_y)
    assert m["n"] == 4
    assert m["accuracy"] == 0.5
    assert m["pred_frac"] == [0.0, 1.0]
    assert m["auc"] == 1.0
    assert m["threshold"] == 2.25
    assert m["threshold_accuracy"] == 1.0
    three = scoring.metrics(np.eye(3), np.array([0, 1, 2]))
    assert three["accuracy"] == 1.0 and three["auc"] is None and three["threshold_accuracy"] is None
