"""The learning rate a run feeds its optimizer: the schedule, plus live control.

The loop asks `rates(start, stop)` for every step of the next compiled call and
assigns each to the optimizer's learning-rate variable before its step.

Live control: write a rate (`0.01`) or a multiplier (`x0.1`) into
`model_dir/lr_override`; at the next training record `apply_override` reads it
and renames it `lr_override.applied`. A rate replaces the schedule; multipliers
scale whatever is in force, and compound. The state is two variables, saved in
every checkpoint, so a resumed run keeps it.
"""

from __future__ import annotations

import codecs
import math
import os

import tensorflow as tf
from absl import logging

from resnet_app.common import run_dir
from resnet_app.common.errors import first_line
from resnet_app.config.schedule_kinds import Schedule

OVERRIDE_FILE = run_dir.LR_OVERRIDE_FILE  # The name callers and tests know it by.


class LearningRate:
    """The schedule (called with `steps_per_epoch`) and the override state; create it
    in `strategy.scope()`."""

    def __init__(self, schedule: Schedule, steps_per_epoch: int):
        self.schedule = schedule
        self.steps_per_epoch = steps_per_epoch
        # NaN: no fixed rate, follow the schedule. Either way, times `scale`.
        self.value = tf.Variable(math.nan, dtype=tf.float64, trainable=False, name="lr_value")
        self.scale = tf.Variable(1.0, dtype=tf.float64, trainable=False, name="lr_scale")
        self._stuck: tuple | None = None  # An override that could not be consumed.

    def state(self) -> tuple[float, float]:
        """(fixed value or NaN, scale)."""
        return float(self.value.numpy()), float(self.scale.numpy())

    def set_state(self, value: float, scale: float) -> None:
        self.value.assign(value)
        self.scale.assign(scale)

    def rates(self, start: int, stop: int) -> list[float]:
        """The learning rate of each step in [start, stop)."""
        value, scale = self.state()
        if not math.isnan(value):
            return [value * scale] * (stop - start)
        return [self.schedule(s, self.steps_per_epoch) * scale for s in range(start, stop)]

    def apply_override(self, model_dir: str) -> str | None:
        """Reads and consumes `model_dir/lr_override`; returns what was applied, for the
        log, or None (also for an empty file, perhaps still being written: read next time)."""
        path = run_dir.lr_override_path(model_dir)
        if not os.path.exists(path):
            return None
        try:
            text = _read_text(path).strip()
        except (OSError, UnicodeDecodeError) as error:
            text = None
            reason = first_line(error, with_type=True)
        if text == "":
            return None
        # Consumed whatever it holds, so that a bad file is reported once. One
        # that cannot be consumed is not applied: read again at every interval,
        # a multiplier would compound.
        try:
            os.replace(path, os.path.join(model_dir, run_dir.LR_OVERRIDE_APPLIED))
        except OSError as error:
            seen = _identity(path)
            if seen == self._stuck:
                return None  # Reported already; reported again once it changes.
            self._stuck = seen
            return _ignored(
                path,
                "it cannot be renamed to %s once read (%s), so it would apply again at every "
                "interval; remove it and write it again",
                run_dir.LR_OVERRIDE_APPLIED,
                first_line(error, with_type=True),
            )
        if text is None:
            return _ignored(
                path,
                "it cannot be read as text (%s); write a rate (0.01) or a multiplier (x0.1) as "
                "plain text",
                reason,
            )
        value, scale = self.state()
        try:
            if text.lower().startswith("x"):
                factor = float(text[1:])
                if not (factor > 0 and math.isfinite(factor)):
                    raise ValueError(text)
                self.set_state(value, scale * factor)
                return f"multiplier {factor:g} (now x{scale * factor:g})"
            fixed = float(text)
            if not (fixed >= 0 and math.isfinite(fixed)):
                raise ValueError(text)
            self.set_state(fixed, 1.0)
            return f"fixed rate {fixed:g}"
        except ValueError:
            why = "%r is neither a learning rate (0.01) nor a multiplier (x0.1)"
            return _ignored(path, why, text)


def _ignored(path: str, why: str, *args) -> None:
    """Logs that the override file at `path` was not applied, and `why`."""
    logging.error("Ignored %s: " + why, path, *args)


def _identity(path: str) -> tuple | None:
    """The file at `path` as (inode, size, mtime): another write makes another identity."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_ino, found.st_size, found.st_mtime_ns


def _read_text(path: str) -> str:
    """The file's text: UTF-8 (with or without a BOM), or UTF-16 with its BOM (Notepad's)."""
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return data.decode("utf-16")
    return data.decode("utf-8-sig")
