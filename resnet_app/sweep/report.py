"""What a sweep leaves, each file written whole (atomically) at every report:
- `summary.csv` and the table printed at the end: one row per trial, best first (finished
  trials by their final value, then pruned ones by their last evaluation, then those
  running, then failures);
- `sweep.png` (with matplotlib): each trial's evaluations, and the final values in the
  order the trials were drawn;
- `best.yaml`: the best finished trial's own `config.yaml`, with a header saying what it
  scored and how to train it: a recipe for `--config`.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
from typing import Any

from absl import logging

from resnet_app.common import files, run_dir
from resnet_app.sweep import study as study_lib

SUMMARY_FILE, PLOT_FILE, BEST_FILE = "summary.csv", "sweep.png", "best.yaml"
_DPI = 100
_ORDER = {"COMPLETE": 0, "PRUNED": 1, "RUNNING": 2, "WAITING": 2, "FAIL": 3}


@dataclasses.dataclass(frozen=True)
class Row:
    """One trial as the summary shows it: its final value (complete) or last evaluation
    (pruned, running) and that value's step, and a failure's error line in `note`."""

    number: int
    state: str
    value: float | None
    step: int | None
    params: dict[str, Any]
    run_dir: str
    note: str


def rows(study: Any, higher: bool) -> list[Row]:
    """The study's trials, best first."""
    found = []
    for trial in study.get_trials(deepcopy=False):
        steps, attrs = trial.intermediate_values, trial.user_attrs
        last = max(steps) if steps else None
        complete = trial.state.name == "COMPLETE"
        value = trial.value if complete else (steps[last] if steps else None)
        run, note = attrs.get(study_lib.RUN_DIR, ""), attrs.get(study_lib.ERROR, "")
        found.append(
            Row(trial.number, trial.state.name, value, last, dict(trial.params), run, note)
        )
    sign = -1 if higher else 1

    def rank(row: Row) -> tuple:
        missing = row.value is None
        return (_ORDER.get(row.state, 4), missing, 0 if missing else sign * row.value, row.number)

    return sorted(found, key=rank)


def table(ranked: list[Row], keys: list[str], metric: str) -> str:
    """The ranking as aligned text: trial, state, the metric, its step, each key."""
    header = ["trial", "state", metric, "step", *keys]
    body = [
        [
            str(row.number),
            row.state.lower(),
            "-" if row.value is None else f"{row.value:.4f}",
            "-" if row.step is None else str(row.step),
            *[_text(row.params.get(key)) for key in keys],
        ]
        for row in ranked
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip()
        for line in [header, *body]
    )


def _text(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def write_summary(path: str, ranked: list[Row], keys: list[str], metric: str) -> None:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["rank", "trial", "state", metric, "step", *keys, "run_dir", "error"])
    for rank, row in enumerate(ranked, start=1):
        values = [row.params.get(key, "") for key in keys]
        value = "" if row.value is None else repr(row.value)
        step = "" if row.step is None else row.step
        writer.writerow(
            [rank, row.number, row.state.lower(), value, step, *values, row.run_dir, row.note]
        )
    files.write_text_atomically(path, out.getvalue())


def write_best_recipe(path: str, best: Row, metric: str, split: str, study_dir: str) -> None:
    """The best trial's config.yaml as a recipe, with a header saying what it scored."""
    with open(run_dir.config_path(best.run_dir), encoding="utf-8") as f:
        text = f.read()
    searched = ", ".join(f"{key}={_text(value)}" for key, value in sorted(best.params.items()))
    header = [
        f"# The best trial of the sweep in {study_dir}: trial {best.number}, {metric} "
        f"{best.value:.4f} on the {split} split at step {best.step}.",
        f"# Searched: {searched}",
        f"# Train it: resnet-app train --config={path}",
        "# (data.validation_split still holds those examples out: set it to 0 to train on",
        "# them too, and evaluate the result on the test split once.)",
    ]
    files.write_text_atomically(path, "\n".join(header) + "\n" + text)


def plot(path: str, study: Any, metric: str, higher: bool) -> bool:
    """Draws each trial's evaluations and the final values; False without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        logging.info(
            "No %s: matplotlib is not installed (pip install -r requirements-plot.txt)", path
        )
        return False
    figure = Figure(figsize=(11, 4.5), dpi=_DPI, layout="constrained")
    curves, finals = figure.subplots(1, 2)
    done = []
    for trial in study.get_trials(deepcopy=False):
        steps = sorted(trial.intermediate_values)
        if steps:
            style = "-" if trial.state.name == "COMPLETE" else ":"
            values = [trial.intermediate_values[s] for s in steps]
            curves.plot(steps, values, style, marker=".", label=f"trial {trial.number}")
        if trial.state.name == "COMPLETE":
            done.append((trial.number, trial.value))
    curves.set(
        xlabel="step", ylabel=f"{metric} (evaluation)", title="Evaluations (dotted: not finished)"
    )
    if len(curves.lines) <= 12:
        curves.legend(fontsize="small")
    if done:
        numbers, values = zip(*done)
        finals.plot(numbers, values, "o", label="trial")
        best = max if higher else min
        so_far = [best(values[: i + 1]) for i in range(len(values))]
        finals.step(numbers, so_far, where="post", label="best so far")
        finals.legend(fontsize="small")
    finals.set(xlabel="trial", ylabel=f"final {metric}", title="Finished trials")
    files.write_atomically(path, lambda temp: figure.savefig(temp, format="png", dpi=_DPI))
    return True


def write_all(
    study: Any, study_dir: str, keys: list[str], metric: str, higher: bool, split: str
) -> list[Row]:
    """Writes summary.csv, sweep.png and best.yaml; returns the ranking."""
    ranked = rows(study, higher)
    write_summary(os.path.join(study_dir, SUMMARY_FILE), ranked, keys, metric)
    plot(os.path.join(study_dir, PLOT_FILE), study, metric, higher)
    complete = [row for row in ranked if row.state == "COMPLETE" and row.value is not None]
    if complete and os.path.isfile(run_dir.config_path(complete[0].run_dir)):
        write_best_recipe(os.path.join(study_dir, BEST_FILE), complete[0], metric, split, study_dir)
    elif complete:  # A study shared between machines: the best ran on another one.
        logging.info(
            "No %s here: the best trial, %d, ran in %s, not on this machine",
            BEST_FILE,
            complete[0].number,
            complete[0].run_dir,
        )
    return ranked
