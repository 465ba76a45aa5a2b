"""The controller: compiled calls up to the next boundary, then the actions.

Each call of the compiled loop (`step.TrainStep.loop`) gets its steps' rates from
`LearningRate` and stops at the next boundary (`cadence.next_boundary`): a record,
an evaluation, a save, an image-size change (a new stream) or the average a waiting
save or stop needs; the actions (`actions.py`) run there. A signal or an action's
`request_stop` stops the run after the step in progress, at a step the workers
agree on; a non-finite loss raises `DivergedError`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

from absl import logging

from resnet_app.common import distribute
from resnet_app.engine import cadence, preemption
from resnet_app.engine.actions import Action, Boundary
from resnet_app.engine.divergence import DivergedError
from resnet_app.engine.setup import Run
from resnet_app.engine.step import TrainStep
from resnet_app.engine.sync import GlobalModel, SyncPolicy
from resnet_app.engine.train_metrics import Interval


@dataclasses.dataclass(eq=False)
class Controller:
    """Trains a run to its end, calling its actions at every boundary; keeps the last
    record's `train_loss`, the `trained_examples` and when it `started` (monotonic)."""

    run: Run
    train_step: TrainStep
    policy: SyncPolicy
    global_model: GlobalModel
    intervals: cadence.Intervals
    actions: Sequence[Action]
    stop: preemption.StopRequest
    train_loss: float = math.nan
    trained_examples: float = 0.0
    started: float | None = None

    def __post_init__(self):
        self.actions = list(self.actions)
        self.multi_worker = distribute.is_multi_worker(self.run.strategy)
        self.interval = Interval()

    def train(self, step: int, restored: bool) -> tuple[int, str | None]:
        """Trains from `step` (`restored`: a checkpoint of it) to the end or a stop;
        returns (the last step, why it stopped early or None). Raises `DivergedError`."""
        iterator = size = None
        self.interval.reset()
        if restored:
            self.global_model.restored(step)
        for action in self.actions:
            action.enter(step, restored)
        self.started = self.started or time.monotonic()
        while step < self.intervals.total:
            reason = self._stop_reason()
            if reason and self.policy.at_sync(step):
                # The last boundary: the steps since the last record, and a save.
                record = self._record(step) if self.interval.steps else None
                due = cadence.Due(checkpoint=True)
                self._call_actions(Boundary(step, due, record=record, stopping=reason))
                return step, reason
            # A stop between model averages waits for the next one.
            waiting = self.policy.next_sync(step) if reason else None
            dues = (action.next_due(step) for action in self.actions)
            resize = self.run.plan.sizes.next_change(step)
            stop_at = cadence.next_boundary(step, self.intervals, waiting, resize, *dues)
            new_size = self.run.plan.sizes.size_at(step)
            if new_size != size:  # The first call, or a new image size: a new stream.
                if size is not None:
                    logging.info(
                        "Progressive resizing: training at %d px from step %d", new_size, step
                    )
                size, iterator = new_size, iter(self.run.train_dataset(new_size))
            rates = self.run.learning_rate.rates(step, stop_at)
            started = time.monotonic()
            # On one machine the loop reads the stop flag before every step (with model
            # averaging, it stops at the next average); workers agree between calls.
            flag = None if self.multi_worker else self.stop.flag
            result = self.train_step.loop(
                iterator, rates, flag, pad_to=self.intervals.steps_per_loop
            )
            self.interval.add(result, time.monotonic() - started)
            if result.steps == 0:
                continue  # Stopped before its first step.
            step += result.steps
            self.run.global_step.assign(step)
            self.run.data_position.assign_add(result.steps * self.run.config.train.batch_size)
            self.global_model.changed()
            if not result.finite:
                raise DivergedError(step, "the loss")
            self.trained_examples += result.sums["examples"]
            due = cadence.due_at(step, self.intervals)
            record = self._record(step) if due.log else None
            self._call_actions(Boundary(step, due, rates[: result.steps], record))
        return step, None

    def interrupt(self) -> None:
        """Tells the actions that the steps since the last boundary are lost."""
        for action in self.actions:
            action.interrupt()

    def _stop_reason(self) -> str | None:
        """Why to stop now, agreed by every worker."""
        reason = self.stop.signal_name
        if distribute.any_worker(self.run.strategy, reason is not None):
            return reason or "a signal on another worker"
        return None

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

    def _call_actions(self, boundary: Boundary) -> None:
        for action in self.actions:
            action(boundary)
        for action in self.actions:
            action.after(boundary)
        if boundary.stop_requested:
            self.stop.request(boundary.stop_requested)
