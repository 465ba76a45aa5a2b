"""The evaluation report of multi-label data: mAP, F1 and each class's average precision.

`python -m resnet_app.evaluate` on a multi-label run writes
`REPORT_ROOT/<checkpoint>-<split>/eval_results.json`: the evaluation record
(map, f1_micro, f1_macro, threshold, ...), then per class {id, name,
positives, average_precision, f1} (null for a class without positives, or
for F1 without positives and predictions). There is no confusion matrix: an
image may be right about some classes and wrong about others.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import logging

from resnet_app.common import files
from resnet_app.engine import label_metrics
from resnet_app.evaluation.reports import RESULTS_FILE, to_json


def _number(value: float) -> float | None:
    return None if np.isnan(value) else float(value)


def build_report(
    record: dict[str, Any],
    scores: np.ndarray,
    labels: np.ndarray,
    class_names: Sequence[str],
    threshold: float,
) -> dict[str, Any]:
    """The contents of `eval_results.json`: the record, then "classes"."""
    average_precision = label_metrics.average_precision(scores, labels)
    _, _, f1 = label_metrics.f1_scores(scores, labels, threshold)
    positives = (np.asarray(labels) > 0.5).sum(axis=0)
    classes = [
        {
            "id": class_id,
            "name": name,
            "positives": int(positives[class_id]),
            "average_precision": _number(average_precision[class_id]),
            "f1": _number(f1[class_id]),
        }
        for class_id, name in enumerate(class_names)
    ]
    return {**record, "classes": classes}


def write_report(
    directory: str,
    record: dict[str, Any],
    scores: np.ndarray,
    labels: np.ndarray,
    class_names: Sequence[str],
    threshold: float,
) -> dict[str, Any]:
    """Writes `eval_results.json` atomically; returns the report."""
    os.makedirs(directory, exist_ok=True)
    report = build_report(record, scores, labels, class_names, threshold)
    files.write_text_atomically(os.path.join(directory, RESULTS_FILE), to_json(report))
    return report


def log_summary(report: dict[str, Any], worst: int = 5) -> None:
    """Logs the classes with the lowest average precision."""
    measured = [c for c in report["classes"] if c["average_precision"] is not None]
    measured.sort(key=lambda c: (c["average_precision"], -c["positives"], c["id"]))
    listed = ", ".join(
        f"{c['name']} {c['average_precision']:.3f} ({c['positives']} positives)"
        for c in measured[:worst]
    )
    logging.info(
        "Per-class average precision of %s on %s, worst first: %s",
        report["checkpoint"],
        report["split"],
        listed or "no positives",
    )
