"""Metrics from per-class counts and scores, in NumPy: imbalanced and multi-label data.

Balanced accuracy is the mean per-class recall over the classes with examples,
and average precision is scikit-learn's (`balanced_accuracy_score`,
`average_precision_score`, tied scores taken together); mAP and macro F1 are
means over the classes that have a positive example (or, for F1, a prediction).
"""

from __future__ import annotations

import numpy as np


def _mean_present(values: np.ndarray) -> float:
    """The mean of the values that are not NaN (NaN when none is)."""
    present = ~np.isnan(values)
    return float(values[present].mean()) if present.any() else float("nan")


def per_class_recall(class_examples: np.ndarray, class_correct: np.ndarray) -> np.ndarray:
    """float64 [classes]: correct / examples per true class; NaN for a class without examples."""
    return np.where(class_examples > 0, class_correct / np.maximum(class_examples, 1), np.nan)


def balanced_accuracy(class_examples: np.ndarray, class_correct: np.ndarray) -> float:
    """The mean recall over the classes that have examples (NaN when none has)."""
    return _mean_present(per_class_recall(class_examples, class_correct))


def average_precision(scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """float64 [classes]: each class's AP; NaN for a class without positives.

    AP = sum over the distinct scores, high to low, of (R_n - R_(n-1)) * P_n;
    `scores` only count by their order, `targets` are 0/1, both [examples, classes].
    """
    scores = np.asarray(scores, np.float64)
    targets = np.asarray(targets) > 0.5
    result = np.full(scores.shape[1], np.nan)
    for c in range(scores.shape[1]):
        positives = targets[:, c].sum()
        if positives == 0:
            continue
        order = np.argsort(-scores[:, c], kind="stable")
        ranked_scores, hits = scores[order, c], targets[order, c]
        true_positives = np.cumsum(hits)
        # The last position of each run of tied scores: one threshold each.
        last = np.r_[np.flatnonzero(np.diff(ranked_scores)), len(ranked_scores) - 1]
        tp = true_positives[last]
        precision = tp / (last + 1)
        recall = tp / positives
        result[c] = np.sum(np.diff(np.r_[0.0, recall]) * precision)
    return result


def mean_average_precision(scores: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """(mAP over the classes with positives, per-class AP)."""
    ap = average_precision(scores, targets)
    return _mean_present(ap), ap


def f1_scores(
    probabilities: np.ndarray, targets: np.ndarray, threshold: float
) -> tuple[float, float, np.ndarray]:
    """(micro F1, macro F1, per-class F1) with a class predicted at probability >= threshold.

    Micro F1 = 2 TP / (2 TP + FP + FN) over every (example, class) pair; a
    class with no positive and no prediction has F1 NaN, out of the macro mean.
    """
    predicted = np.asarray(probabilities) >= threshold
    actual = np.asarray(targets) > 0.5
    tp = (predicted & actual).sum(axis=0).astype(np.float64)
    fp = (predicted & ~actual).sum(axis=0).astype(np.float64)
    fn = (~predicted & actual).sum(axis=0).astype(np.float64)
    denominator = 2 * tp + fp + fn
    per_class = np.where(denominator > 0, 2 * tp / np.maximum(denominator, 1), np.nan)
    total = 2 * tp.sum() + fp.sum() + fn.sum()
    micro = float(2 * tp.sum() / total) if total > 0 else float("nan")
    return micro, _mean_present(per_class), per_class
