"""The reliability diagram (Guo et al. 2017, figure 1) of `calibration.reliability`'s bins."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from absl import logging

from resnet_app.common import files


def draw_reliability(reliability: dict[str, Any], title: str = ""):
    """The reliability diagram as a figure (ImportError without matplotlib, an optional extra).

    Above, a bar per non-empty bin up to its accuracy, the gap to its mean
    confidence hatched, and the diagonal; below, the fraction of examples per
    bin. The title's second line gives the ECE and the counts. The figure has
    an Agg canvas, not registered with pyplot.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    lower = np.asarray(reliability["bin_lower"], np.float64)
    upper = np.asarray(reliability["bin_upper"], np.float64)
    count = np.asarray(reliability["count"], np.int64)
    accuracy, confidence = (
        np.array([0.0 if v is None else v for v in reliability[key]], np.float64)
        for key in ("accuracy", "confidence")
    )
    filled = count > 0
    centers, widths = (lower + upper) / 2, upper - lower

    figure = Figure(figsize=(6.0, 7.0), layout="constrained")
    FigureCanvasAgg(figure)
    top, bottom = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    at, width, accurate = centers[filled], widths[filled], accuracy[filled]
    top.bar(at, accurate, width=width, color="tab:blue", edgecolor="black", label="accuracy")
    hatched = dict(color="tab:red", alpha=0.3, hatch="//", edgecolor="tab:red")
    gap = (confidence - accuracy)[filled]
    top.bar(at, gap, bottom=accurate, width=width, label="gap to mean confidence", **hatched)
    top.plot([0, 1], [0, 1], linestyle="--", color="gray", label="perfect calibration")
    top.set_xlim(0.0, 1.0)
    top.set_ylim(0.0, 1.0)
    top.set_ylabel("accuracy")
    top.legend(loc="upper left")
    top.set_title(_diagram_title(reliability, title))

    bottom.bar(centers, count / max(count.sum(), 1), width=widths, color="gray", edgecolor="black")
    bottom.set_xlabel("confidence (largest probability)")
    bottom.set_ylabel("fraction of examples")
    return figure


def _diagram_title(reliability: dict[str, Any], title: str) -> str:
    """`title`, then the ECE and the numbers of examples and bins on a second line."""
    summary = f"{sum(reliability['count'])} examples, {len(reliability['count'])} bins"
    if reliability.get("ece") is not None:
        summary = f"ECE {reliability['ece']:.2%}, {summary}"
    # A "$" in a run or split name would otherwise be read as mathtext.
    heading = title.replace("$", r"\$")
    return f"{heading}\n{summary}" if heading else summary


def plot_reliability(reliability: dict[str, Any], path: str, title: str = "") -> bool:
    """Writes the reliability diagram to `path` as a PNG, atomically; whether it could.

    Without matplotlib a warning is logged, and an older picture at `path`
    (which would disagree with the new numbers) is removed.
    """
    try:
        figure = draw_reliability(reliability, title)
    except ImportError:
        if os.path.exists(path):
            os.remove(path)
        logging.warning(
            "Skipped %s: the reliability diagram needs matplotlib "
            "(pip install -r requirements-plot.txt)",
            path,
        )
        return False
    files.save_figure(figure, path)
    return True
