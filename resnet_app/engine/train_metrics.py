"""The training metrics of the steps since the last record, as one object (no TensorFlow).

The controller adds every compiled call's result (`add`); a record takes the
interval's, which starts the next (`take`); a rollback drops it (`reset`). A
result's sums (`step.TrainStep.names`) are "examples" (real ones), "loss" (the
summed loss terms), "correct", "regularization" (summed over steps) and, when
the loss has several terms, each term's share ("loss_<term>").
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

NOT_SHARES = ("examples", "loss", "correct", "regularization")


@dataclasses.dataclass(frozen=True)
class LoopResult:
    """One compiled call (`step.TrainStep.loop`): its steps, their sums, their input wait (s)."""

    steps: int
    sums: dict[str, float]
    input_wait: float = 0.0

    @property
    def finite(self) -> bool:
        return all(math.isfinite(v) for v in self.sums.values())


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
        self.sums: dict[str, float] = collections.defaultdict(float)
        self.input_wait, self.steps, self.seconds = 0.0, 0, 0.0

    def add(self, result: LoopResult, seconds: float) -> None:
        """Adds a call's result and the seconds it took (a call of 0 steps adds time)."""
        for name, value in result.sums.items():
            self.sums[name] += value
        self.input_wait += result.input_wait
        self.steps += result.steps
        self.seconds += seconds

    def take(self, step: int, epoch: float, learning_rate: float) -> dict[str, Any]:
        """The training record of the interval, which then starts anew, ending at `step`
        (at `epoch`, with `learning_rate` its last step's): "loss" is the mean loss per
        example plus the mean regularization per step, each term's share is per example,
        and "input_wait" is the fraction of the time the steps waited for their batches."""
        sums = self.sums
        examples = max(sums["examples"], 1.0)
        seconds = max(self.seconds, 1e-9)
        shares = {k: v / examples for k, v in sums.items() if k not in NOT_SHARES}
        record = {
            "step": step,
            "epoch": epoch,
            "loss": sums["loss"] / examples + sums["regularization"] / max(self.steps, 1),
            **shares,
            "accuracy": sums["correct"] / examples,
            "learning_rate": learning_rate,
            "examples_per_sec": sums["examples"] / seconds,
            "input_wait": min(self.input_wait / seconds, 1.0),
            "time": self._clock(),  # Wall clock, for rates that include the host.
        }
        self.reset()
        return record
