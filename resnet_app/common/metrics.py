"""What a run reports: `metrics.jsonl`, TensorBoard events, and the console progress line.

`metrics.jsonl` holds one JSON object per line:
- training records: {"step", "epoch", "loss", "accuracy", "learning_rate",
  "examples_per_sec", "input_wait" (the fraction of the time spent waiting
  for data), "time" (Unix seconds)}, over the steps since the previous record;
- evaluation records: {"step", "split", "top1", "top5", "loss", "num_examples",
  "precision" (the `train.precision` the model computed in; records written
  before it was added have none)}, made by `evaluation/exact_eval.py`'s `eval_record`,
  plus the trainer's "time" (Unix seconds at its end) and "seconds" (what the
  evaluation took; both absent from records written before they were added),
  and "ema_top1", "ema_top5", "ema_loss" for the moving average of the
  weights when the run keeps one (`train.ema_decay`);
- events ({"step", "event", ...}): the run's start (with its "time") and end,
  a learning-rate override, settings changed on resume, a stop by a signal, a
  NaN rollback, an input-bound warning;
- evaluations of saved checkpoints by `python -m resnet_app.evaluate`: an
  evaluation record plus "checkpoint" ("ckpt-N"), "report" (the directory of
  its eval_results.json, confusion-matrix and reliability pictures), "tta"
  (null, "flip" or "crops"), "weights" ("ema" or "raw"), "ece" and "nll" (calibration; with a fitted
  temperature also "temperature", "ece_scaled", "nll_scaled") and "event":
  "evaluation" (they have "top1" too: tell them from the trainer's by "event").
The run's settings go to TensorBoard's HParams plugin in `model_dir` itself
(`MetricsWriter.hparams`), so that runs compare in one table.
The trainer's scalars also go to TensorBoard under `model_dir/train` and
`model_dir/eval` (and the moving average's top1, top5 and loss under
`model_dir/eval_ema`, so that the two curves share a chart); `evaluate` writes no
TensorBoard events, but `evaluate --watch` writes its records' top1, top5 and loss
under `model_dir/evaluator` (`evaluator_ema` for the moving average), and marks
them "watch": true in metrics.jsonl.

`read_records` reads the file back, robust to a run killed mid-line; tools and
tests use it. Reading needs no TensorFlow: this module imports it only to write
TensorBoard events.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, TextIO

from absl import logging

from resnet_app.common import run_dir
from resnet_app.common.errors import ConfigError

METRICS_FILE = run_dir.METRICS_FILE  # The name callers and tests know it by.
HPARAMS_DIR = ""  # The run directory itself: TensorBoard's HParams "session" of the run.


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def json_text(value: Any) -> str:
    """Strict JSON: NaN and infinities (a diverged loss) become null, which every
    parser reads; Python's json would write bare NaN, which strict parsers reject."""
    return json.dumps(_finite(value), allow_nan=False)


def _ends_a_line(path: str) -> bool:
    """Whether the file is empty or ends with a newline."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return True
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


class MetricsWriter:
    """Appends records to `model_dir/metrics.jsonl` and TensorBoard.

    Args:
      model_dir: the run directory.
      enabled: False on non-chief workers: nothing is written.
    """

    def __init__(self, model_dir: str, enabled: bool = True):
        self.enabled = enabled
        self.path = run_dir.metrics_path(model_dir)
        self._file = run_dir.open_append(self.path) if enabled else None
        if enabled and not _ends_a_line(self.path):
            # A run killed mid-write left half a record: end it, so the next
            # record starts a line of its own (readers skip the broken one).
            self._file.write("\n")
        self._writers: dict[str, Any] = {}
        self._model_dir = model_dir

    def _summary_writer(self, kind: str):
        if kind not in self._writers:
            import tensorflow as tf  # Here: reading the file needs no TensorFlow.

            self._writers[kind] = tf.summary.create_file_writer(
                run_dir.events_dir(self._model_dir, kind)
            )
        return self._writers[kind]

    def write(self, record: dict[str, Any]) -> None:
        """Writes one record (a line of JSON, flushed at once)."""
        if not self.enabled:
            return
        self._file.write(json_text(record) + "\n")
        self._file.flush()

    def scalars(self, kind: str, step: int, values: dict[str, float]) -> None:
        """Writes TensorBoard scalars under `model_dir/kind`."""
        if not self.enabled:
            return
        import tensorflow as tf

        writer = self._summary_writer(kind)
        with writer.as_default(step=step):
            for name, value in values.items():
                tf.summary.scalar(name, value)

    def hparams(self, values: dict[str, bool | int | float | str], trial: str) -> None:
        """Writes the run's settings to TensorBoard's HParams plugin, at `model_dir`.

        `tensorboard --logdir runs` then lists every run under runs/ in one
        table, with its final `eval/top1`, `eval/loss`, ... beside its settings.

        Args:
          values: {name: value}, as `hparam_values` flattens a config.
          trial: the run's name in the table.
        """
        if not self.enabled:
            return
        from tensorboard.plugins.hparams import api as hparams_api

        with self._summary_writer(HPARAMS_DIR).as_default():
            hparams_api.hparams(values, trial_id=trial)

    def flush(self) -> None:
        """Makes everything written so far visible (the JSON lines already are)."""
        for writer in self._writers.values():
            writer.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        for writer in self._writers.values():
            writer.close()


def hparam_values(tree: dict[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """A nested config as HParams values: "section.key" -> a bool, number or string.

    Nested groups become dotted names ("data.augment.flip"); lists, tuples
    and mappings that are values become their JSON text, None "null".
    """
    values: dict[str, bool | int | float | str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            values.update(hparam_values(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            values[name] = value
        else:
            values[name] = json.dumps(value, default=str)
    return values


def format_duration(seconds: float) -> str:
    """`1:02:03` or `2:03`."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class Progress:
    """A one-line progress bar with ETA on the console (redrawn in place on a terminal).

    Args:
      total_steps: the last step of the run.
      start_step: the step the run starts (or resumes) from.
      stream: where to draw (default stderr); when it is not a terminal,
        nothing is drawn and the log records are the progress.
    """

    WIDTH = 24

    def __init__(self, total_steps: int, start_step: int = 0, stream: TextIO | None = None):
        self.total = total_steps
        self.start = start_step
        self.stream = stream or sys.stderr
        self.interactive = getattr(self.stream, "isatty", lambda: False)()
        self._started = time.monotonic()
        self._drawn = False

    def eta(self, step: int) -> float:
        """Seconds left, at the average speed since the start."""
        done = step - self.start
        if done <= 0:
            return math.inf
        return (time.monotonic() - self._started) / done * (self.total - step)

    def line(self, step: int, status: str) -> str:
        fraction = step / max(self.total, 1)
        filled = int(self.WIDTH * fraction)
        bar = "=" * filled + (">" if filled < self.WIDTH else "") + " " * (self.WIDTH - filled - 1)
        return (
            f"[{bar[: self.WIDTH]}] {step}/{self.total} {100 * fraction:.0f}% {status} "
            f"ETA {format_duration(self.eta(step))}"
        )

    def update(self, step: int, status: str) -> None:
        if self.interactive:
            self.stream.write("\r\033[K" + self.line(step, status))
            self.stream.flush()
            self._drawn = True

    def finish(self) -> None:
        """Ends the bar's line, if one is drawn, so that other output starts afresh."""
        if self.interactive and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


def _parse_line(text: str) -> tuple[dict[str, Any] | None, bool]:
    """The record on a line of the file, and whether the line was only that record.

    A run killed while writing can leave a line without its end; the next
    run appends its first record (its "start" event) to that line, and that
    record is needed. So when a line is not one JSON object, the complete
    object at its end, if any, is the record.

    Args:
      text: one line, without surrounding whitespace.

    Returns:
      (the record or None, True if the whole line was the record).
    """
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            value, end = None, -1
        if end == len(text) and isinstance(value, dict):
            return value, start == 0
        start = text.find("{", start + 1)
    return None, False


def read_records(path: str) -> list[dict[str, Any]]:
    """The records of a metrics file, in the order written.

    What is not a complete record with an integer "step" is skipped, with one
    warning for the file that names the lines.

    Args:
      path: a `metrics.jsonl` file.

    Returns:
      The records, as dicts.

    Raises:
      ConfigError: when the file cannot be read.
    """
    records, damaged = [], []
    try:
        with open(path, encoding="utf-8", errors="replace") as lines:
            for number, line in enumerate(lines, start=1):
                text = line.strip()
                if not text:
                    continue
                record, whole = _parse_line(text)
                step = record.get("step") if record else None
                if isinstance(step, int) and not isinstance(step, bool):
                    records.append(record)
                else:
                    whole = False
                if not whole:
                    damaged.append(number)
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None
    if damaged:
        logging.warning(
            "%s: skipped what is not a complete JSON record on line(s) %s (a run killed "
            "while writing?)",
            path,
            ", ".join(str(number) for number in damaged),
        )
    return records
