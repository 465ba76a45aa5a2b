"""The reliability diagram: accuracy per confidence bin against the diagonal, as a PNG.

`plot_reliability(calibration.reliability(...), path)` draws the bins of
`calibration.reliability` (Guo et al. 2017, figure 1), with the histogram of
confidences below; it needs matplotlib, an optional extra, and without it logs
a warning and returns False. `draw_reliability` gives the figure alone.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from absl import logging

from resnet_app.common import files


def draw_reliability(reliability: dict[str, Any], title: str = ""):
    """Draws the reliability diagram: accuracy per bin against the diagonal, counts below.

    The top panel has a bar per non-empty bin up to its accuracy, the gap to
    the bin's mean confidence hatched, and the diagonal a calibrated model
    would follow. The bottom panel is the histogram of confidences: the
    fraction of the examples in each bin.

    Args:
      reliability: a dict from the function `reliability`.
      title: the first line of the title; the ECE and the number of examples
        follow on the second.

    Returns:
      A `matplotlib.figure.Figure` with an Agg canvas, not registered with
      pyplot (nothing global to close).

    Raises:
      ImportError: when matplotlib is not installed.
    """
    # Imported here: matplotlib is an optional extra (requirements-plot.txt).
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
    top.bar(
        centers[filled],
        accuracy[filled],
        width=widths[filled],
        color="tab:blue",
        edgecolor="black",
        label="accuracy",
    )
    top.bar(
        centers[filled],
        (confidence - accuracy)[filled],
        bottom=accuracy[filled],
        width=widths[filled],
        color="tab:red",
        alpha=0.3,
        hatch="//",
        edgecolor="tab:red",
        label="gap to mean confidence",
    )
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
    """Writes the reliability diagram of `reliability` to `path` as a PNG.

    The file is written atomically: a reader sees the previous picture or the
    new one. Without matplotlib (an optional extra) the picture is skipped: a
    warning is logged, a picture already at `path` is removed (it would
    disagree with the new numbers) and False is returned.

    Args:
      reliability: a dict from the function `reliability` (or the "reliability" of a
        `calibration_record`).
      path: the PNG file to write.
      title: the first line of the title (e.g. which checkpoint, which split).

    Returns:
      True when the picture is written, False when matplotlib is missing.
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
    # The temporary name does not end in .png, hence the explicit format.
    files.write_atomically(path, lambda temporary: figure.savefig(temporary, format="png", dpi=100))
    return True
