"""The training metrics of the steps since the last record, as one object.

The controller adds every compiled call's result (`add`); when a record is due
it takes the record of the interval, which starts the next one (`take`); a
rollback drops the interval (`reset`). A call's result gives the sums of the
metrics over its steps (see `step.LoopResult`): "examples" (real ones),
"loss" (the summed cross-entropy), "correct" and "regularization" (summed
over steps), and the seconds its steps waited for their batches.

No TensorFlow here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

# The metrics a call of the compiled step sums over its steps, in the order
# `step.TrainStep` packs them.
SUMS = ("examples", "loss", "correct", "regularization")


class CallResult(Protocol):
    """What `Interval.add` reads of a compiled call's result (`step.LoopResult`)."""

    steps: int
    sums: dict[str, float]
    input_wait: float


class Interval:
    """Metric sums, steps and time since the last training record.

    Args:
      clock: wall-clock seconds for the records' "time" (Unix seconds).
    """

    def __init__(self, clock: Callable[[], float] = time.time):
        self._clock = clock
        self.reset()

    def reset(self) -> None:
        """Starts an empty interval."""
        self.sums = dict.fromkeys(SUMS, 0.0)
        self.input_wait = 0.0
        self.steps = 0
        self.seconds = 0.0

    def add(self, result: CallResult, seconds: float) -> None:
        """Adds a call's result and the seconds the call took (a call of 0 steps adds time)."""
        for name in SUMS:
            self.sums[name] += result.sums[name]
        self.input_wait += result.input_wait
        self.steps += result.steps
        self.seconds += seconds

    def record(self, step: int, epoch: float, learning_rate: float) -> dict[str, Any]:
        """The training record of the interval, ending at `step`.

        Args:
          step: the interval's last step.
          epoch: the epochs trained at `step`.
          learning_rate: the rate of the interval's last step.

        Returns:
          {"step", "epoch", "loss" (the mean cross-entropy over the interval's
          examples plus the mean regularization per step), "accuracy",
          "learning_rate", "examples_per_sec", "input_wait" (the fraction of
          the time the steps waited for their batches), "time"}.
        """
        examples = max(self.sums["examples"], 1.0)
        seconds = max(self.seconds, 1e-9)
        return {
            "step": step,
            "epoch": epoch,
            "loss": self.sums["loss"] / examples + self.sums["regularization"] / max(self.steps, 1),
            "accuracy": self.sums["correct"] / examples,
            "learning_rate": learning_rate,
            "examples_per_sec": self.sums["examples"] / seconds,
            "input_wait": min(self.input_wait / seconds, 1.0),
            "time": self._clock(),  # Wall clock, for rates that include the host.
        }

    def take(self, step: int, epoch: float, learning_rate: float) -> dict[str, Any]:
        """The interval's `record`, then a new empty interval."""
        record = self.record(step, epoch, learning_rate)
        self.reset()
        return record
