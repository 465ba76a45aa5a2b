"""Learning-rate range test: train briefly with an exponentially rising rate, watch the loss.

    resnet-app lr-find --config=configs/cifar10_resnet20.yaml
    resnet-app lr-find --model_dir=runs/shapes_resnet20 --steps=200 --start_lr=1e-4

Smith (2017), sec. 3.3, as fastai's `lr_find`: a copy of the config trains for
`--steps` steps at rates rising exponentially from `--start_lr` to `--end_lr`,
until the bias-corrected smoothed loss exceeds `--divergence` times its minimum.
It suggests a tenth of the rate at that minimum (Howard & Gugger 2020), leaving
out the first tenth of the steps and the last 5. A run's `--model_dir` is only
read; the test trains in `--work_dir`, deleted unless `--keep`.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import shutil
import sys
import tempfile
from typing import Any

from absl import flags, logging

from resnet_app import config
from resnet_app.common import cli, files, run_dir
from resnet_app.common.errors import ConfigError
from resnet_app.engine import command_line

_START_LR = flags.DEFINE_float("start_lr", 1e-5, "The learning rate of the first step.")
_END_LR = flags.DEFINE_float("end_lr", 10.0, "The learning rate of the last step.")
_STEPS = flags.DEFINE_integer("steps", 300, "Steps of the test (it may stop before).")
_DIVERGENCE = flags.DEFINE_float(
    "divergence", 4.0, "Stop once the smoothed loss exceeds this many times its minimum so far."
)
_SMOOTHING = flags.DEFINE_float(
    "smoothing", 0.98, "Beta of the loss's exponential moving average (bias-corrected)."
)
_WORK_DIR = flags.DEFINE_string(
    "work_dir", None, "Where the test trains: a new or empty directory (default: a temp dir)."
)
_KEEP = flags.DEFINE_bool("keep", False, "Keep --work_dir (its metrics.jsonl and checkpoint).")
_CSV = flags.DEFINE_string("csv", "lr_find.csv", "Every step: learning rate, loss, smoothed.")
_PLOT = flags.DEFINE_string("plot", "lr_find.png", "The plot (needs matplotlib; empty: none).")
_ROWS = flags.DEFINE_integer("rows", 24, "Rows in the printed table.")

OWNED_FLAGS = ("train_steps", "epochs", "log_every", "steps_per_loop", "eval_every", "on_nan")
OWNED_FLAGS += ("lr_schedule", "restart", "allow_config_change")
COMPLETE = "range test complete"


class RangeTest:
    """The smoothed loss of every step (`rows`: step, rate, loss, smoothed), and why the
    test stops (`stop_reason`, `lost`: the loop lost a step to non-finite values)."""

    def __init__(self, steps: int, divergence: float, beta: float):
        self.steps, self.divergence, self.beta = steps, divergence, beta
        self.rows: list[tuple[int, float, float, float]] = []
        self.stop_reason: str | None = None
        self.lost = False
        self._average, self._best = 0.0, math.inf

    def add(self, step: int, rate: float, loss: float) -> str | None:
        """Records step `step` (0-based); returns why to stop now, or None."""
        self._average = self.beta * self._average + (1 - self.beta) * loss
        smoothed = self._average / (1 - self.beta ** (len(self.rows) + 1))
        self.rows.append((step, rate, loss, smoothed))
        if not math.isfinite(smoothed):
            self.stop_reason = f"the loss is not finite at step {step}"
        elif smoothed > self.divergence * self._best:
            self.stop_reason = (
                f"diverged at step {step}: smoothed loss {smoothed:.4g} > "
                f"{self.divergence:g} x the minimum {self._best:.4g}"
            )
        self._best = min(self._best, smoothed)
        return self.stop_reason or (COMPLETE if step + 1 >= self.steps else None)

    @property
    def finished(self) -> bool:
        return bool(self.stop_reason) or len(self.rows) >= self.steps

    def lost_step(self) -> None:
        """The step after the last row went non-finite (the loop raised)."""
        step = self.rows[-1][0] + 1 if self.rows else 0
        self.lost = True
        self.stop_reason = self.stop_reason or f"the loss or weights are not finite at step {step}"


def create_action(test: RangeTest):
    """The loop action that feeds `test` every step's record and stops the run when it says."""
    from resnet_app.engine import actions  # TensorFlow: only once the flags are checked.

    class RangeTestAction(actions.Action):
        def __call__(self, boundary: actions.Boundary) -> None:
            record = boundary.record
            if record is None or test.finished:
                return  # With model averaging, a stop may wait some steps for the next average.
            # Record k (1-based) is step k - 1, which ran at the rate the record names.
            reason = test.add(record["step"] - 1, record["learning_rate"], record["loss"])
            if reason:
                boundary.request_stop(reason)

        def interrupt(self) -> None:
            test.lost_step()

    return RangeTestAction()


def range_test_config(resolved: config.Config, start: float, end: float, steps: int):
    """`resolved` with the test's rising schedule, length, records and no evaluation."""
    schedule = config.ScheduleSection.from_mapping(
        {"name": "exponential", "decay_rate": end / start, "decay_steps": steps - 1}
    )
    never = steps + 2  # The test stops itself at `steps`, before any evaluation or save is due.
    settings = dataclasses.replace(
        resolved.train,
        epochs=None,
        train_steps=steps + 1,
        log_every=1,
        steps_per_loop=1,
        eval_every=never,
        checkpoint_every=never,
        on_nan="stop",
        keep_best=False,
        keep_checkpoints=1,
    )
    optimizer = dataclasses.replace(resolved.optimizer, learning_rate=start)
    return dataclasses.replace(resolved, optimizer=optimizer, schedule=schedule, train=settings)


def check_flags() -> None:
    """Refuses impossible values and train flags the test sets itself, in one line."""
    start, end = _START_LR.value, _END_LR.value
    if not (0 < start < math.inf):
        raise ConfigError(f"--start_lr must be a number > 0, got {start}")
    if not (start < end < math.inf):
        raise ConfigError(f"--end_lr must be a number above --start_lr ({start:g}), got {end:g}")
    if _STEPS.value < 2:
        raise ConfigError(f"--steps must be 2 or more, got {_STEPS.value}")
    if _ROWS.value < 2:
        raise ConfigError(f"--rows must be 2 or more, got {_ROWS.value}")
    if not _DIVERGENCE.value > 1:
        raise ConfigError(f"--divergence must be a factor above 1, got {_DIVERGENCE.value:g}")
    if not 0 <= _SMOOTHING.value < 1:
        raise ConfigError(f"--smoothing must be in [0, 1), got {_SMOOTHING.value:g}")
    for name in OWNED_FLAGS:
        if flags.FLAGS[name].present:
            raise ConfigError(
                f"--{name} is set by the range test (--steps steps at its own rates, every step "
                "recorded, no evaluation, in --work_dir); drop it"
            )
    model_dir = flags.FLAGS.model_dir
    if model_dir and flags.FLAGS.config:
        raise ConfigError("give --config or --model_dir (a run's config.yaml), not both")
    if model_dir and not os.path.isfile(run_dir.config_path(model_dir)):
        raise ConfigError(f"--model_dir={model_dir} has no config.yaml; give a run directory")
    run = os.path.realpath(model_dir) if model_dir else None
    for name, path in (("work_dir", _WORK_DIR.value), ("csv", _CSV.value), ("plot", _PLOT.value)):
        if run and path and os.path.commonpath([os.path.realpath(path), run]) == run:
            raise ConfigError(f"--{name}={path} is inside --model_dir; the test never writes there")


def make_work_dir() -> tuple[str, bool]:
    """The directory to train in, and whether this call created it."""
    if not _WORK_DIR.value:
        return tempfile.mkdtemp(prefix="lr_find_"), True
    work = _WORK_DIR.value
    if os.path.isdir(work) and os.listdir(work):
        raise ConfigError(f"--work_dir={work} is not empty; give a new or empty directory")
    if os.path.exists(work) and not os.path.isdir(work):
        raise ConfigError(f"--work_dir={work} is a file; give a new or empty directory")
    created = not os.path.exists(work)
    os.makedirs(work, exist_ok=True)
    return work, created


def run_test(resolved: config.Config, test: RangeTest, work: str) -> None:
    """Trains `resolved` in `work` until `test`, a non-finite step or a signal stops it."""
    from resnet_app.engine import loop

    try:
        result = loop.train_and_evaluate(resolved, work, actions=[create_action(test)])
    except ConfigError as error:
        if not test.lost:
            raise
        logging.info("The test's run ended with: %s", error)  # The loop's divergence error.
        return
    if result.stopped and not test.finished:
        test.stop_reason = f"stopped by {result.stopped}"
    # The loop's "rerun the same command to resume" is about the test's own, temporary run.
    logging.info("The range test ended: %s", test.stop_reason or COMPLETE)


def suggest(rows: list[tuple[int, float, float, float]], steps: int) -> dict[str, Any]:
    """fastai's suggestions from the smoothed loss, without the first `steps // 10` rows,
    the last 5 and all from the first non-finite one: {"minimum" and "steepest" descent
    over log(rate): (row, rate), "suggested": the minimum's rate / 10}, or {}."""
    import numpy as np

    table = np.array([row[1:] for row in rows], dtype=np.float64).reshape(-1, 3)
    first = steps // 10
    bad = np.flatnonzero(~np.isfinite(table[:, 2]))
    last = min(len(rows) - 5, bad[0] if len(bad) else len(rows))
    if last - first < 2:
        return {}
    rates, smoothed = table[first:last, 0], table[first:last, 2]
    lowest = int(np.argmin(smoothed))
    slopes = np.diff(smoothed) / np.diff(np.log(rates))
    steepest = int(np.argmin(slopes))
    return {
        "minimum": (first + lowest, float(rates[lowest])),
        "steepest": (first + steepest, float(rates[steepest])),
        "suggested": float(rates[lowest]) / 10,
    }


def report(resolved: config.Config, test: RangeTest, found: dict[str, Any]) -> list[str]:
    """The printed table and findings."""
    start, end, steps, rows = _START_LR.value, _END_LR.value, _STEPS.value, test.rows
    lines = [
        f"LR range test (Smith 2017, sec. 3.3): {resolved.model_name} on "
        f"{resolved.data.dataset}, batch {resolved.train.batch_size}, "
        f"{resolved.optimizer.kind}; lr {start:g} -> {end:g} over {steps} steps "
        f"(x{(end / start) ** (1 / (steps - 1)):.6g} a step)",
        f"{'step':>6} {'learning rate':>14} {'loss':>10} {'smoothed':>10}",
    ]
    shown, last = _ROWS.value, len(rows) - 1  # Evenly spread rows, first and last included.
    indices = (
        range(len(rows)) if last < shown else {round(i * last / (shown - 1)) for i in range(shown)}
    )
    for index in sorted(indices):
        step, rate, loss, smoothed = rows[index]
        lines.append(f"{step:>6} {rate:>14.6g} {loss:>10.4g} {smoothed:>10.4g}")
    return lines + findings(test, found)


def findings(test: RangeTest, found: dict[str, Any]) -> list[str]:
    """How the test ended, its minimum, steepest descent and suggestion, and warnings."""
    rows, steps = test.rows, test.steps
    ended = f"stopped early: {test.stop_reason}" if test.stop_reason else "ran all steps"
    lines = [f"{ended} ({len(rows)} of {steps} steps recorded)"]
    if not found:
        return [*lines, "too few steps for a suggestion: lower --end_lr or raise --steps"]
    lowest, at = found["minimum"]
    lines += [
        f"minimum smoothed loss {rows[lowest][3]:.4g} at learning rate {at:.6g}",
        f"steepest descent of the smoothed loss at learning rate {found['steepest'][1]:.6g}",
        f"suggested learning rate: {found['suggested']:.6g} (the minimum's / 10, as "
        "fastai's lr_find: Howard & Gugger 2020)",
    ]
    if lowest >= len(rows) - 6 and not test.stop_reason:
        lines.append("warning: the loss still falls at the end; raise --end_lr")
    if found["suggested"] < rows[0][1]:
        lines.append("warning: the suggestion is below --start_lr; lower --start_lr")
    return lines


def plot(
    rows: list[tuple[int, float, float, float]], found: dict[str, Any], path: str, title: str
) -> None:
    """Smoothed (and raw) loss against the learning rate, log x; the findings as lines."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logging.warning(
            "No plot: matplotlib is not installed (pip install -r requirements-plot.txt)"
        )
        return
    rates = [row[1] for row in rows]
    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot(rates, [row[2] for row in rows], color="0.75", linewidth=0.8, label="loss")
    axes.plot(rates, [row[3] for row in rows], label="smoothed loss")
    marks = {}
    if found:
        marks = {key: found[key][1] for key in ("minimum", "steepest")}
        marks["suggested"] = found["suggested"]
    for (key, rate), style in zip(marks.items(), (":", "-.", "--")):
        axes.axvline(rate, linestyle=style, color="k", label=f"{key} {rate:.3g}")
    finite = [row[3] for row in rows if math.isfinite(row[3])]
    if finite:  # Keep the explosion from flattening the rest.
        axes.set_ylim(min(finite) * 0.95, min(max(finite), 4 * finite[0]) * 1.05)
    axes.set(xscale="log", xlabel="learning rate", ylabel="training loss", title=title)
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize=8)
    figure.tight_layout()
    files.save_figure(figure, path)
    plt.close(figure)
    logging.info("Wrote %s", path)


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    check_flags()
    resolved = command_line.config_from_flags()
    command_line.check_before_tensorflow(resolved, None, restart=True)
    logging.info(
        "The range test replaces schedule %s and optimizer.learning_rate %g",
        dict(resolved.schedule),
        resolved.optimizer.learning_rate,
    )
    resolved = range_test_config(resolved, _START_LR.value, _END_LR.value, _STEPS.value)
    test = RangeTest(_STEPS.value, _DIVERGENCE.value, _SMOOTHING.value)
    work, created = make_work_dir()
    try:
        run_test(resolved, test, work)
    finally:
        if _KEEP.value:
            logging.info("Kept the test's run directory %s", work)
        else:  # A directory the user gave stays, empty.
            shutil.rmtree(work, ignore_errors=True)
            if not created:
                os.makedirs(work, exist_ok=True)
    found = suggest(test.rows, test.steps)
    sys.stdout.write("\n".join(report(resolved, test, found)) + "\n")
    if _CSV.value:
        with open(_CSV.value, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["step", "learning_rate", "loss", "smoothed_loss"])
            writer.writerows(test.rows)
        logging.info("Wrote %s", _CSV.value)
    if _PLOT.value and test.rows:
        title = f"LR range test: {resolved.model_name} on {resolved.data.dataset}"
        plot(test.rows, found, _PLOT.value, title)


if __name__ == "__main__":
    cli.run(main)
