"""Calibration: how far a classifier's confidence is from its accuracy, and a fix for it.

Guo et al. 2017, "On Calibration of Modern Neural Networks": the expected
calibration error over equal-width confidence bins (`reliability` gives the
bins), the negative log-likelihood, and temperature scaling, the T > 0 that
minimizes the NLL of softmax(logits / T) on held-out examples (it never
changes the argmax, only the confidence). A run's fitted temperature lives in
its `temperature.json`. Pure NumPy, no SciPy.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np
from absl import logging

from resnet_app.common import files, run_dir

DEFAULT_BINS = 15  # Guo et al. 2017.
# What temperature.json holds: the fit's checkpoint ("weights" "ema" or "raw"; a file from
# before EMA has none: raw) and split, and the NLL and ECE before and after scaling.
TEMPERATURE_FIELDS = (
    *("temperature", "checkpoint", "step", "weights", "split", "num_examples"),
    *("nll_before", "nll_after", "ece_before", "ece_after"),
)
# Probabilities computed in float32 may exceed 1 by a rounding error; more is a mistake.
PROBABILITY_SLACK = 1e-6


def _check_bins(bins: int) -> int:
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1:
        raise ValueError(f"bins must be a positive integer, got {bins!r}")
    return int(bins)


def _check_temperature(temperature: float) -> float:
    temperature = float(temperature)
    if not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be finite and > 0, got {temperature}")
    return temperature


def _check_scores(scores: Any, name: str) -> np.ndarray:
    """`scores` as a finite, non-empty [examples, classes] float64 array."""
    scores = np.asarray(scores)
    if scores.ndim != 2:
        raise ValueError(f"{name} must be [examples, classes], got shape {scores.shape}")
    if scores.shape[0] == 0 or scores.shape[1] == 0:
        raise ValueError(f"{name} is empty: shape {scores.shape}")
    if not (np.issubdtype(scores.dtype, np.floating) or np.issubdtype(scores.dtype, np.integer)):
        raise ValueError(f"{name} must be numbers, got dtype {scores.dtype}")
    scores = scores.astype(np.float64)
    if not np.all(np.isfinite(scores)):
        bad = int(np.count_nonzero(~np.isfinite(scores)))
        raise ValueError(f"{name} holds {bad} non-finite values (NaN or infinity)")
    return scores


def _check_labels(labels: Any, num_examples: int, num_classes: int) -> np.ndarray:
    """`labels` as an int64 [examples] array of class ids in [0, num_classes)."""
    labels = np.asarray(labels)
    if labels.shape != (num_examples,):
        raise ValueError(f"labels must have shape ({num_examples},), got {labels.shape}")
    if labels.dtype == bool or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integer class ids, got dtype {labels.dtype}")
    outside = (labels < 0) | (labels >= num_classes)
    if np.any(outside):
        raise ValueError(
            f"{int(np.count_nonzero(outside))} labels are outside [0, {num_classes}), "
            f"e.g. {int(labels[outside][0])}"
        )
    return labels.astype(np.int64)


def _check_examples(scores: Any, labels: Any, name: str = "logits") -> tuple[np.ndarray, ...]:
    """`_check_scores` and `_check_labels`; probabilities must also lie in [0, 1]."""
    scores = _check_scores(scores, name)
    if name == "probabilities":
        if np.any(scores < 0) or np.any(scores > 1 + PROBABILITY_SLACK):
            raise ValueError(
                f"probabilities must lie in [0, 1], got values in [{scores.min()}, {scores.max()}]"
            )
        scores = np.minimum(scores, 1.0)
    return scores, _check_labels(labels, *scores.shape)


def expected_calibration_error(
    probabilities: np.ndarray, labels: np.ndarray, bins: int = DEFAULT_BINS
) -> float:
    """The ECE: sum over bins b of |b| / N * |accuracy(b) - mean confidence(b)|.

    The confidence is an example's largest probability (rows need not sum to
    1), the prediction its index (the first on a tie); bin i of B holds
    confidences in (i/B, (i+1)/B], the first also 0.

    Raises:
      ValueError: for empty or mis-shaped input, non-finite values,
        probabilities outside [0, 1], labels out of range or bins < 1.
    """
    return reliability(probabilities, labels, bins)["ece"]


def reliability(
    probabilities: np.ndarray, labels: np.ndarray, bins: int = DEFAULT_BINS
) -> dict[str, Any]:
    """The reliability diagram's numbers, JSON-ready: per-bin lists "bin_lower", "bin_upper",
    "count", "accuracy" and "confidence" (None for an empty bin), and the "ece".

    Raises:
      ValueError: as `expected_calibration_error`.
    """
    bins = _check_bins(bins)
    probabilities, labels = _check_examples(probabilities, labels, "probabilities")
    confidence = probabilities.max(axis=1)
    correct = probabilities.argmax(axis=1) == labels
    # Edges i / B, each correctly rounded; searchsorted(side="left") puts a
    # confidence equal to an edge in the bin below it: bins are (lower, upper].
    edges = np.arange(bins + 1) / bins
    index = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, bins - 1)
    count = np.bincount(index, minlength=bins)
    hits = np.bincount(index, weights=correct.astype(np.float64), minlength=bins)
    confidence_sum = np.bincount(index, weights=confidence, minlength=bins)
    filled = count > 0
    return {
        "bin_lower": [float(edge) for edge in edges[:-1]],
        "bin_upper": [float(edge) for edge in edges[1:]],
        "count": [int(n) for n in count],
        "accuracy": [float(h / n) if full else None for h, n, full in zip(hits, count, filled)],
        "confidence": [
            float(s / n) if full else None for s, n, full in zip(confidence_sum, count, filled)
        ],
        # |B|/N * |acc - conf| = |hits - sum of confidences| / N: no division by an empty bin.
        "ece": float(np.sum(np.abs(hits - confidence_sum)) / np.sum(count)),
    }


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, through log-sum-exp: finite for any finite logits."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def softmax(logits: np.ndarray) -> np.ndarray:
    """softmax over the last axis, shifted by the largest logit (no overflow)."""
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def negative_log_likelihood(
    logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0
) -> float:
    """The mean -log softmax(logits / T)[label], in float64 through log-sum-exp (finite for
    any finite logits).

    Raises:
      ValueError: for empty or mis-shaped input, non-finite logits, labels
        out of range or a temperature that is not finite and positive.
    """
    temperature = _check_temperature(temperature)
    logits, labels = _check_examples(logits, labels)
    log_probabilities = log_softmax(logits / temperature)
    return float(-np.mean(log_probabilities[np.arange(len(labels)), labels]))


def _nll_slope(logits: np.ndarray, labels: np.ndarray, beta: float) -> float:
    """d NLL(softmax(beta * z)) / d beta = mean of E_softmax(beta z)[z] - z_label.

    Non-decreasing in beta: its derivative is the mean variance of z under
    softmax(beta * z).
    """
    probabilities = softmax(beta * logits)
    expected = np.sum(probabilities * logits, axis=1)
    return float(np.mean(expected - logits[np.arange(len(labels)), labels]))


def fit_temperature(
    logits: np.ndarray,
    labels: np.ndarray,
    low: float = 0.05,
    high: float = 20.0,
    tolerance: float = 1e-6,
) -> float:
    """Temperature scaling: the T in [low, high] minimizing the NLL of softmax(logits / T).

    The NLL of softmax(beta * z) is convex in beta = 1/T, so the minimum is
    where its derivative changes sign, bisected until the bracket of T is
    `tolerance` narrow. Without a sign change the minimum is an end of the
    interval (returned with a warning); when no example's logits differ, T
    does not matter and 1 is returned (clipped into the interval). Fit on
    held-out examples: the network is over-confident on its training set.

    Raises:
      ValueError: for empty or mis-shaped input, non-finite logits, labels
        out of range, or not 0 < low < high, or tolerance <= 0.
    """
    low, high, tolerance = float(low), float(high), float(tolerance)
    if not (math.isfinite(low) and math.isfinite(high) and 0 < low < high):
        raise ValueError(f"the temperature interval needs 0 < low < high, got [{low}, {high}]")
    if not (math.isfinite(tolerance) and tolerance > 0):
        raise ValueError(f"tolerance must be finite and > 0, got {tolerance}")
    logits, labels = _check_examples(logits, labels)

    beta_low, beta_high = 1.0 / high, 1.0 / low
    slope_low = _nll_slope(logits, labels, beta_low)
    slope_high = _nll_slope(logits, labels, beta_high)
    if slope_high <= slope_low:
        # A non-decreasing slope that does not increase: every row's logits are
        # equal (softmax is uniform at any beta), so T changes nothing.
        temperature = min(max(1.0, low), high)
        logging.warning(
            "The NLL does not depend on the temperature (no example's logits differ); returning %g",
            temperature,
        )
        return temperature
    if slope_low >= 0 or slope_high <= 0:
        temperature = high if slope_low >= 0 else low
        logging.warning(
            "The NLL keeps falling to the end of [%g, %g]; returning T=%g", low, high, temperature
        )
        return temperature
    beta = _zero_of_slope(logits, labels, beta_low, beta_high, tolerance)
    temperature = min(max(1.0 / beta, low), high)
    logging.info(
        "Fitted temperature %.4f on %d examples: NLL %.4f at T=1, %.4f at T=%.4f",
        temperature,
        len(labels),
        negative_log_likelihood(logits, labels),
        negative_log_likelihood(logits, labels, temperature),
        temperature,
    )
    return temperature


def _zero_of_slope(
    logits: np.ndarray, labels: np.ndarray, beta_low: float, beta_high: float, tolerance: float
) -> float:
    """The beta where the NLL's slope crosses 0 (slope(low) < 0 < slope(high)), bisected."""
    while 1.0 / beta_low - 1.0 / beta_high > tolerance:
        middle = 0.5 * (beta_low + beta_high)
        if not beta_low < middle < beta_high:
            break  # Neighbouring floats: the tolerance is below float64 precision.
        slope = _nll_slope(logits, labels, middle)
        if slope == 0:
            return middle
        if slope < 0:
            beta_low = middle
        else:
            beta_high = middle
    return 0.5 * (beta_low + beta_high)


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits / temperature) in float64, stable for any finite logits.

    Raises:
      ValueError: for empty or mis-shaped or non-finite logits, or a
        temperature that is not finite and positive.
    """
    temperature = _check_temperature(temperature)
    logits = _check_scores(logits, "logits")
    return softmax(logits / temperature)


def calibration_record(
    logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0, bins: int = DEFAULT_BINS
) -> dict[str, Any]:
    """The calibration of softmax(logits / temperature), JSON-ready: "temperature", "nll",
    "ece" and "reliability" (`reliability`'s bins)."""
    temperature = _check_temperature(temperature)  # The others are checked where they are used.
    bins_record = reliability(apply_temperature(logits, temperature), labels, bins)
    return {
        "temperature": temperature,
        "nll": negative_log_likelihood(logits, labels, temperature),
        "ece": bins_record["ece"],
        "reliability": bins_record,
    }


def save_temperature(model_dir: str, record: dict[str, Any]) -> str:
    """Writes `record` (`TEMPERATURE_FIELDS` at least) to the run's `temperature.json`,
    atomically; its path. ValueError for a missing field or a bad temperature."""
    missing = [field for field in TEMPERATURE_FIELDS if field not in record]
    if missing:
        raise ValueError(f"a temperature record needs {', '.join(missing)}")
    _check_temperature(record["temperature"])
    path = run_dir.temperature_path(model_dir)
    files.write_text_atomically(path, json.dumps(record, indent=1) + "\n")
    return path


def read_temperature_record(model_dir: str) -> dict[str, Any] | None:
    """The run's `temperature.json`, or None; ConfigError (naming the fix) if it is damaged."""
    path = run_dir.temperature_path(model_dir)
    if not os.path.exists(path):
        return None

    def parse(record: dict[str, Any]) -> dict[str, Any]:
        value = record["temperature"]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"temperature {value!r} is not a number")
        record["temperature"] = _check_temperature(value)
        return record

    remedy = f"rerun python -m resnet_app.evaluate --model_dir={model_dir} --fit_temperature"
    return run_dir.read_json(path, parse, remedy)


def warn_if_fitted_elsewhere(fitted: dict[str, Any] | None, prefix: str, weights: str) -> None:
    """A temperature fitted on another checkpoint (or its other weights) may not suit: say so."""
    name = os.path.basename(prefix)
    if fitted is None:
        return
    fitted_weights = fitted.get("weights", "raw")  # Records from before EMA have none.
    if fitted.get("checkpoint") != name:
        where = f"was fitted on {fitted.get('checkpoint')}, not {name}"
    elif fitted_weights != weights:
        where = f"was fitted on {name}'s {fitted_weights} weights, not its {weights} weights"
    else:
        return
    logging.warning(
        "The run's temperature %.4f %s; rerun --fit_temperature with --checkpoint=%s "
        "--weights=%s to fit this one",
        fitted["temperature"],
        where,
        name,
        weights,
    )


def read_temperature(model_dir: str) -> float:
    """The temperature fitted for the run (`evaluate --fit_temperature`); 1.0 when none was."""
    record = read_temperature_record(model_dir)
    return 1.0 if record is None else record["temperature"]
