"""An evaluation report: per-class accuracy, the confusion matrix, calibration, pictures.

`python -m resnet_app.evaluate` writes one directory per checkpoint and split,
`REPORT_ROOT/<checkpoint>-<split>[-<tta>][-ema]/`, holding

- `eval_results.json`: the evaluation record, then per class {id, name,
  examples, correct, accuracy, recall} (null without examples), the confusion
  matrix (rows: true class, columns: predicted), the most-confused pairs and
  the reliability bins (`evaluation/calibration.py`); for multi-label data,
  per class {id, name, positives, average_precision, f1} and no matrix;
- `confusion_matrix.png` and `reliability.png`, with matplotlib
  (requirements-plot.txt; without it a warning says so).

Files are written atomically: a reader sees the previous report or the new one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import logging

from resnet_app.common import files
from resnet_app.common.metrics import json_text
from resnet_app.engine import label_metrics
from resnet_app.engine.exact_eval import per_class_accuracy
from resnet_app.evaluation import reliability_plot

Record = dict[str, Any]
RESULTS_FILE = "eval_results.json"
PICTURE_FILE = "confusion_matrix.png"
RELIABILITY_FILE = "reliability.png"
AXES_NOTE = "rows: true class, columns: predicted class, both in class-id order"
MOST_CONFUSED = 10
MAX_NAMED_CLASSES = 50  # Beyond, the picture has no tick labels.
MAX_COUNTED_CLASSES = 20  # Beyond, the cells are too small for their counts.


def report_name(checkpoint: str, split: str, tta: str | None = None, weights: str = "raw") -> str:
    """The report directory's name, e.g. `ckpt-4-test`, `ckpt-4-test-flip`, `ckpt-4-test-ema`."""
    parts = [checkpoint, split, *([tta] if tta else []), *(["ema"] if weights == "ema" else [])]
    return "-".join(parts)


def most_confused(
    confusion: np.ndarray, class_names: Sequence[str], count: int = MOST_CONFUSED
) -> list[dict[str, Any]]:
    """The `count` largest off-diagonal cells of a confusion matrix (rows: true class), as
    {true_id, true_name, predicted_id, predicted_name, count}; ties in class-id order."""
    off_diagonal = confusion.copy()
    np.fill_diagonal(off_diagonal, 0)
    true_ids, predicted_ids = np.nonzero(off_diagonal)
    counts = off_diagonal[true_ids, predicted_ids]
    # nonzero() lists cells in row-major order; a stable sort keeps it for ties.
    order = np.argsort(-counts, kind="stable")[:count]
    return [
        {
            "true_id": int(true_ids[i]),
            "true_name": class_names[true_ids[i]],
            "predicted_id": int(predicted_ids[i]),
            "predicted_name": class_names[predicted_ids[i]],
            "count": int(counts[i]),
        }
        for i in order
    ]


def build_report(
    record: Record, confusion: np.ndarray, class_names: Sequence[str], reliability=None
) -> Record:
    """The contents of `eval_results.json`: the record, then "classes", the confusion matrix,
    "most_confused" and, with `calibration.reliability`'s bins, one row per bin."""
    if confusion.shape != (len(class_names), len(class_names)):
        raise ValueError(f"a {confusion.shape} confusion matrix for {len(class_names)} classes")
    examples = confusion.sum(axis=1)
    correct = np.diagonal(confusion)
    accuracy = per_class_accuracy(confusion)
    classes = [
        {
            "id": class_id,
            "name": name,
            "examples": int(examples[class_id]),
            "correct": int(correct[class_id]),
            "accuracy": None if examples[class_id] == 0 else float(accuracy[class_id]),
            # The same number under its name for imbalanced data: the class's recall.
            "recall": None if examples[class_id] == 0 else float(accuracy[class_id]),
        }
        for class_id, name in enumerate(class_names)
    ]
    report = {
        **record,
        "classes": classes,
        "confusion_matrix_axes": AXES_NOTE,
        "confusion_matrix": confusion.astype(int).tolist(),
        "most_confused": most_confused(confusion, class_names),
    }
    if reliability is not None:  # One line per bin in the JSON file.
        columns = ("bin_lower", "bin_upper", "count", "accuracy", "confidence")
        names = ("lower", "upper", "count", "accuracy", "confidence")
        report["reliability"] = [
            {"bin": index, **dict(zip(names, row))}
            for index, row in enumerate(zip(*(reliability[key] for key in columns)))
        ]
    return report


def to_json(report: dict[str, Any]) -> str:
    """JSON with one line per key, and one line per item of a list.

    A per-class entry or a matrix row stays on one line: 1000 classes make
    1000 readable lines, not a million lines of one number each.
    """
    entries = []
    for key, value in report.items():
        if isinstance(value, list) and value:
            items = ",\n".join(f"    {json_text(item)}" for item in value)
            entries.append(f"  {json_text(key)}: [\n{items}\n  ]")
        else:
            entries.append(f"  {json_text(key)}: {json_text(value)}")
    return "{\n" + ",\n".join(entries) + "\n}\n"


def plot_confusion(confusion: np.ndarray, class_names: Sequence[str], title: str):
    """The confusion matrix as a figure, rows normalized (ImportError without matplotlib).

    Class names label the axes up to `MAX_NAMED_CLASSES` classes, and counts
    fill the cells up to `MAX_COUNTED_CLASSES`. The figure has an Agg canvas
    and is not registered with pyplot (nothing global to close).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    num_classes = len(class_names)
    examples = confusion.sum(axis=1, keepdims=True)
    fractions = confusion / np.maximum(examples, 1)
    named = num_classes <= MAX_NAMED_CLASSES
    size = min(max(6.0, 2.5 + 0.3 * num_classes), 18.0) if named else 12.0
    figure = Figure(figsize=(size, size * 0.9), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    # With more cells than pixels, nearest-neighbour sampling would drop whole
    # classes; antialiasing averages them instead.
    interpolation = "nearest" if named else "antialiased"
    image = axes.imshow(fractions, cmap="Blues", vmin=0.0, vmax=1.0, interpolation=interpolation)
    figure.colorbar(image, ax=axes, shrink=0.8, label="fraction of the true class")
    axes.set_xlabel("predicted class")
    axes.set_ylabel("true class")
    if named:
        ticks = np.arange(num_classes)
        # Folder names may hold "$", which matplotlib would read as math.
        labels = [str(name).replace("$", r"\$") for name in class_names]
        axes.set_xticks(ticks, labels=labels, rotation=90)
        axes.set_yticks(ticks, labels=labels)
        axes.set_title(title)
    else:
        axes.set_xticks([])
        axes.set_yticks([])
        axes.set_title(
            f"{title}\n{num_classes} classes: names left out (see {RESULTS_FILE}); "
            "class ids run left to right, top to bottom"
        )
    if num_classes <= MAX_COUNTED_CLASSES:
        for true_id, predicted_id in zip(*np.nonzero(confusion)):
            count = str(int(confusion[true_id, predicted_id]))
            color = "white" if fractions[true_id, predicted_id] > 0.5 else "black"
            axes.text(
                predicted_id, true_id, count, ha="center", va="center", fontsize=8, color=color
            )
    return figure


def owner(directory: str) -> str | None:
    """The run directory whose report `directory` holds, if it holds one that says."""
    try:
        with open(os.path.join(directory, RESULTS_FILE)) as f:
            found = json.load(f).get("model_dir")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def _remove_stale(path: str) -> None:
    """An older run's picture would disagree with the new numbers."""
    if os.path.exists(path):
        os.remove(path)


def write_report(
    directory: str, record: Record, confusion, class_names, reliability=None
) -> Record:
    """Writes `build_report`'s `eval_results.json` into `directory` and, with matplotlib,
    the confusion and reliability pictures (a stale one is removed); the report."""
    os.makedirs(directory, exist_ok=True)
    report = build_report(record, confusion, class_names, reliability)
    text = to_json(report)
    files.write_text_atomically(os.path.join(directory, RESULTS_FILE), text)
    title = f"{record['checkpoint']} (step {record['step']}) on {record['split']}"
    if record.get("tta"):
        title += f", {record['tta']} averaged"
    picture = os.path.join(directory, PICTURE_FILE)
    try:
        heading = f"{title}: top-1 {record['top1']:.2%} of {record['num_examples']} examples"
        figure = plot_confusion(confusion, class_names, heading)
        files.save_figure(figure, picture)
    except ImportError:
        # No matplotlib: neither picture, and one warning for both.
        skipped = [PICTURE_FILE] + ([RELIABILITY_FILE] if reliability is not None else [])
        for name in (PICTURE_FILE, RELIABILITY_FILE):
            _remove_stale(os.path.join(directory, name))
        logging.warning(
            "Skipped %s: it needs matplotlib (pip install -r requirements-plot.txt); %s is written",
            " and ".join(skipped),
            RESULTS_FILE,
        )
        return report
    except Exception as error:  # noqa: BLE001 - the picture is optional, the numbers are not.
        _remove_stale(picture)
        logging.warning("Could not draw %s (%s); %s is written", PICTURE_FILE, error, RESULTS_FILE)
    _write_reliability(os.path.join(directory, RELIABILITY_FILE), reliability, title)
    return report


def _write_reliability(path: str, reliability: dict[str, Any] | None, title: str) -> None:
    """The reliability diagram, or no file (never a stale one) when it cannot be drawn."""
    if reliability is None:
        _remove_stale(path)
        return
    try:
        reliability_plot.plot_reliability(reliability, path, title)
    except Exception as error:  # noqa: BLE001 - the picture is optional, the numbers are not.
        _remove_stale(path)
        logging.warning(
            "Could not draw %s (%s); %s is written", RELIABILITY_FILE, error, RESULTS_FILE
        )


def write_multi_label_report(
    directory: str, record: Record, scores, labels, class_names, threshold: float
) -> Record:
    """Writes a multi-label evaluation's `eval_results.json`: the record, then "classes"."""
    average_precision = label_metrics.average_precision(scores, labels)
    _, _, f1 = label_metrics.f1_scores(scores, labels, threshold)
    positives = (np.asarray(labels) > 0.5).sum(axis=0)
    classes = [
        {
            "id": class_id,
            "name": name,
            "positives": int(positives[class_id]),
            "average_precision": None if np.isnan(ap) else float(ap),
            "f1": None if np.isnan(f1[class_id]) else float(f1[class_id]),
        }
        for class_id, (name, ap) in enumerate(zip(class_names, average_precision))
    ]
    report = {**record, "classes": classes}
    os.makedirs(directory, exist_ok=True)
    files.write_text_atomically(os.path.join(directory, RESULTS_FILE), to_json(report))
    return report


def log_summary(report: Record, worst: int = 5) -> None:
    """Logs the classes with the lowest accuracy (multi-label: average precision), and the
    most-confused pair."""
    multi = "confusion_matrix" not in report
    key, count = ("average_precision", "positives") if multi else ("accuracy", "examples")
    measured = [c for c in report["classes"] if c[key] is not None]
    measured.sort(key=lambda c: (c[key], -c[count], c["id"]))
    if multi:
        shown = [f"{c['name']} {c[key]:.3f} ({c['positives']} positives)" for c in measured]
    else:
        shown = [f"{c['name']} {c[key]:.1%} ({c['correct']}/{c['examples']})" for c in measured]
    empty = len(report["classes"]) - len(measured)
    logging.info(
        "Per-class %s of %s on %s, worst first: %s%s",
        "average precision" if multi else "accuracy",
        report["checkpoint"],
        report["split"],
        ", ".join(shown[:worst]) or f"no {count}",
        f"; classes without examples: {empty}" if empty and not multi else "",
    )
    if report.get("most_confused"):
        pair = report["most_confused"][0]
        logging.info(
            "Most confused: %s taken for %s %d times",
            pair["true_name"],
            pair["predicted_name"],
            pair["count"],
        )
