"""An evaluation report: per-class accuracy, the confusion matrix, calibration, pictures.

`python -m resnet_app.evaluate` writes one report directory per checkpoint and
split, `REPORT_ROOT/<checkpoint>-<split>/` (e.g. `ckpt-4000-validation/`; with
test-time augmentation `<checkpoint>-<split>-<tta>/`, e.g. `ckpt-4000-validation-flip/`),
holding

- `eval_results.json`: the evaluation record (checkpoint, step, split,
  num_examples, top1, top5, loss, tta, ece, nll, ...), then per class {id,
  name, examples, correct, accuracy, recall} (accuracy, the class's recall,
  null for a class without examples), the confusion matrix (rows = true class, columns = predicted
  class, in class-id order), the most-confused pairs (the largest
  off-diagonal cells) and the reliability bins: per confidence bin {bin,
  lower, upper, count, accuracy, confidence} (accuracy and mean confidence
  null for an empty bin; `evaluation/calibration.py`);
- `confusion_matrix.png`: the matrix, rows normalized for the colour, with
  class names on the axes and counts in the cells when there are few classes;
- `reliability.png`: the reliability diagram of the same bins (accuracy per
  bin against the diagonal, the histogram of confidences below).

The pictures need matplotlib (`pip install -r requirements-plot.txt`);
without it the JSON is still written and a warning says so.

Files are written atomically: a reader sees the previous report or the new
one, never half a file.
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
from resnet_app.engine.exact_eval import per_class_accuracy
from resnet_app.evaluation import reliability_plot

RESULTS_FILE = "eval_results.json"
PICTURE_FILE = "confusion_matrix.png"
RELIABILITY_FILE = "reliability.png"
AXES_NOTE = "rows: true class, columns: predicted class, both in class-id order"
MOST_CONFUSED = 10
# Beyond this many classes the picture has no tick labels (1000 names do not fit).
MAX_NAMED_CLASSES = 50
# Beyond this many classes the cells are too small for their counts.
MAX_COUNTED_CLASSES = 20


def report_name(checkpoint: str, split: str, tta: str | None = None, weights: str = "raw") -> str:
    """The report directory's name: `<checkpoint>-<split>`, e.g. `ckpt-4-test`.

    A test-time augmented evaluation's ends in its kind, e.g. `ckpt-4-test-flip`,
    and one of the moving average of the weights in `ema` (`ckpt-4-test-ema`),
    so that neither replaces (or passes for) the other reports.
    """
    parts = [checkpoint, split, *([tta] if tta else []), *(["ema"] if weights == "ema" else [])]
    return "-".join(parts)


def most_confused(
    confusion: np.ndarray, class_names: Sequence[str], count: int = MOST_CONFUSED
) -> list[dict[str, Any]]:
    """The largest off-diagonal cells: which true class is taken for which.

    Args:
      confusion: [classes, classes] counts, row = true class, column = predicted.
      class_names: the name of each class id.
      count: how many pairs at most.

    Returns:
      Up to `count` dicts {true_id, true_name, predicted_id, predicted_name,
      count}, largest count first, ties in class-id order; cells of 0 left out.
    """
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
    record: dict[str, Any],
    confusion: np.ndarray,
    class_names: Sequence[str],
    reliability: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The contents of `eval_results.json`.

    Args:
      record: the evaluation record (checkpoint, step, split, top1, top5,
        loss, num_examples, ...), copied first.
      confusion: [classes, classes] int counts, row = true class, column =
        predicted class.
      class_names: the name of each class id.
      reliability: the reliability bins (`calibration.reliability`), if measured.

    Returns:
      A JSON-ready dict: the record, "classes", "confusion_matrix",
      "confusion_matrix_axes", "most_confused" and, with `reliability`,
      "reliability": one {bin, lower, upper, count, accuracy, confidence} per bin.
    """
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
    if reliability is not None:
        report["reliability"] = reliability_rows(reliability)
    return report


def reliability_rows(reliability: dict[str, Any]) -> list[dict[str, Any]]:
    """The reliability bins one dict per bin, for a JSON file read one line per bin.

    Args:
      reliability: a dict from `calibration.reliability` (lists per bin).

    Returns:
      [{"bin", "lower", "upper", "count", "accuracy", "confidence"}] in bin order.
    """
    columns = ("bin_lower", "bin_upper", "count", "accuracy", "confidence")
    return [
        {
            "bin": index,
            "lower": lower,
            "upper": upper,
            "count": count,
            "accuracy": accuracy,
            "confidence": confidence,
        }
        for index, (lower, upper, count, accuracy, confidence) in enumerate(
            zip(*(reliability[key] for key in columns))
        )
    ]


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
    """Draws the confusion matrix; rows normalized, so each true class reads as fractions.

    Class names label both axes up to `MAX_NAMED_CLASSES` classes, and the
    non-zero counts are written in the cells up to `MAX_COUNTED_CLASSES`.
    Beyond, the title says the names are left out and the matrix is drawn alone.

    Args:
      confusion: [classes, classes] counts, row = true class, column = predicted.
      class_names: the name of each class id.
      title: the first line of the title (which checkpoint, which split).

    Returns:
      A `matplotlib.figure.Figure` with an Agg canvas, not registered with
      pyplot (nothing global to close).

    Raises:
      ImportError: when matplotlib is not installed.
    """
    # Imported here: matplotlib is an optional extra (requirements-plot.txt).
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
    image = axes.imshow(
        fractions,
        cmap="Blues",
        vmin=0.0,
        vmax=1.0,
        interpolation="nearest" if named else "antialiased",
    )
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
            dark = fractions[true_id, predicted_id] > 0.5
            axes.text(
                predicted_id,
                true_id,
                str(int(confusion[true_id, predicted_id])),
                ha="center",
                va="center",
                fontsize=8,
                color="white" if dark else "black",
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
    directory: str,
    record: dict[str, Any],
    confusion: np.ndarray,
    class_names: Sequence[str],
    reliability: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Writes `eval_results.json` and, with matplotlib, the confusion and reliability pictures.

    Args:
      directory: the report directory (created if needed).
      record: the evaluation record: checkpoint, step, split, top1, top5,
        loss, num_examples, and with calibration ece, nll, tta.
      confusion: [classes, classes] int counts, row = true class, column =
        predicted class.
      class_names: the name of each class id.
      reliability: the reliability bins (`calibration.reliability`); None for
        no calibration (and no `reliability.png`: an older one is removed).

    Returns:
      The report written to `eval_results.json`.
    """
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
        files.write_atomically(picture, lambda path: figure.savefig(path, format="png", dpi=100))
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


def log_summary(report: dict[str, Any], worst: int = 5) -> None:
    """Logs the classes with the lowest accuracy and the most-confused pair."""
    measured = [c for c in report["classes"] if c["accuracy"] is not None]
    measured.sort(key=lambda c: (c["accuracy"], -c["examples"], c["id"]))
    listed = ", ".join(
        f"{c['name']} {c['accuracy']:.1%} ({c['correct']}/{c['examples']})"
        for c in measured[:worst]
    )
    empty = len(report["classes"]) - len(measured)
    logging.info(
        "Per-class accuracy of %s on %s, worst first: %s%s",
        report["checkpoint"],
        report["split"],
        listed or "no examples",
        f"; classes without examples: {empty}" if empty else "",
    )
    if report["most_confused"]:
        pair = report["most_confused"][0]
        logging.info(
            "Most confused: %s taken for %s %d times",
            pair["true_name"],
            pair["predicted_name"],
            pair["count"],
        )
