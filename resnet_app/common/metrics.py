"""What a run reports: `metrics.jsonl`, TensorBoard events, and the console progress line.

`metrics.jsonl` holds one JSON object per line, each with its "step": training
records ("epoch", "loss", "accuracy", "learning_rate", "examples_per_sec",
"input_wait", "time"), evaluations ("split", "top1", "top5", "loss",
"num_examples", "precision", "ema_*"...; `resnet-app evaluate`'s with "event":
"evaluation"), and events ("event": "start", "end", ...). TensorBoard gets the
scalars under train/, eval/, eval_ema/ (evaluator/ for `--watch`) and the
settings in the HParams plugin. `read_records` needs no TensorFlow.
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

METRICS_FILE = run_dir.METRICS_FILE
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
    """Strict JSON: NaN and infinities (a diverged loss) become null, not the bare NaN
    that strict parsers reject."""
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
    """Appends records to `model_dir/metrics.jsonl` and TensorBoard (nothing unless `enabled`:
    non-chief workers write nothing)."""

    def __init__(self, model_dir: str, enabled: bool = True):
        self.enabled = enabled
        self.path = run_dir.metrics_path(model_dir)
        self._file = run_dir.open_append(self.path) if enabled else None
        if enabled and not _ends_a_line(self.path):
            # A run killed mid-write left half a record: the next one starts its own line.
            self._file.write("\n")
        self._writers: dict[str, Any] = {}
        self._model_dir = model_dir

    def _summary_writer(self, kind: str):
        if kind not in self._writers:
            import tensorflow as tf  # Here: reading the file needs no TensorFlow.

            self._writers[kind] = tf.summary.create_file_writer(os.path.join(self._model_dir, kind))
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
        """Writes the run's settings (`hparam_values`) to TensorBoard's HParams plugin, so that
        `tensorboard --logdir runs` lists the runs in one table; `trial` names this one."""
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
    """A nested config as HParams values: "data.augment.flip" -> a bool, number or string
    (other values as their JSON text, None as "null")."""
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
    """A one-line progress bar with ETA, redrawn in place on a terminal `stream` (stderr);
    elsewhere nothing is drawn (the log records are the progress)."""

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
        """Ends the bar's line, if one is drawn, so other output starts afresh."""
        if self.interactive and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


def _parse_line(text: str) -> tuple[dict[str, Any] | None, bool]:
    """(the record on a line, whether it was the whole line): a run killed mid-write
    leaves a line unended, and the next run's "start" lands on it."""
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
    """The records of a `metrics.jsonl`, in order; what is not a complete record with an
    integer "step" is skipped, with one warning naming the lines."""
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
