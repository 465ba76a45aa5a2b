"""One self-contained HTML page of what a checkpoint learned: `resnet-app report`'s page.

Written into the checkpoint's report directory beside `eval_results.json`,
from the same evaluation pass: the run at a glance, its curves (from
metrics.jsonl), the highest-loss examples with Grad-CAM, the most confused
pairs with examples, calibration and the per-class table. The images are data
URIs and the charts inline SVG, so the page opens from disk with no network;
`report_page.html` is its Jinja2 template. `predictions.npz` beside it holds
every example's id, label and logits.
"""

from __future__ import annotations

import base64
import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jinja2
import numpy as np
import tensorflow as tf

from resnet_app import config
from resnet_app.common import files, metrics
from resnet_app.config import differences
from resnet_app.evaluation import calibration, gradcam, reports
from resnet_app.evaluation.gallery import THUMBNAIL, pixels, thumbnails
from resnet_app.tools.plot_metrics import Series, load_curves

if TYPE_CHECKING:
    from resnet_app.engine.exact_eval import EvalResult
    from resnet_app.evaluation.gallery import Gallery

PAGE_FILE = "report.html"
PREDICTIONS_FILE = "predictions.npz"
MAX_PAIRS = 50
OPEN_TABLE_CLASSES = 50  # Larger per-class tables start folded.
CHART = (360, 200, 44)  # Width, height and margin of a curve's SVG, in pixels.
_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(os.path.dirname(__file__)),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)


def write_page(
    session: Any, directory: str, report: dict, result: EvalResult, gallery: Gallery
) -> str:
    """Writes the page and `predictions.npz` into `directory`; the page's path. `session`: a
    `checkpoint_eval.Session` (its model_dir, run_config, pipeline and model are read)."""
    names = session.pipeline.class_names
    files.write_atomically(
        os.path.join(directory, PREDICTIONS_FILE),
        lambda path: _save_predictions(path, result),
    )
    context = {
        "title": f"{os.path.basename(os.path.realpath(session.model_dir))}: {report['checkpoint']}",
        "report": report,
        "glance": _glance(session, report),
        "charts": _charts(session.model_dir, result.multi_label),
        "worst": _worst(session, gallery, names),
        "pairs": _pairs(result, gallery, names),
        "classes": _class_rows(report, result),
        "open_table": len(names) <= OPEN_TABLE_CLASSES,
        "multi_label": result.multi_label,
        "thumbnail": THUMBNAIL,
    }
    page = _TEMPLATES.get_template("report_page.html").render(context)
    path = os.path.join(directory, PAGE_FILE)
    files.write_text_atomically(path, page)
    return path


def _save_predictions(path: str, result: EvalResult) -> None:
    with open(path, "wb") as f:
        np.savez(f, id=result.ids, label=result.labels, logits=result.logits)


def image_uri(image: np.ndarray) -> str:
    """A uint8 [height, width, channels] image as a data URI: PNG for greyscale or small
    images, JPEG (quality 90) for larger colour ones."""
    if image.shape[-1] == 1 or image.shape[0] <= 64:
        kind, encoded = "png", tf.io.encode_png(image)
    else:
        kind, encoded = "jpeg", tf.io.encode_jpeg(image, quality=90)
    return f"data:image/{kind};base64,{base64.b64encode(encoded.numpy()).decode('ascii')}"


def _glance(session: Any, report: dict) -> list[tuple[str, str]]:
    """(what, value) rows: the run's model, data, recipe, precision, steps, time and devices."""
    records = metrics.read_records(os.path.join(session.model_dir, metrics.METRICS_FILE))
    starts = [r for r in records if r.get("event") == "start"]
    ends = [r["seconds"] for r in records if r.get("event") == "end" and "seconds" in r]
    run_config, pipeline = session.run_config, session.pipeline
    recipe = differences.changes(config.Config(), run_config)
    size = pipeline.preprocessing.eval_size
    total = f" of {starts[-1]['total_steps']}" if starts else ""
    return [
        ("model", f"{run_config.model_name}, {session.model.count_params():,} parameters"),
        (
            "data",
            f"{run_config.data.dataset}: {pipeline.num_classes} classes, {size}x{size} px, "
            f"{pipeline.channels} channel(s)",
        ),
        # The settings unset by the recipe (a schedule's unused keys) would only be noise.
        ("recipe", ", ".join(f"{k}={v}" for k, (_, v) in sorted(recipe.items()) if v is not None)),
        ("precision", report["precision"]),
        (
            "steps",
            f"{report['step']}{total} (checkpoint {report['checkpoint']}, "
            f"{report['weights']} weights)",
        ),  # fmt: skip
        ("training time", metrics.format_duration(sum(ends)) if ends else "not finished"),
        ("devices", starts[-1].get("devices", "not recorded") if starts else "not recorded"),
    ]


def _chart(title: str, lines: dict[str, Series]) -> dict[str, Any]:
    """A chart's title, axis ranges and one polyline per line, in `CHART`'s pixels."""
    width, height, margin = CHART
    points = {
        label: [(x, y) for x, y in zip(*series) if math.isfinite(y)]
        for label, series in lines.items()
    }
    points = {label: found for label, found in points.items() if found}
    if not points:
        return {"title": title, "lines": []}
    xs = [x for found in points.values() for x, _ in found]
    ys = [y for found in points.values() for _, y in found]
    x0, x1, y0, y1 = min(xs), max(max(xs), min(xs) + 1), min(ys), max(ys)
    y1 = y1 if y1 > y0 else y0 + 1

    def at(x: float, y: float) -> str:
        left = margin + (x - x0) / (x1 - x0) * (width - margin - 8)
        top = 24 + (y1 - y) / (y1 - y0) * (height - margin - 24)
        return f"{left:.1f},{top:.1f}"

    return {
        "title": title,
        "x": (x0, x1),
        "y": (f"{y0:.3g}", f"{y1:.3g}"),
        "lines": [
            {"label": label, "points": " ".join(at(x, y) for x, y in found)}
            for label, found in points.items()
        ],
    }


def _charts(model_dir: str, multi_label: bool) -> list[dict[str, Any]]:
    """Training loss, learning rate, and train and evaluation top-1 (mAP) against the step."""
    curves = load_curves(model_dir)
    measured = {"train": curves.train["accuracy"], **curves.top1}
    return [
        _chart("training loss", {"train": curves.train["loss"]}),
        _chart("learning rate", {"learning rate": curves.train["learning_rate"]}),
        _chart("top-1 (evaluation: mAP)" if multi_label else "top-1", measured),
    ]


def _worst(session: Any, gallery: Gallery, names: Sequence[str]) -> list[dict[str, Any]]:
    """The gallery's highest-loss examples, each with its image, Grad-CAM of the predicted
    class, labels and probabilities."""
    worst = gallery.worst
    if not worst:
        return []
    images, predicted = worst["image"], worst["prediction"].astype(np.int32)
    activations, gradients = gradcam.activations_and_gradients(session.model, images, predicted)
    shown = pixels(images, gallery.mean, gallery.std)
    heat = gradcam.overlay(shown, gradcam.maps(activations, gradients), THUMBNAIL)
    logits = worst["logits"].astype(np.float64)
    sigmoid = 1.0 / (1.0 + np.exp(-logits))
    probabilities = sigmoid if gallery.multi_label else calibration.softmax(logits)
    cards = []
    for index, (label, prediction) in enumerate(zip(worst["label"], predicted)):
        if gallery.multi_label:
            true = [int(i) for i in np.flatnonzero(label > 0.5)]
        else:
            true = [int(label)]
        cards.append(
            {
                "id": int(worst["id"][index]),
                "loss": float(worst["loss"][index]),
                "image": image_uri(thumbnails(shown[index : index + 1])[0]),
                "heat": image_uri(heat[index]),
                "true": [(names[i], float(probabilities[index, i])) for i in true],
                "predicted": (names[prediction], float(probabilities[index, prediction])),
            }
        )
    return cards


def _pairs(result: EvalResult, gallery: Gallery, names: Sequence[str]) -> list[dict[str, Any]]:
    """The `MAX_PAIRS` most confused (true, predicted) pairs, each with its examples."""
    if result.confusion is None:
        return []
    pairs = reports.most_confused(result.confusion, names, MAX_PAIRS)
    for pair in pairs:
        kept = gallery.pairs.get((pair["true_id"], pair["predicted_id"]), [])
        pair["examples"] = [(example_id, image_uri(image)) for _, example_id, image in kept]
    return pairs


def _class_rows(report: dict, result: EvalResult) -> list[dict[str, Any]]:
    """Per class: examples, precision, recall and F1 (multi-label: positives, AP and F1)."""
    if result.multi_label:
        return report["classes"]
    confusion = result.confusion
    predicted = confusion.sum(axis=0)
    rows = []
    for entry in report["classes"]:
        class_id, recall = entry["id"], entry["recall"]
        hits = confusion[class_id, class_id]
        precision = None if predicted[class_id] == 0 else float(hits / predicted[class_id])
        f1 = None
        if precision is not None and recall is not None and precision + recall > 0:
            f1 = 2 * precision * recall / (precision + recall)
        rows.append({**entry, "precision": precision, "f1": f1})
    return rows
