"""The controller: compiled calls up to the next boundary, then the actions.

Before each call of the compiled multi-step function (`step.TrainStep.loop`)
the controller asks `LearningRate` for the rate of every step of the call, so
the optimizer's learning-rate variable is set before every step and the rate
logged is the one used. A call runs to the next boundary
(`cadence.next_boundary`): it never crosses a training record, an evaluation
or a checkpoint, and a save or stop waiting for the replicas to agree (model
averaging, see `sync.py`) ends it at the next average. At the boundary the
controller makes the training record when one is due (`train_metrics.Interval`)
and calls its actions in order (`actions.py`): they log, evaluate and save.

Image sizes. With progressive resizing (`data.progressive`) the plan gives
each step its size (`progressive.SizeSchedule`): a call never crosses a size
change, and the first call at a new size enters a new input stream at the
data position. The compiled loop is traced once per size (its input's shape
differs); an earlier size's trace is kept, so a rollback into it costs none.

Stopping: SIGTERM or SIGINT (`preemption.StopRequest`), or an action's
`Boundary.request_stop`, stops the run after the step in progress; on
several workers they agree between calls on the step to stop at. The stop is
a last boundary: the steps not yet recorded are, and the checkpointer saves.

A non-finite loss, or non-finite weights found before an evaluation or a
save, raises `divergence.DivergedError`; the trainer catches it around
`Controller.train`, rolls back (or fails with an error) and calls `train`
again from the step restored.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from absl import logging

from resnet_app.common import distribute
from resnet_app.engine import cadence, preemption
from resnet_app.engine.actions import Action, Boundary
from resnet_app.engine.divergence import DivergedError
from resnet_app.engine.setup import Run
from resnet_app.engine.step import LoopResult, TrainStep
from resnet_app.engine.sync import GlobalModel, SyncPolicy
from resnet_app.engine.train_metrics import Interval


class Controller:
    """Trains a run to its end, calling its actions at every boundary.

    Args:
      run: the run (restored).
      train_step: its compiled training step.
      policy: its sync policy.
      global_model: its `GlobalModel`.
      intervals: how often the loop logs, evaluates and saves.
      actions: called in order at every boundary.
      stop: the stop request signals set.

    Attributes:
      train_loss: the loss of the last training record (NaN before one).
      trained_examples: the examples trained on, over every call.
      started: when training started (`time.monotonic`), or None.
    """

    def __init__(
        self,
        run: Run,
        train_step: TrainStep,
        policy: SyncPolicy,
        global_model: GlobalModel,
        intervals: cadence.Intervals,
        actions: Sequence[Action],
        stop: preemption.StopRequest,
    ):
        self.run = run
        self.train_step = train_step
        self.policy = policy
        self.global_model = global_model
        self.intervals = intervals
        self.actions = list(actions)
        self.stop = stop
        self.multi_worker = distribute.is_multi_worker(run.strategy)
        self.interval = Interval()
        self.train_loss = math.nan
        self.trained_examples = 0.0
        self.started: float | None = None
        self._iterator = None

    def train(self, step: int, restored: bool) -> tuple[int, str | None]:
        """Trains from `step` to the end of the run, or until stopped.

        Args:
          step: the step training goes on from.
          restored: whether the state is a checkpoint of `step` (resumed or
            rolled back), rather than a fresh start.

        Returns:
          (the last step, why the run stopped before its end or None).

        Raises:
          DivergedError: when the loss or the weights are not finite.
        """
        self._enter(step, restored)
        while step < self.intervals.total:
            reason = self._stop_reason()
            if reason and self.policy.at_sync(step):
                self._call_actions(self._stop_boundary(step, reason))
                return step, reason
            # A stop between model averages waits for the next one.
            waiting = self.policy.next_sync(step) if reason else None
            dues = (action.next_due(step) for action in self.actions)
            resize = self.run.plan.sizes.next_change(step)
            stop_at = cadence.next_boundary(step, self.intervals, waiting, resize, *dues)
            self._enter_stream(step)
            rates = self.run.learning_rate.rates(step, stop_at)
            result = self._call(rates)
            if result.steps == 0:
                continue  # Stopped before its first step.
            step = self._advance(step, result)
            if not result.finite:
                raise DivergedError(step, "the loss")
            self.trained_examples += result.sums["examples"]
            self._call_actions(self._boundary(step, rates[: result.steps]))
        return step, None

    def interrupt(self) -> None:
        """Tells the actions that the steps since the last boundary are lost."""
        for action in self.actions:
            action.interrupt()

    def _enter(self, step: int, restored: bool) -> None:
        self._iterator = self._size = None
        self._enter_stream(step)
        self.interval.reset()
        if restored:
            self.global_model.restored(step)
        for action in self.actions:
            action.enter(step, restored)
        if self.started is None:
            self.started = time.monotonic()

    def _enter_stream(self, step: int) -> None:
        """The training stream at `step`'s image size, entered anew when the size changes."""
        size = self.run.plan.sizes.size_at(step)
        if self._iterator is not None and size == self._size:
            return
        if self._size is not None:
            logging.info("Progressive resizing: training at %d px from step %d", size, step)
        self._iterator = iter(self.run.train_dataset(size))
        self._size = size

    def _stop_reason(self) -> str | None:
        """Why to stop now, agreed by every worker (they must stop at the same step)."""
        reason = self.stop.signal_name
        if distribute.any_worker(self.run.strategy, reason is not None):
            return reason or "a signal on another worker"
        return None

    def _call(self, rates: list[float]) -> LoopResult:
        """One call of the compiled loop, one step per rate; its result joins the interval."""
        started = time.monotonic()
        # Within one machine, a stop request ends the call after its step
        # (with model averaging, after the next average).
        flag = None if self.multi_worker else self.stop.flag
        result = self.train_step.loop(
            self._iterator, rates, flag, pad_to=self.intervals.steps_per_loop
        )
        self.interval.add(result, time.monotonic() - started)
        return result

    def _advance(self, step: int, result: LoopResult) -> int:
        """Moves the step and data position past the steps a call ran; returns the step."""
        step += result.steps
        self.run.global_step.assign(step)
        self.run.data_position.assign_add(result.steps * self.run.config.train.batch_size)
        self.global_model.changed()
        return step

    def _record(self, step: int) -> dict:
        """The interval's training record, which starts a new interval."""
        run = self.run
        record = self.interval.take(
            step,
            epoch=step * run.config.train.batch_size / run.examples_per_epoch,
            # The rate of the interval's last step.
            learning_rate=run.learning_rate.rates(step - 1, step)[0],
        )
        self.train_loss = record["loss"]
        return record

    def _boundary(self, step: int, rates: list[float]) -> Boundary:
        due = cadence.due_at(step, self.intervals)
        return Boundary(step, due, rates, self._record(step) if due.log else None)

    def _stop_boundary(self, step: int, reason: str) -> Boundary:
        """The last boundary of a stopped run: the steps since the last record, and a save."""
        record = self._record(step) if self.interval.steps else None
        return Boundary(step, cadence.Due(checkpoint=True), record=record, stopping=reason)

    def _call_actions(self, boundary: Boundary) -> None:
        for action in self.actions:
            action(boundary)
        for action in self.actions:
            action.after(boundary)
        if boundary.stop_requested:
            self.stop.request(boundary.stop_requested)
