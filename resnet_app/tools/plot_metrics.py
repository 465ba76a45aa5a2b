"""Draws the training curves of one or more runs from their `metrics.jsonl`.

    resnet-app plot RUN_DIR... [--out=curves.png] [--x=step|epoch]

Four panels (training loss and accuracy, evaluation top-1, learning rate), a
colour per run, the newest attempt of a resumed run. No TensorFlow. Needs
requirements-plot.txt.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from absl import flags, logging

from resnet_app.common import cli, files, metrics
from resnet_app.common.errors import ConfigError
from resnet_app.common.metrics import METRICS_FILE  # No TensorFlow there.

if TYPE_CHECKING:  # matplotlib is optional: imported once it is known to be there.
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

TRAIN_KEYS = ("epoch", "loss", "accuracy", "learning_rate")
PANELS = (
    ("loss", "training loss"),
    ("accuracy", "training accuracy"),
    ("top1", "evaluation top-1"),  # Or mAP, for multi-label runs.
    ("learning_rate", "learning rate"),
)
FIGURE_SIZE = (11.0, 7.5)  # Inches.
DPI = 100
FEW_POINTS = 30  # Lines with fewer points get markers, so that a single point shows.
TRAINER = "`python -m resnet_app.train`"


class Series(NamedTuple):
    """One curve: values at increasing steps."""

    steps: list[int]
    values: list[float]


@dataclasses.dataclass
class RunCurves:
    """One run's curves: training values by key, evaluation top-1 by split."""

    train: dict[str, Series]
    top1: dict[str, Series]


def metrics_path(run_dir: str) -> str:
    """The path of `run_dir`'s metrics file (ConfigError when there is none)."""
    what = f"RUN_DIR should be a directory written by {TRAINER}"
    if not os.path.isdir(run_dir):
        found = "is not a directory" if os.path.exists(run_dir) else "does not exist"
        raise ConfigError(f"{run_dir} {found}; {what}")
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.isfile(path):
        raise ConfigError(f"{run_dir} has no {METRICS_FILE}; {what}")
    return path


def _number(value: Any) -> float:
    """`value` as a float, NaN (a gap in the line) when it is not a number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return math.nan


def _series(by_step: dict[int, float]) -> Series:
    steps = sorted(by_step)
    return Series(steps, [by_step[step] for step in steps])


def load_curves(run_dir: str) -> RunCurves:
    """A run's curves, newest attempt only: a "start" at step N (or "rollback" to N) drops
    the earlier records after N; a newer record of a step replaces an older one."""
    path = metrics_path(run_dir)
    train: dict[str, dict[int, float]] = {key: {} for key in TRAIN_KEYS}
    top1: dict[str, dict[int, float]] = {}
    for record in metrics.read_records(path):
        step, event = record["step"], record.get("event")
        if event in ("start", "rollback"):
            restart = record.get("to_step", step) if event == "rollback" else step
            for by_step in (*train.values(), *top1.values()):
                for superseded in [s for s in by_step if s > restart]:
                    del by_step[superseded]
        elif event is None and "top1" in record:
            # Multi-label runs are drawn by their mean average precision.
            metric = "map" if "map" in record else "top1"
            split = str(record.get("split", "?")) + (", mAP" if metric == "map" else "")
            top1.setdefault(split, {})[step] = _number(record[metric])
            if f"ema_{metric}" in record:  # The moving average of the weights (train.ema_decay).
                top1.setdefault(f"{split}, EMA", {})[step] = _number(record[f"ema_{metric}"])
        elif event is None and "accuracy" in record:
            for key in TRAIN_KEYS:
                train[key][step] = _number(record.get(key))
    return RunCurves(
        train={key: _series(by_step) for key, by_step in train.items()},
        top1={split: _series(by_step) for split, by_step in top1.items() if by_step},
    )


def epochs_at(steps: Sequence[int], epochs: Series) -> list[float] | None:
    """The epochs of `steps`, at the epochs-per-step ratio of the first training record at
    or after each (else the last); None without training records."""
    known = [(step, epoch) for step, epoch in zip(*epochs) if step > 0]
    if not known:
        return None
    known_steps = [step for step, _ in known]
    result = []
    for step in steps:
        at, epoch = known[min(bisect.bisect_left(known_steps, step), len(known) - 1)]
        result.append(step * epoch / at)
    return result


def run_labels(run_dirs: Sequence[str]) -> list[str]:
    """Legend names: each directory's name, with as many parents as tell equal names apart
    (["resnet20", "a/try", "b/try"])."""
    paths = [os.path.abspath(run_dir).split(os.sep) for run_dir in run_dirs]
    labels = []
    for path in paths:
        depth = 1
        while depth < len(path) and any(
            other != path and other[-depth:] == path[-depth:] for other in paths
        ):
            depth += 1
        labels.append("/".join(path[-depth:]))
    return labels


def _draw(axis: Axes, xs: Sequence[float], ys: Sequence[float], **style: Any) -> None:
    marker = "o" if len(xs) < FEW_POINTS else None
    axis.plot(xs, ys, marker=marker, markersize=3, linewidth=1.2, **style)


def plot_curves(runs: Mapping[str, RunCurves], x: str = "step") -> Figure:
    """A matplotlib Figure (not pyplot's) of runs' curves by legend label: a panel per entry
    of PANELS, a colour per run, against `x` ("step" or "epoch")."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    figure = Figure(figsize=FIGURE_SIZE, dpi=DPI, layout="constrained")
    axes = dict(zip((key for key, _ in PANELS), figure.subplots(2, 2).flat))
    for index, (label, curves) in enumerate(runs.items()):
        colour = f"C{index % 10}"
        steps = curves.train["epoch"].steps
        train_x = curves.train["epoch"].values if x == "epoch" else steps
        for key in ("loss", "accuracy", "learning_rate") if steps else ():
            # A record's rate is its interval's last step's: drawn as steps, not slopes.
            style = {"drawstyle": "steps-pre"} if key == "learning_rate" else {}
            _draw(axes[key], train_x, curves.train[key].values, color=colour, label=label, **style)
        for number, (split, series) in enumerate(sorted(curves.top1.items())):
            eval_x = series.steps if x == "step" else epochs_at(series.steps, curves.train["epoch"])
            if eval_x is None:
                logging.warning(
                    "%s: no training record gives the epochs of its evaluations; not drawn", label
                )
                continue
            _draw(
                axes["top1"],
                eval_x,
                series.values,
                color=colour,
                linestyle=("-", "--", ":", "-.")[number % 4],
                label=label if len(curves.top1) == 1 else f"{label} ({split})",
            )
    splits = sorted({split for curves in runs.values() for split in curves.top1})
    for key, title in PANELS:
        axis = axes[key]
        if key == "top1" and splits:
            if all(", mAP" in split for split in splits):
                title = "evaluation mAP"
            names = sorted({split.split(", ")[0] for split in splits})
            title = f"{title} ({', '.join(names)})"
        axis.set_title(title)
        axis.set_xlabel(x)
        axis.grid(alpha=0.3)
        if not axis.lines:
            axis.text(0.5, 0.5, "no records", ha="center", va="center", transform=axis.transAxes)
        elif any(len(curves.top1) > 1 for curves in runs.values()) and key == "top1":
            axis.legend(fontsize=8)  # Tells the splits apart.
    handles = [Line2D([], [], color=f"C{i % 10}", label=label) for i, label in enumerate(runs)]
    figure.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4))
    return figure


def plot_runs(run_dirs: Sequence[str], x: str = "step") -> Figure:
    """`plot_curves` of the run directories' curves, labelled by `run_labels`."""
    runs = {}
    for label, run_dir in zip(run_labels(run_dirs), run_dirs):
        runs[label] = load_curves(run_dir)
        logging.info("%s: %s", run_dir, _summary(runs[label]))
    return plot_curves(runs, x=x)


def _summary(curves: RunCurves) -> str:
    steps = curves.train["loss"].steps
    parts = [f"{len(steps)} training records" + (f" to step {steps[-1]}" if steps else "")]
    for split, series in sorted(curves.top1.items()):
        parts.append(
            f"{len(series.steps)} evaluations on {split} (last top-1 {series.values[-1]:.4f} at "
            f"step {series.steps[-1]})"
        )
    return ", ".join(parts)


def _define_flags() -> None:
    flags.DEFINE_string("out", "curves.png", "Where to write the picture (a PNG, or .pdf, .svg).")
    flags.DEFINE_enum("x", "step", ["step", "epoch"], "What the horizontal axes show.")


def main(argv: list[str]) -> None:
    run_dirs = argv[1:]
    if not run_dirs:
        raise ConfigError(
            f"no RUN_DIR: give one or more run directories written by {TRAINER}, "
            "e.g. resnet-app plot runs/try --out=curves.png"
        )
    out = flags.FLAGS.out
    out_dir = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(out_dir):
        raise ConfigError(f"--out={out}: directory {out_dir} does not exist")
    if os.path.isdir(out):
        raise ConfigError(f"--out={out} is a directory; give a file name, e.g. {out}/curves.png")
    seen: dict[str, str] = {}
    for run_dir in run_dirs:
        metrics_path(run_dir)  # Every mistake before any work.
        real = os.path.realpath(run_dir)
        if real in seen:
            raise ConfigError(f"{run_dir} is {seen[real]} again; give each run directory once")
        seen[real] = run_dir
    cli.use_matplotlib("plot")
    from matplotlib.figure import Figure

    file_format = os.path.splitext(out)[1][1:].lower() or "png"
    if file_format not in Figure().canvas.get_supported_filetypes():
        raise ConfigError(f"--out={out}: matplotlib cannot write .{file_format}; use .png")

    try:
        files.save_figure(plot_runs(run_dirs, x=flags.FLAGS.x), out, dpi=DPI)
    except OSError as error:
        message = f"--out={out}: cannot write it ({error.strerror}); pick another"
        raise ConfigError(message) from None
    logging.info("Wrote %s: %d run(s) against the %s", out, len(run_dirs), flags.FLAGS.x)


if __name__ == "__main__":
    _define_flags()
    cli.run(main)
