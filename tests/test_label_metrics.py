"""Average precision, F1 and balanced accuracy: hand examples and loop implementations."""

import numpy as np
import pytest

from resnet_app.engine import label_metrics


def loop_average_precision(scores, targets):
    """AP without ties: the mean, over the positives, of the precision at each one's rank."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    hits, precisions = 0, []
    for rank, i in enumerate(order, 1):
        if targets[i]:
            hits += 1
            precisions.append(hits / rank)
    return sum(precisions) / len(precisions)


def loop_f1(predicted, actual):
    tp = sum(p and a for p, a in zip(predicted, actual))
    fp = sum(p and not a for p, a in zip(predicted, actual))
    fn = sum(a and not p for p, a in zip(predicted, actual))
    return tp, fp, fn


def test_average_precision_by_hand():
    # Positives at ranks 1 and 3: (1/1 + 2/3) / 2.
    scores = np.array([[0.9], [0.8], [0.7], [0.6]])
    targets = np.array([[1], [0], [1], [0]])
    assert label_metrics.average_precision(scores, targets)[0] == pytest.approx(5 / 6)
    # Tied scores are one threshold: at 0.9, P = 1/2 and R = 1/2; at 0.5, P = 2/3, R = 1.
    tied = label_metrics.average_precision(
        np.array([[0.9], [0.9], [0.5]]), np.array([[1], [0], [1]])
    )
    assert tied[0] == pytest.approx(0.5 * 0.5 + 0.5 * 2 / 3)
    # A class without positives has no AP and stays out of the mean.
    mean, per_class = label_metrics.mean_average_precision(
        np.array([[0.9, 0.1], [0.2, 0.3]]), np.array([[1, 0], [0, 0]])
    )
    assert np.isnan(per_class[1]) and mean == pytest.approx(1.0)


def test_average_precision_against_a_loop():
    rng = np.random.default_rng(0)
    scores = rng.random((200, 7))
    targets = (rng.random((200, 7)) < np.linspace(0.05, 0.6, 7)).astype(np.uint8)
    got = label_metrics.average_precision(scores, targets)
    for c in range(7):
        assert got[c] == pytest.approx(loop_average_precision(scores[:, c], targets[:, c]))
    mean, _ = label_metrics.mean_average_precision(scores, targets)
    assert mean == pytest.approx(np.mean(got))


def test_f1_by_hand_and_against_a_loop():
    probabilities = np.array([[0.9, 0.2], [0.6, 0.7], [0.1, 0.4]])
    targets = np.array([[1, 0], [0, 1], [1, 1]])
    # Class 0: TP 1, FP 1, FN 1 -> F1 1/2. Class 1: TP 1, FP 0, FN 1 -> 2/3. Micro: 4/7.
    micro, macro, per_class = label_metrics.f1_scores(probabilities, targets, 0.5)
    np.testing.assert_allclose(per_class, [0.5, 2 / 3])
    assert micro == pytest.approx(2 * 2 / (2 * 2 + 1 + 2))
    assert macro == pytest.approx((0.5 + 2 / 3) / 2)

    rng = np.random.default_rng(1)
    probabilities, targets = rng.random((100, 5)), rng.random((100, 5)) < 0.3
    micro, macro, per_class = label_metrics.f1_scores(probabilities, targets, 0.4)
    totals = np.zeros(3)
    for c in range(5):
        counts = loop_f1(probabilities[:, c] >= 0.4, targets[:, c])
        totals += counts
        assert per_class[c] == pytest.approx(
            2 * counts[0] / (2 * counts[0] + counts[1] + counts[2])
        )
    assert micro == pytest.approx(2 * totals[0] / (2 * totals[0] + totals[1] + totals[2]))
    assert macro == pytest.approx(per_class.mean())


def test_balanced_accuracy_by_hand():
    examples, correct = np.array([90, 10, 0]), np.array([90, 1, 0])
    np.testing.assert_allclose(label_metrics.per_class_recall(examples, correct)[:2], [1.0, 0.1])
    assert np.isnan(label_metrics.per_class_recall(examples, correct)[2])
    # Plain accuracy would be 91%; the classes' mean recall is 55%.
    assert label_metrics.balanced_accuracy(examples, correct) == pytest.approx(0.55)
