"""Metrics over candidate scores: what the evaluator reports about a model on a split.

Owns: turning an N×C matrix of candidate scores (MeZO: the mean log-probability of each
candidate's option tokens) and N gold labels into accuracy, mean cross-entropy, and, for binary
tasks, the AUC of the margin score[:, 1] − score[:, 0] plus a decision threshold tuned on one split
(dev) and applied to another (test). Threshold tuning separates label-bias recalibration from
real separation (most early ZO gains on rt are recalibration of the label bias).

Assumes: pure numpy; scores are finite float arrays of shape (N, C), labels are ints in [0, C).
Every function returns plain Python floats so the results go straight into JSON.
"""

from __future__ import annotations

import logging
from typing import TypedDict

import numpy as np

log = logging.getLogger(__name__)


class Metrics(TypedDict):
    n: int
    accuracy: float
    loss: float
    """Mean cross-entropy of softmax(scores) against the labels (nats)."""
    pred_frac: list[float]
    """Fraction of predictions per candidate (label bias: zero-shot SmolLM2 says "great" 98%)."""
    auc: float | None
    """AUC of the margin score[:, 1] − score[:, 0] (C == 2 only)."""
    threshold: float | None
    """Margin threshold tuned on dev (predict 1 iff margin > threshold); None without dev scores."""
    threshold_accuracy: float | None
    """Accuracy on this split at the dev-tuned threshold."""


def _check(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if s.ndim != 2 or y.shape != (s.shape[0],):
        raise ValueError(f"scores must be N×C and labels N, got {s.shape} and {y.shape}")
    if y.size and (y.min() < 0 or y.max() >= s.shape[1]):
        raise ValueError(f"labels must lie in [0, {s.shape[1]}), got {y.min()}..{y.max()}")
    return s, y


def accuracy(scores: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of rows whose argmax (first on ties) equals the label."""
    s, y = _check(scores, labels)
    return float(np.mean(s.argmax(axis=1) == y)) if y.size else float("nan")


def ce_loss(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mean over rows of −log softmax(scores)[label], computed stably."""
    s, y = _check(scores, labels)
    m = s.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(s - m).sum(axis=1))
    return float(np.mean(lse - s[np.arange(len(y)), y])) if y.size else float("nan")


def margin(scores: np.ndarray) -> np.ndarray:
    """score[:, 1] − score[:, 0] for binary tasks: positive favours label 1."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2 or s.shape[1] != 2:
        raise ValueError(f"a margin needs N×2 scores, got {s.shape}")
    return s[:, 1] - s[:, 0]


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of x, tied values sharing the mean of their ranks."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    # Group g occupies ranks start+1 .. start+count; its mean rank is start + (count + 1) / 2.
    starts = np.cumsum(counts) - counts
    return (starts + (counts + 1) / 2.0)[inverse]


def auc(margins: np.ndarray, labels: np.ndarray) -> float:
    """Rank-based (Mann–Whitney) AUC: P(m_pos > m_neg) + ½·P(tie); nan if a class is absent."""
    m = np.asarray(margins, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    n_pos = int((y == 1).sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = _average_ranks(m)
    return float((r[y == 1].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def threshold_accuracy(margins: np.ndarray, labels: np.ndarray, threshold: float) -> float:
    """Accuracy of the rule: predict 1 iff margin > threshold."""
    m = np.asarray(margins, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    return float(np.mean((m > threshold).astype(np.int64) == y)) if y.size else float("nan")


def best_threshold(margins: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(threshold, accuracy) maximising accuracy of `margin > threshold` on this split.

    Candidates are the midpoints between consecutive distinct margins plus one value below the
    minimum and one above the maximum (every achievable split of the sorted margins). Among equally
    accurate thresholds the one closest to 0 (the untuned argmax rule) wins.
    """
    m = np.asarray(margins, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if not y.size:
        return 0.0, float("nan")
    u, inverse = np.unique(m, return_inverse=True)
    pos = np.bincount(inverse, weights=(y == 1), minlength=len(u))  # positives per distinct value
    neg = np.bincount(inverse, weights=(y != 1), minlength=len(u))
    # Candidate i (0..len(u)) predicts 1 exactly for the values u[i:], so it gets right the
    # negatives below u[i] and the positives at or above u[i].
    correct = np.concatenate([[0.0], np.cumsum(neg)]) + np.concatenate([np.cumsum(pos[::-1])[::-1], [0.0]])
    cands = np.concatenate([[u[0] - 1.0], (u[:-1] + u[1:]) / 2.0, [u[-1] + 1.0]])
    best = np.flatnonzero(correct == correct.max())
    i = best[np.argmin(np.abs(cands[best]))]
    return float(cands[i]), float(correct[i] / len(y))


def metrics(
    scores: np.ndarray,
    labels: np.ndarray,
    dev_scores: np.ndarray | None = None,
    dev_labels: np.ndarray | None = None,
) -> Metrics:
    """Summary of one split; with dev scores (binary tasks), also accuracy at the dev threshold."""
    s, y = _check(scores, labels)
    n, c = s.shape
    pred = s.argmax(axis=1)
    out = Metrics(
        n=n,
        accuracy=accuracy(s, y),
        loss=ce_loss(s, y),
        pred_frac=(np.bincount(pred, minlength=c) / max(n, 1)).tolist(),
        auc=None,
        threshold=None,
        threshold_accuracy=None,
    )
    if c == 2:
        out["auc"] = auc(margin(s), y)
        if dev_scores is not None and dev_labels is not None:
            ds, dy = _check(dev_scores, dev_labels)
            t, _ = best_threshold(margin(ds), dy)
            out["threshold"] = t
            out["threshold_accuracy"] = threshold_accuracy(margin(s), y, t)
    return out
