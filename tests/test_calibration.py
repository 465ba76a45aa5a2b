"""Calibration: ECE, reliability bins, NLL, temperature scaling and the reliability diagram.

Every number is checked against a reference computed another way: a hand
calculation, a plain Python loop over the examples, a direct float64
-log(softmax), or a brute-force grid search over the temperature.
"""

import importlib.util
import json
import math
import os
import sys

import numpy as np
import pytest

from resnet_app.evaluation import calibration, reliability_plot

HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


# References, written independently of the module.


def loop_bins(probabilities, labels, bins):
    """Per bin, the (confidence, correct) pairs of its examples: one example at a time."""
    members = [[] for _ in range(bins)]
    for row, label in zip(probabilities.tolist(), labels.tolist()):
        confidence = max(row)
        predicted = row.index(confidence)  # The first on a tie, as argmax.
        for i in range(bins):
            lower, upper = i / bins, (i + 1) / bins
            if lower < confidence <= upper or (i == 0 and confidence == 0):
                members[i].append((confidence, predicted == label))
                break
    return members


def loop_ece(probabilities, labels, bins):
    ece = 0.0
    for members in loop_bins(probabilities, labels, bins):
        if members:
            accuracy = sum(correct for _, correct in members) / len(members)
            confidence = sum(c for c, _ in members) / len(members)
            ece += len(members) / len(labels) * abs(accuracy - confidence)
    return ece


def direct_softmax(logits):
    """exp(z) / sum exp(z), no shift: only for logits small enough not to overflow."""
    exponentials = np.exp(logits.astype(np.float64))
    assert np.all(np.isfinite(exponentials))
    return exponentials / exponentials.sum(axis=-1, keepdims=True)


def direct_nll(logits, labels, temperatures):
    """-log softmax(logits / T)[label], averaged, for each T of `temperatures`, no shift."""
    temperatures = np.asarray(temperatures, np.float64)
    scaled = logits[None].astype(np.float64) / temperatures[:, None, None]
    picked = scaled[:, np.arange(len(labels)), labels]
    sums = np.exp(scaled).sum(axis=-1)
    assert np.all(np.isfinite(sums))
    return np.mean(np.log(sums) - picked, axis=-1)


def grid_temperature(logits, labels, low=0.05, high=20.0):
    """The NLL's minimizer by brute force: 20001 temperatures, then a fine grid around the best.

    Assumes nothing about the shape of the NLL in T or in 1/T.
    """
    grid = np.geomspace(low, high, 20001)
    nll = np.concatenate([direct_nll(logits, labels, chunk) for chunk in np.array_split(grid, 100)])
    best = int(np.argmin(nll))
    # Neighbouring points are 0.03% apart: the fine grid is ~1e-7 relative.
    fine = np.linspace(grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)], 4001)
    fine_nll = np.concatenate(
        [direct_nll(logits, labels, chunk) for chunk in np.array_split(fine, 10)]
    )
    return float(fine[np.argmin(fine_nll)])


def sample_calibrated(rng, examples, classes=10, spread=2.0):
    """Logits z and labels drawn from softmax(z): z is perfectly calibrated by construction."""
    logits = rng.normal(0.0, spread, (examples, classes))
    probabilities = direct_softmax(logits)
    cumulative = probabilities.cumsum(axis=1)
    labels = (cumulative < rng.random((examples, 1))).sum(axis=1)
    return logits, np.minimum(labels, classes - 1)  # cumsum may end at 1 - 1e-16.


def temperature_standard_error(true_logits, scale):
    """The asymptotic standard error of the fitted T when the model's logits are scale * z.

    The maximum-likelihood beta = 1/T has Fisher information per example
    Var_softmax(z)[scale * z] at the true beta = 1/scale, so sd(beta) =
    1 / sqrt(N * mean Var), and by the delta method sd(T) = T^2 sd(beta) =
    scale / sqrt(N * mean Var_softmax(z)[z]). (Checked over 20 seeds when the
    test was written: the spread of the fitted T matched it within 15%.)
    """
    probabilities = direct_softmax(true_logits)
    mean = np.sum(probabilities * true_logits, axis=1)
    variance = np.sum(probabilities * true_logits**2, axis=1) - mean**2
    return scale / math.sqrt(len(true_logits) * float(np.mean(variance)))


# ECE and reliability bins.


def hand_example():
    """Two classes, 5 bins: (0, .2], (.2, .4], (.4, .6], (.6, .8], (.8, 1].

    confidence  prediction  label  bin
      0.90          0          0    4   right
      0.95          0          1    4   wrong
      0.70          0          1    3   wrong
      0.65          1          1    3   right
      0.55          0          0    2   right
      0.60          0          1    2   wrong  (on the edge 3/5: bin 2, not 3)

    bin 4: accuracy 1/2, confidence (0.90 + 0.95) / 2 = 0.925, gap 0.425
    bin 3: accuracy 1/2, confidence (0.70 + 0.65) / 2 = 0.675, gap 0.175
    bin 2: accuracy 1/2, confidence (0.55 + 0.60) / 2 = 0.575, gap 0.075
    ECE = 2/6 * (0.425 + 0.175 + 0.075) = 1.35 / 6 = 0.225.
    (With the edge example in bin 3 it would be 2.25 / 6 = 0.375.)
    """
    probabilities = np.array(
        [[0.9, 0.1], [0.95, 0.05], [0.7, 0.3], [0.35, 0.65], [0.55, 0.45], [0.6, 0.4]]
    )
    labels = np.array([0, 1, 1, 1, 0, 1])
    return probabilities, labels


def test_ece_and_reliability_by_hand():
    probabilities, labels = hand_example()
    assert calibration.expected_calibration_error(probabilities, labels, bins=5) == (
        pytest.approx(0.225, abs=1e-12)
    )
    bins = calibration.reliability(probabilities, labels, bins=5)
    assert bins["bin_lower"] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8], abs=1e-15)
    assert bins["bin_upper"] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0], abs=1e-15)
    assert bins["count"] == [0, 0, 2, 2, 2]
    assert bins["accuracy"] == [None, None, 0.5, 0.5, 0.5]
    assert bins["confidence"][:2] == [None, None]
    assert bins["confidence"][2:] == pytest.approx([0.575, 0.675, 0.925], abs=1e-12)
    assert bins["ece"] == pytest.approx(0.225, abs=1e-12)
    # One bin: |accuracy 3/6 - mean confidence 4.35/6| (1.35/6 again: every bin is
    # half right and over-confident, so no gap cancels another).
    assert calibration.expected_calibration_error(probabilities, labels, bins=1) == (
        pytest.approx(abs(3 / 6 - 4.35 / 6), abs=1e-12)
    )
    assert calibration.expected_calibration_error([[1.0, 0.0]], [0], bins=15) == 0.0
    assert calibration.expected_calibration_error([[1.0, 0.0]], [1], bins=15) == 1.0


def edge_heavy_probabilities(rng, examples, classes, bins):
    """Rows whose largest entry is often exactly a bin edge, 0 or 1.

    Only the largest entry and its index matter to the ECE, so the other
    entries are anything below it (rows need not sum to 1). Labels are right
    with probability about the confidence.
    """
    confidence = rng.random(examples)
    on_edge = rng.random(examples) < 0.4
    confidence[on_edge] = rng.integers(0, bins + 1, on_edge.sum()) / bins
    confidence[:3] = [0.0, 1.0, 1.0]
    predicted = rng.integers(0, classes, examples)
    predicted[0] = 0  # An all-zero row predicts class 0.
    probabilities = confidence[:, None] * rng.random((examples, classes)) * 0.999
    probabilities[np.arange(examples), predicted] = confidence
    wrong = (predicted + rng.integers(1, classes, examples)) % classes
    labels = np.where(rng.random(examples) < confidence, predicted, wrong)
    return probabilities, labels


@pytest.mark.parametrize("bins", [1, 2, 3, 7, 10, 15, 20])
def test_ece_and_bins_match_a_loop_with_edges_zero_and_one(bins):
    rng = np.random.default_rng(bins)
    probabilities, labels = edge_heavy_probabilities(rng, 1500, 4, bins)
    confidences = probabilities.max(axis=1)
    edges = np.arange(bins + 1) / bins
    assert np.isin(edges, confidences).all()  # Every edge, 0 and 1 included, is hit.

    expected = loop_ece(probabilities, labels, bins)
    assert expected > 0
    assert calibration.expected_calibration_error(probabilities, labels, bins) == (
        pytest.approx(expected, rel=1e-12, abs=1e-15)
    )
    members = loop_bins(probabilities, labels, bins)
    record = calibration.reliability(probabilities, labels, bins)
    assert record["count"] == [len(m) for m in members]
    for i, bin_members in enumerate(members):
        if bin_members:
            accuracy = sum(correct for _, correct in bin_members) / len(bin_members)
            confidence = sum(c for c, _ in bin_members) / len(bin_members)
            assert record["accuracy"][i] == pytest.approx(accuracy, rel=1e-12)
            assert record["confidence"][i] == pytest.approx(confidence, rel=1e-12)
    assert record["ece"] == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_ece_counts_edges_in_the_bin_below():
    # Two confidences per edge k/10 (k = 1..10) and two at 0: bin k-1 holds the
    # confidences k/10, bin 0 also the zeros.
    bins = 10
    confidence = np.repeat(np.arange(bins + 1) / bins, 2)
    probabilities = np.stack([confidence, confidence / 2], axis=1)
    record = calibration.reliability(probabilities, np.zeros(len(confidence), np.int64), bins)
    assert record["count"] == [4] + [2] * (bins - 1)
    assert record["confidence"] == pytest.approx(
        [(0 + 0 + 0.1 + 0.1) / 4] + [(k + 1) / bins for k in range(1, bins)]
    )
    # Every prediction is right (class 0): each bin's gap is 1 - its mean confidence.
    expected = sum(2 / 22 * (1 - k / bins) for k in range(1, bins + 1)) + 2 / 22
    assert record["ece"] == pytest.approx(expected, rel=1e-12)


def test_reliability_bins_count_everything_and_empty_bins_are_none():
    rng = np.random.default_rng(3)
    logits = rng.normal(0.0, 1.5, (999, 2))
    probabilities = direct_softmax(logits)
    labels = rng.integers(0, 2, 999)
    record = calibration.reliability(probabilities, labels)  # 15 bins.
    assert sum(record["count"]) == 999
    for key in ("bin_lower", "bin_upper", "count", "accuracy", "confidence"):
        assert len(record[key]) == 15
    # Two classes: every confidence is >= 0.5, so the bins ending below 0.5 are empty.
    empty = [i for i, upper in enumerate(record["bin_upper"]) if upper < 0.5]
    assert empty == list(range(7))
    for i, count in enumerate(record["count"]):
        assert (count == 0) == (i in empty)
        assert (record["accuracy"][i] is None) == (count == 0)
        assert (record["confidence"][i] is None) == (count == 0)
    # Plain Python values: the record goes into JSON as it is.
    assert json.loads(json.dumps(record)) == record
    assert all(type(n) is int for n in record["count"])
    assert type(record["ece"]) is float


# NLL and temperature.


def test_nll_matches_direct_computation():
    rng = np.random.default_rng(4)
    logits = rng.normal(0.0, 3.0, (300, 7)).astype(np.float32)
    labels = rng.integers(0, 7, 300)
    for temperature in [0.5, 1.0, 2.5]:
        expected = float(direct_nll(logits, labels, [temperature])[0])
        assert calibration.negative_log_likelihood(logits, labels, temperature) == (
            pytest.approx(expected, rel=1e-12)
        )
    expected = -np.mean(np.log(direct_softmax(logits)[np.arange(300), labels]))
    assert calibration.negative_log_likelihood(logits, labels) == pytest.approx(expected, rel=1e-12)


def test_nll_and_softmax_of_huge_logits_are_finite_and_exact():
    logits = np.array([[1e4, 0.0, -1e4], [1e4, 0.0, -1e4], [-1e4, 1e4, 1e4]])
    labels = np.array([0, 1, 0])
    # -log softmax: log(1 + e^-1e4 + e^-2e4) = 0 to float precision, then 1e4, then
    # 2e4 + log 2 (two logits tie at 1e4).
    expected = (0.0 + 1e4 + (2e4 + math.log(2))) / 3
    nll = calibration.negative_log_likelihood(logits, labels)
    assert math.isfinite(nll) and nll == pytest.approx(expected, rel=1e-12)
    # At T = 0.05 the logits are 20 times larger; the tie's log 2 is not.
    expected = (0.0 + 2e5 + (4e5 + math.log(2))) / 3
    nll = calibration.negative_log_likelihood(logits, labels, temperature=0.05)
    assert math.isfinite(nll) and nll == pytest.approx(expected, rel=1e-12)
    probabilities = calibration.apply_temperature(logits, 0.05)
    assert np.all(np.isfinite(probabilities))
    np.testing.assert_allclose(probabilities[2], [0.0, 0.5, 0.5], atol=1e-15)


@pytest.mark.parametrize("temperature", [0.05, 0.3, 1.0, 3.0, 20.0])
def test_apply_temperature_is_the_softmax_and_keeps_the_argmax(temperature):
    rng = np.random.default_rng(5)
    logits = rng.normal(0.0, 2.0, (500, 10))
    probabilities = calibration.apply_temperature(logits, temperature)
    np.testing.assert_allclose(probabilities, direct_softmax(logits / temperature), rtol=1e-12)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(probabilities.argmax(axis=1), logits.argmax(axis=1))


@pytest.mark.parametrize(
    "scale, examples",
    [(3.0, 20000), (0.3, 20000), (1.0, 20000)],
    ids=["over-confident", "under-confident", "calibrated"],
)
def test_fit_temperature_recovers_the_scale(scale, examples):
    """The model's logits are scale * z, the labels drawn from softmax(z): T should be `scale`.

    The tolerance is 5 asymptotic standard errors of the maximum-likelihood T
    (about 0.015 * scale for these 20000 examples; 0.035 for the calibrated
    case, inside the 0.05 asked of it).
    """
    rng = np.random.default_rng(int(scale * 10))
    true_logits, labels = sample_calibrated(rng, examples)
    logits = scale * true_logits
    fitted = calibration.fit_temperature(logits, labels)
    error = temperature_standard_error(true_logits, scale)
    assert abs(fitted - scale) < 5 * error
    if scale == 1.0:
        assert abs(fitted - 1.0) < 0.05
    else:
        before = calibration.expected_calibration_error(
            calibration.apply_temperature(logits, 1.0), labels
        )
        after = calibration.expected_calibration_error(
            calibration.apply_temperature(logits, fitted), labels
        )
        assert after < before / 3
        assert after < 0.02  # About the sampling noise of 15 bins of ~1000+ examples.


def grid_cases():
    rng = np.random.default_rng(6)
    for scale in (3.0, 0.3, 1.0):
        true_logits, labels = sample_calibrated(rng, 800, classes=5)
        yield f"scale {scale}", scale * true_logits, labels
    # Every label the largest logit by a margin: the NLL falls as T shrinks, to `low`.
    logits = rng.normal(0.0, 1.0, (300, 5))
    labels = logits.argmax(axis=1)
    logits[np.arange(300), labels] += 3.0
    yield "all right", logits, labels
    # Every label the smallest logit: the NLL falls as T grows, to `high`.
    logits = rng.normal(0.0, 1.0, (300, 5))
    yield "all wrong", logits, logits.argmin(axis=1)


@pytest.mark.parametrize("case", list(grid_cases()), ids=lambda case: case[0])
def test_fit_temperature_matches_a_grid_search(case):
    _, logits, labels = case
    expected = grid_temperature(logits, labels)
    assert calibration.fit_temperature(logits, labels) == pytest.approx(expected, abs=1e-3)


def test_fit_temperature_ends_and_flat_likelihood():
    rng = np.random.default_rng(7)
    logits = rng.normal(0.0, 1.0, (300, 5))
    right, wrong = logits.argmax(axis=1), logits.argmin(axis=1)
    logits[np.arange(300), right] += 3.0
    assert calibration.fit_temperature(logits, right, low=0.1, high=5.0) == 0.1
    assert calibration.fit_temperature(logits, wrong, low=0.1, high=5.0) == 5.0
    # Equal logits in every row: T changes nothing, and 1 is returned.
    constant = np.repeat(rng.normal(size=(50, 1)), 4, axis=1)
    assert calibration.fit_temperature(constant, rng.integers(0, 4, 50)) == 1.0


def test_calibration_record_matches_references():
    rng = np.random.default_rng(8)
    true_logits, labels = sample_calibrated(rng, 2000, classes=5)
    logits = 2.0 * true_logits
    record = calibration.calibration_record(logits, labels, temperature=2.0, bins=12)
    assert record["temperature"] == 2.0
    assert record["nll"] == pytest.approx(float(direct_nll(logits, labels, [2.0])[0]), rel=1e-12)
    expected_ece = loop_ece(direct_softmax(logits / 2.0), labels, 12)
    assert record["ece"] == pytest.approx(expected_ece, rel=1e-9)
    assert record["reliability"]["ece"] == record["ece"]
    assert len(record["reliability"]["count"]) == 12
    assert json.loads(json.dumps(record)) == record


# Bad input.


GOOD_LOGITS = np.zeros((4, 3))
GOOD_LABELS = np.array([0, 1, 2, 0])


@pytest.mark.parametrize(
    "logits, labels, message, about_logits",
    [
        (np.zeros((0, 3)), np.zeros(0, np.int64), "empty", True),
        (np.zeros((4, 0)), GOOD_LABELS, "empty", True),
        (np.zeros(4), GOOD_LABELS, r"\[examples, classes\]", True),
        (np.array([[0.0, np.nan, 1.0]] * 4), GOOD_LABELS, "non-finite", True),
        (np.array([[0.0, np.inf, 1.0]] * 4), GOOD_LABELS, "non-finite", True),
        (GOOD_LOGITS, np.array([0, 1, 2]), r"labels must have shape \(4,\)", False),
        (GOOD_LOGITS, GOOD_LABELS[:, None], r"labels must have shape \(4,\)", False),
        (GOOD_LOGITS, np.array([0, 1, 3, 0]), r"outside \[0, 3\)", False),
        (GOOD_LOGITS, np.array([0, -1, 2, 0]), r"outside \[0, 3\)", False),
        (GOOD_LOGITS, np.array([0.0, 1.0, 2.0, 0.0]), "integer class ids", False),
    ],
)
def test_bad_logits_or_labels_raise(logits, labels, message, about_logits):
    for function in (
        calibration.negative_log_likelihood,
        calibration.fit_temperature,
        calibration.calibration_record,
    ):
        with pytest.raises(ValueError, match=message):
            function(logits, labels)
    if about_logits:  # apply_temperature takes no labels.
        with pytest.raises(ValueError, match=message):
            calibration.apply_temperature(logits, 1.0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: calibration.negative_log_likelihood(GOOD_LOGITS, GOOD_LABELS, 0.0), "> 0"),
        (lambda: calibration.apply_temperature(GOOD_LOGITS, -1.0), "> 0"),
        (lambda: calibration.apply_temperature(GOOD_LOGITS, float("nan")), "> 0"),
        (lambda: calibration.fit_temperature(GOOD_LOGITS, GOOD_LABELS, low=0.0), "0 < low"),
        (lambda: calibration.fit_temperature(GOOD_LOGITS, GOOD_LABELS, 2.0, 1.0), "0 < low"),
        (lambda: calibration.fit_temperature(GOOD_LOGITS, GOOD_LABELS, tolerance=0), "toler"),
        (lambda: calibration.expected_calibration_error(GOOD_LOGITS, GOOD_LABELS, 0), "bins"),
        (lambda: calibration.reliability(GOOD_LOGITS, GOOD_LABELS, 2.5), "bins"),
        (lambda: calibration.calibration_record(GOOD_LOGITS, GOOD_LABELS, bins=0), "bins"),
        (
            lambda: calibration.expected_calibration_error(GOOD_LOGITS + 1.5, GOOD_LABELS),
            r"\[0, 1\]",
        ),
        (lambda: calibration.reliability(GOOD_LOGITS - 0.1, GOOD_LABELS), r"\[0, 1\]"),
        (lambda: calibration.reliability(np.zeros((0, 3)), np.zeros(0, int)), "empty"),
        (lambda: calibration.expected_calibration_error(GOOD_LOGITS, GOOD_LABELS[:2]), "shape"),
    ],
)
def test_bad_settings_and_probabilities_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# The reliability diagram.


def test_plot_reliability_writes_a_png(tmp_path):
    probabilities, labels = hand_example()
    record = calibration.reliability(probabilities, labels, bins=5)
    path = tmp_path / "reliability.png"
    written = reliability_plot.plot_reliability(record, str(path), title="ckpt-4 on $test")
    if not HAVE_MATPLOTLIB:
        assert written is False and not path.exists()
        return
    from matplotlib import image as mpimg

    assert written is True
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert mpimg.imread(path).ndim == 3
    assert os.listdir(tmp_path) == ["reliability.png"]  # No temporary file left.
    figure = reliability_plot.draw_reliability(record, "ckpt-4 on $test")
    top = figure.axes[0]
    accuracy_bars = top.containers[0]
    assert [bar.get_height() for bar in accuracy_bars] == pytest.approx([0.5, 0.5, 0.5])
    assert [bar.get_x() + bar.get_width() / 2 for bar in accuracy_bars] == pytest.approx(
        [0.5, 0.7, 0.9]
    )
    assert top.get_title().startswith(r"ckpt-4 on \$test" + "\nECE 22.50%")


def test_plot_reliability_without_matplotlib_warns_and_leaves_no_stale_picture(
    tmp_path, monkeypatch, caplog
):
    path = tmp_path / "reliability.png"
    path.write_bytes(b"an older picture")
    # None in sys.modules makes an import fail, as if matplotlib were not installed.
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    probabilities, labels = hand_example()
    record = calibration.reliability(probabilities, labels, bins=5)
    assert reliability_plot.plot_reliability(record, str(path)) is False
    assert not path.exists()
    assert any(
        "needs matplotlib" in r.getMessage() for r in caplog.records if r.levelname == "WARNING"
    )


# The run's temperature.json: written whole, read back, refused when damaged.


def fit_record(**changes):
    record = {
        "temperature": 1.75,
        "checkpoint": "ckpt-4",
        "step": 4,
        "weights": "raw",
        "split": "holdout",
        "num_examples": 16,
        "nll_before": 2.5,
        "nll_after": 2.25,
        "ece_before": 0.2,
        "ece_after": 0.05,
    }
    return {**record, **changes}


def test_temperature_is_one_without_a_file_and_reads_back_what_was_saved(tmp_path):
    assert calibration.read_temperature(str(tmp_path)) == 1.0
    assert calibration.read_temperature_record(str(tmp_path)) is None
    path = calibration.save_temperature(str(tmp_path), fit_record())
    assert path == str(tmp_path / "temperature.json")
    assert os.listdir(tmp_path) == ["temperature.json"]  # No temporary file left behind.
    with open(path) as f:
        assert json.load(f) == fit_record()
    assert calibration.read_temperature(str(tmp_path)) == 1.75
    assert calibration.read_temperature_record(str(tmp_path)) == fit_record()
    calibration.save_temperature(str(tmp_path), fit_record(temperature=0.5))  # Replaced whole.
    assert calibration.read_temperature(str(tmp_path)) == 0.5


@pytest.mark.parametrize(
    "record, message",
    [
        ({"checkpoint": "ckpt-4"}, "needs temperature, step, weights, split"),
        (fit_record(temperature=0.0), "temperature must be finite and > 0"),
        (fit_record(temperature=math.inf), "temperature must be finite and > 0"),
    ],
)
def test_save_temperature_refuses_an_incomplete_or_bad_record(tmp_path, record, message):
    with pytest.raises(ValueError, match=message):
        calibration.save_temperature(str(tmp_path), record)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "text, reason",
    [
        ('{"temperature": 1.5', "JSONDecodeError"),
        ("[1.5]", "TypeError"),
        ('{"checkpoint": "ckpt-4"}', "KeyError"),
        ('{"temperature": -2}', "temperature must be finite and > 0"),
        ('{"temperature": NaN}', "temperature must be finite and > 0"),
        ('{"temperature": "1.5"}', "is not a number"),
        ('{"temperature": true}', "is not a number"),
    ],
)
def test_a_damaged_temperature_file_is_one_line_naming_it_and_the_fix(tmp_path, text, reason):
    from resnet_app.common.errors import ConfigError

    path = tmp_path / "temperature.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        calibration.read_temperature(str(tmp_path))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{path} is damaged (") and reason in message
    assert message.endswith(f"--model_dir={tmp_path} --fit_temperature")
