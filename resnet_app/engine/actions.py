"""The loop's periodic work, as actions the controller calls at every boundary.

A boundary is the step a compiled call ended at (`cadence.next_boundary`), or
the step a stop ends the run at. The controller builds a `Boundary` and calls
each action in the order `create_actions` gives; each leaves what it did on the
boundary for the next, and then every action's `after` hook sees it whole. A
new periodic behaviour is one more `Action`, not a flag threaded through the loop.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from absl import logging

from resnet_app.common import checkpoint, distribute, run_dir
from resnet_app.common.metrics import MetricsWriter, Progress, format_duration
from resnet_app.engine import exact_eval
from resnet_app.engine.cadence import Due
from resnet_app.engine.sync import GlobalModel, SyncPolicy

if TYPE_CHECKING:
    from resnet_app.engine.setup import Run

INPUT_BOUND_WAIT = 0.1  # The share of their time the steps may wait for data.
EVAL_SCALARS = ("top1", "top5", "loss")  # In TensorBoard, for the weights and their average.
# Also there when the data has them: single-label, multi-label.
LABEL_SCALARS = ("balanced_accuracy", "map", "f1_micro", "f1_macro")


@dataclasses.dataclass
class Boundary:
    """The end of a compiled call, as the actions see it.

    Attributes:
      step: the step the call ended at (the global step now).
      due: what is due at the step (`cadence.due_at`); at a stop, only a checkpoint.
      rates: the learning rate of each step the call ran (the last is `step`'s).
      record: the training record, when one was made here.
      stopping: at a stop, why (the signal's name); else None.
      evaluation: the evaluation record, once the evaluator made one.
      saved: whether the checkpointer saved at this step.
      save_requested: an action asked for a save at this step.
      stop_requested: an action asked the run to stop (the reason), or None.
    """

    step: int
    due: Due
    rates: Sequence[float] = ()
    record: dict[str, Any] | None = None
    stopping: str | None = None
    evaluation: dict[str, Any] | None = None
    saved: bool = False
    save_requested: bool = False
    stop_requested: str | None = None

    def request_save(self) -> None:
        """Asks the checkpointer to save at this step."""
        self.save_requested = True

    def request_stop(self, reason: str) -> None:
        """Asks the run to stop as a signal would (a checkpoint, then return); `reason`
        names it in the run's result and its "stopped" event."""
        self.stop_requested = self.stop_requested or reason


class Action:
    """Periodic work of the loop; every hook does nothing unless overridden."""

    def enter(self, step: int, restored: bool) -> None:
        """The loop starts at `step`, or again after a rollback; `restored`: from a
        checkpoint of `step` (resumed or rolled back) rather than a fresh start."""

    def next_due(self, step: int) -> int | None:
        """A step the next call must not run past, or None."""

    def __call__(self, boundary: Boundary) -> None:
        """The work at a boundary."""

    def after(self, boundary: Boundary) -> None:
        """Every action has done its work at the boundary: what they did is final."""

    def interrupt(self) -> None:
        """The steps since the last boundary are lost (a rollback follows)."""


def status(record: dict[str, Any]) -> str:
    """A training record in a few words, for the console."""
    return (
        f"loss {record['loss']:.4f} acc {record['accuracy']:.4f} "
        f"lr {record['learning_rate']:.4g} {record['examples_per_sec']:.0f} img/s"
    )


class Records(Action):
    """Every step's learning rate and each training record: to TensorBoard
    (`model_dir/train`) and `metrics.jsonl`, a warning once when training waits
    for its input (after a first record of warm-up), and with `progress` (the
    chief's) the progress bar, which measures the ETA, or a log line."""

    SCALARS = ("loss", "accuracy", "examples_per_sec", "input_wait")

    def __init__(self, writer: MetricsWriter, progress: Progress | None):
        self.writer, self.progress = writer, progress
        self.records, self.warned = 0, False

    def __call__(self, boundary: Boundary) -> None:
        step, record = boundary.step, boundary.record
        first = step - len(boundary.rates) + 1
        for index, rate in enumerate(boundary.rates, start=first):
            # Each step's rate, against the step count after it.
            self.writer.scalars(run_dir.TRAIN_EVENTS_DIR, index, {"learning_rate": rate})
        if record is not None:
            self.writer.write(record)
            scalars = {k: record[k] for k in self.SCALARS}
            self.writer.scalars(run_dir.TRAIN_EVENTS_DIR, step, scalars)
            self.writer.flush()
            self.records += 1
            wait = record["input_wait"]
            if self.records >= 2 and not self.warned and wait > INPUT_BOUND_WAIT:
                self.warned = True
                logging.warning(
                    "Training is input-bound: the steps waited for data %.0f%% of the time (at "
                    "%.0f images/s). Faster input: more CPU cores for tf.data, data on a faster "
                    "disk, or a smaller data.image_size; scripts/benchmark.py measures both sides",
                    100 * wait, record["examples_per_sec"],
                )  # fmt: skip
                self.writer.write({"step": step, "event": "input_bound", "input_wait": wait})
        if self.progress is None:
            return
        if boundary.due.log and record is not None:
            if self.progress.interactive:
                self.progress.update(step, status(record))
            else:
                eta = format_duration(self.progress.eta(step))
                total, epoch = self.progress.total, record["epoch"]
                logging.info(
                    "step %d/%d epoch %.2f: %s, ETA %s", step, total, epoch, status(record), eta
                )
        if boundary.due.evaluate:
            self.progress.finish()  # The evaluation's log lines start on a line of their own.

    def interrupt(self) -> None:
        if self.progress is not None:
            self.progress.finish()


class LrOverride(Action):
    """Applies `model_dir/lr_override` at every training record (the chief's, on every worker)."""

    def __init__(self, run: Run, writer: MetricsWriter):
        self.run, self.writer = run, writer

    def __call__(self, boundary: Boundary) -> None:
        if not boundary.due.read_override:
            return
        run, step = self.run, boundary.step
        applied = run.learning_rate.apply_override(run.model_dir) if run.chief else None
        # The chief's state and whether it changed, so every worker decides alike.
        *state, changed = distribute.broadcast_from_chief(
            run.strategy, [*run.learning_rate.state(), float(bool(applied))]
        )
        run.learning_rate.set_state(*state)
        if applied:
            logging.warning("Learning rate override from step %d on: %s", step + 1, applied)
            self.writer.write({"step": step, "event": "lr_override", "override": applied})
        if changed:
            boundary.request_save()  # The override survives a crash from here on.


class Evaluator(Action):
    """Evaluates the whole evaluation split when due, then asks for a save; `last` is
    the last evaluation record, or None."""

    def __init__(self, run: Run, writer: MetricsWriter, global_model: GlobalModel):
        self.run, self.writer, self.global_model = run, writer, global_model
        self.last: dict[str, Any] | None = None

    def __call__(self, boundary: Boundary) -> None:
        if boundary.due.evaluate:
            boundary.evaluation = self.evaluate(boundary.step)
            boundary.request_save()  # Every evaluation is saved.

    def evaluate(self, step: int) -> dict[str, Any]:
        """Evaluates the global model (and its moving average) at `step`, writes the record
        and returns it (DivergedError when the weights are not finite)."""
        self.global_model.ready(step)
        started = time.monotonic()
        run, train = self.run, self.run.config.train
        batch_size = train.eval_batch_size or train.batch_size

        def scores(model, split: str) -> dict[str, Any]:
            result = exact_eval.evaluate(
                model, run.pipeline, batch_size, run.strategy, threshold=train.threshold
            )
            return exact_eval.eval_record(step, split, result, train.precision)

        record = scores(run.model, run.pipeline.eval_split_name)
        keys = [k for k in (*EVAL_SCALARS, *LABEL_SCALARS) if k in record]
        self.writer.scalars(run_dir.EVAL_EVENTS_DIR, step, {k: record[k] for k in keys})
        if run.ema is not None:  # As ema_top1 ..., and TensorBoard's eval_ema run.
            ema = scores(run.ema.model, "")
            record.update({f"ema_{k}": ema[k] for k in keys})
            self.writer.scalars(run_dir.EMA_EVAL_EVENTS_DIR, step, {k: ema[k] for k in keys})
        # When it ended and what it cost: time-to-accuracy reads the crossing from these.
        record.update(time=time.time(), seconds=time.monotonic() - started)
        self.writer.write(record)
        self.writer.flush()
        self.last = record
        return record


class KeepBest(Action):
    """Keeps the checkpoint of the best evaluation so far in `model_dir/best/`.

    `train.best_by` and `best_direction` rank the evaluations. The best so far
    (`best`, the chief's) is read back from `best/best.json` whenever the loop
    starts, unless it ranks by another metric or direction. The chief decides,
    and every worker takes part in the save.
    """

    def __init__(self, run: Run):
        self.run = run
        train = run.config.train
        self.metric, self.direction = train.best_by, train.best_direction
        if run.pipeline.multi_label and train.best_metric is None:
            # Multi-label data ranks by mean average precision by default.
            self.metric, self.direction = ("ema_map" if train.keeps_average else "map"), "max"
        self.best: float | None = None
        self._candidate: dict[str, Any] | None = None

    def enter(self, step: int, restored: bool) -> None:
        self._candidate, self.best = None, None
        if not self.run.chief:
            return
        model_dir = self.run.model_dir
        checkpoint.recover_best(model_dir)
        found = run_dir.read_best(model_dir)
        if found is None:
            return
        path, record = found
        value, kept = record.get("value"), (record.get("metric"), record.get("mode"))
        if kept == (self.metric, self.direction) and isinstance(value, (int, float)):
            self.best = value
        else:
            logging.warning(
                "%s holds the best %s (%s); keeping the best %s (%s) from here on",
                path, *kept, self.metric, self.direction,
            )  # fmt: skip

    def __call__(self, boundary: Boundary) -> None:
        if boundary.evaluation is None:
            return
        better = self.run.chief and self.beats(boundary.evaluation[self.metric])
        # The chief's decision: every worker takes part in the save.
        [agreed] = distribute.broadcast_from_chief(self.run.strategy, [float(better)])
        if agreed:
            self._candidate = boundary.evaluation
            boundary.request_save()

    def beats(self, value: float | None) -> bool:
        """Whether `value` is finite and strictly better than the best so far."""
        if value is None or not math.isfinite(value):
            return False
        if self.best is None:
            return True
        return value > self.best if self.direction == "max" else value < self.best

    def after(self, boundary: Boundary) -> None:
        evaluation, self._candidate = self._candidate, None
        if evaluation is None or not self.run.chief:
            return
        value = evaluation[self.metric]
        record = {"metric": self.metric, "mode": self.direction, "value": value}
        try:
            prefix = checkpoint.keep_best(
                self.run.model_dir, boundary.step, {**record, "evaluation": evaluation}
            )
        except OSError as error:  # The run goes on; the previous best stays.
            logging.warning("Step %d not kept as the best checkpoint: %s", boundary.step, error)
            return
        self.best = value
        logging.info(
            "Best %s so far, %.4f at step %d: kept as %s", self.metric, value, boundary.step, prefix
        )


class Checkpointer(Action):
    """Saves a checkpoint when due or asked for, once the replicas hold the global
    model (under local SGD a save between averages waits for the next one). With
    `train.on_nan=rollback` a fresh start saves too, so that a rollback has a
    checkpoint to go back to."""

    def __init__(self, run: Run, policy: SyncPolicy, global_model: GlobalModel):
        self.checkpoints, self.policy, self.global_model = run.checkpoints, policy, global_model
        self.save_first = run.config.train.on_nan == "rollback"
        self.last_saved: int | None = None
        self.held = False  # A save waiting for the replicas to agree.

    def enter(self, step: int, restored: bool) -> None:
        self.held = False
        self.last_saved = step if restored else None
        if self.save_first and not restored:
            self.save(step)  # Something to roll back to.

    def next_due(self, step: int) -> int | None:
        return self.policy.next_sync(step) if self.held else None

    def __call__(self, boundary: Boundary) -> None:
        step = boundary.step
        if not (boundary.due.checkpoint or boundary.save_requested or self.held):
            return
        if not self.policy.at_sync(step):
            self.held = True  # Saved at the next average.
            return
        self.held = False
        if self.last_saved != step:
            self.save(step)
            boundary.saved = True

    def save(self, step: int) -> None:
        """Saves the global model of `step` (DivergedError when it is not finite)."""
        self.global_model.ready(step)
        self.checkpoints.save(step)
        self.last_saved = step


def create_actions(
    run: Run,
    writer: MetricsWriter,
    policy: SyncPolicy,
    global_model: GlobalModel,
    start: int,
    extra: Sequence[Action] = (),
) -> tuple[list[Action], Evaluator]:
    """The trainer's actions in order: the records, the learning-rate override, the
    evaluator, keep-best, `extra`, and the checkpointer last; and the evaluator
    (the run's summary is its last record). `start` is the first step, for the ETA."""
    progress = Progress(run.plan.total_steps, start) if run.chief else None
    evaluator = Evaluator(run, writer, global_model)
    best = [KeepBest(run)] if run.config.train.keep_best else []
    actions = [Records(writer, progress), LrOverride(run, writer), evaluator, *best, *extra]
    return [*actions, Checkpointer(run, policy, global_model)], evaluator
