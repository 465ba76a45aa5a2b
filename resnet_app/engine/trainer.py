"""The training loop: `train_and_evaluate(config, model_dir)`.

The loop owns the host side of training. Before each call of the compiled
multi-step function (`step.TrainStep.loop`) it asks `LearningRate` for the
rate of every step of the call, so the optimizer's LR variable is set before
every step, and the rate logged is the one used. A call never crosses a log,
evaluation or checkpoint step. The loop logs every `log_every` steps (and
reads `model_dir/lr_override` then), evaluates every `eval_every` steps and
at the end, and saves a checkpoint every `checkpoint_every` steps, at every
evaluation, after a learning-rate override, when stopped and at the end.

A checkpoint holds the model (with BatchNorm moving statistics), the optimizer
(slots and iterations), the global step, the data position (examples consumed
since the start of epoch 0, which gives the epoch and the position within it),
the learning-rate override state and the number of replicas. Training uses no
stateful random numbers: the data order and augmentation are functions of
(seed, epoch, example), so the seed in the config and the data position
reproduce the data from any point.

Resuming: a run directory that holds a checkpoint continues from the newest
readable one (`checkpoint.find_latest`). The data stream is entered at the
saved position (see `input_pipeline.py`), so no example is skipped or repeated across
the restart; with `train.deterministic` the resumed run is bitwise the
uninterrupted one. Before resuming, the settings are compared with the run's
`config.yaml`: a change of what the run computes is refused
(`config.RESUMABLE_CHANGES` lists the others) unless allowed.

Stopping: SIGTERM or SIGINT stops the run after the step in progress; it saves
a checkpoint and returns (see `preemption.py`). A non-finite loss stops the
run with an error naming the step, or with `train.on_nan=rollback` restores the
last good checkpoint, lowers the learning rate and goes on. A checkpoint with
non-finite weights is never written.

Model averaging (`sync.mode: model_average`, see `averaging.py`): the replicas'
copies are the global model only right after an average, so that is where
the loop evaluates and saves. `eval_every` and `checkpoint_every` are rounded
up to multiples of the interval; a stop request or an LR override's save that
comes between averages waits for the next one (at most interval - 1 steps);
and a run whose length is not a multiple of the interval averages once more
at its last step. A checkpoint therefore always holds identical copies, and
resuming from it is exactly the uninterrupted run. (Extending a finished run
whose length was not a multiple of the interval goes on from that last
average, which a longer uninterrupted run would not have made.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from typing import Any

import keras
import tensorflow as tf
from absl import logging

from resnet_app import config as config_lib
from resnet_app.common import checkpoint, distribute
from resnet_app.common.errors import ConfigError
from resnet_app.common.metrics import MetricsWriter, Progress, format_duration
from resnet_app.config import CONFIG_FILE, Config, write_yaml
from resnet_app.data import input_pipeline
from resnet_app.engine import averaging, optim, preemption, schedules
from resnet_app.engine.learning_rate import LearningRate
from resnet_app.engine.step import METRICS, LoopResult, TrainStep
from resnet_app.nets import factory
from resnet_app.nets.presets import get_config
from resnet_app.serving import evaluation


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """The length of a run and its learning-rate schedule.

    Attributes:
      steps_per_epoch: whole steps per epoch (what epoch units in schedules use).
      total_steps: the run's length in steps.
      schedule: f(step, steps_per_epoch) -> learning rate.
    """

    steps_per_epoch: int
    total_steps: int
    schedule: schedules.Schedule


def plan_run(config: Config, examples_per_epoch: int) -> RunPlan:
    """Works out the run's length and schedule, and tries the schedule.

    Args:
      config: the resolved config.
      examples_per_epoch: training examples per epoch.

    Raises:
      ConfigError: for a bad optimizer config, or a schedule that fails or is 0
        throughout.
    """
    train = config.train
    steps_per_epoch = max(1, examples_per_epoch // train.batch_size)
    total_steps = train.train_steps or math.ceil(
        train.epochs * examples_per_epoch / train.batch_size
    )
    schedule = schedules.create_schedule(
        config.schedule,
        base_lr=optim.check_optimizer_config(config.optimizer)["learning_rate"],
        global_batch_size=train.batch_size,
        total_steps=total_steps,
    )
    rates = schedules.check_schedule(schedule, steps_per_epoch, total_steps)
    if not any(rates.values()):
        raise ConfigError(
            f"the learning rate is 0 at every step tried over the {total_steps} steps (is a "
            "warmup longer than the run?); lengthen the run or shorten schedule.warmup_*"
        )
    if config.schedule.get("name") == "piecewise":
        unit = steps_per_epoch if config.schedule.get("unit") == "epochs" else 1
        late = [b for b in config.schedule["boundaries"] if round(b * unit) >= total_steps]
        if late:
            logging.warning(
                "Schedule boundaries %s fall at or after the end of the run (%d steps) and "
                "never apply; set schedule.boundaries for this length",
                late,
                total_steps,
            )
    return RunPlan(steps_per_epoch, total_steps, schedule)


@dataclasses.dataclass
class RunResult:
    """What `train_and_evaluate` returns.

    Attributes:
      summary: the final evaluation record plus "train_loss" (the last logged
        training loss) and "examples_per_sec" (over the whole run); for a
        stopped run, {"step", "stopped": the signal's name}.
      model: the trained model (moving statistics averaged over towers).
      stopped: the signal that stopped the run before its end, or None.
    """

    summary: dict[str, Any]
    model: keras.Model
    stopped: str | None = None


def train_and_evaluate(
    config: Config, model_dir: str, restart: bool = False, allow_config_change: bool = False
) -> RunResult:
    """Trains and evaluates `config`, writing everything to `model_dir`.

    Args:
      config: the resolved config.
      model_dir: the run directory (created if needed). If it holds a
        checkpoint, training resumes from it.
      restart: start over: move the directory's contents aside first.
      allow_config_change: resume even if settings that change what the run
        computes differ from the run's.

    Returns:
      The `RunResult`.

    Raises:
      ConfigError: for settings that do not fit the data or machine, a run
        directory holding another model or other settings, unreadable
        checkpoints, or a diverged run.
    """
    return Trainer(config, model_dir, restart, allow_config_change).run()


# A training record whose steps waited for data longer than this fraction of
# their time is input-bound.
INPUT_BOUND_WAIT = 0.1


class _DivergedError(Exception):
    """`what` ("the loss" or "the weights") went non-finite at `step`."""

    def __init__(self, step: int, what: str):
        super().__init__(step, what)
        self.step = step
        self.what = what


class Trainer:
    """One run: the strategy, data, model, optimizer and their checkpoint.

    Args:
      config: the resolved config.
      model_dir: the run directory.
      restart: move the directory's contents aside and start over.
      allow_config_change: resume despite changed settings.
    """

    def __init__(
        self,
        config: Config,
        model_dir: str,
        restart: bool = False,
        allow_config_change: bool = False,
    ):
        self.config = config
        self.model_dir = model_dir
        train = config.train
        optimizer_config = optim.check_optimizer_config(config.optimizer)  # Before loading.
        if train.deterministic:
            tf.config.experimental.enable_op_determinism()
        self.strategy = strategy = distribute.create_strategy(train.num_towers)
        replicas = strategy.num_replicas_in_sync
        if train.batch_size % replicas:
            raise ConfigError(
                f"train.batch_size={train.batch_size} is not divisible by the {replicas} "
                f"towers; use a multiple of {replicas}"
            )
        self.chief = distribute.is_chief(strategy)

        self.preset = preset = get_config(config.model_name, **config.model_overrides)
        if (
            train.jit
            and preset.bn_synchronized
            and not isinstance(strategy, tf.distribute.OneDeviceStrategy)
        ):
            raise ConfigError(
                "train.jit cannot compile model.bn_synchronized: its all-reduce across towers "
                "cannot run inside XLA; drop one of them"
            )
        self.pipeline = input_pipeline.create_pipeline(
            config.data, default_image_size=preset.default_image_size
        )
        self.plan = plan_run(config, self.pipeline.num_train_examples)
        if optimizer_config["class"] == "adamw" and preset.weight_decay:
            logging.warning(
                "adamw decays the weights itself, and model.weight_decay=%g adds an L2 "
                "penalty on top; set model.weight_decay=0 unless both are meant",
                preset.weight_decay,
            )
        # Only now that the data and schedule are known to work.
        if restart and self.chief:
            aside = checkpoint.move_aside(model_dir)
            if aside:
                logging.warning("--restart: moved the previous run to %s", aside)
        os.makedirs(model_dir, exist_ok=True)
        # Every worker reads the chief's directory (a shared filesystem).
        self.resume_from = None if restart else checkpoint.find_latest(model_dir)
        self.config_changes: dict[str, tuple[Any, Any]] = {}
        if self.resume_from:
            self._check_settings(allow_config_change)

        # Model averaging with one replica would be the all-reduce run.
        average = config.sync.mode == "model_average" and replicas > 1
        keras.utils.set_random_seed(train.seed)
        with strategy.scope():
            with averaging.local_variables() if average else contextlib.nullcontext():
                factory.check_num_classes(config, self.pipeline.num_classes)
                self.model = factory.create_run_model(
                    config,
                    self.pipeline.num_classes,
                    self.pipeline.preprocessing.image_size,
                    train.precision,
                )
                self.optimizer = optim.create_optimizer(optimizer_config)
                if train.precision == "fp16":
                    self.optimizer = keras.optimizers.LossScaleOptimizer(self.optimizer)
                self.optimizer.build(self.model.trainable_variables)
            self.learning_rate = LearningRate(self.plan.schedule, self.plan.steps_per_epoch)
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
            self.data_position = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="data_position"
            )
            self.num_replicas = tf.Variable(
                replicas, dtype=tf.int64, trainable=False, name="num_replicas"
            )
            self.rollback_count = tf.Variable(0, dtype=tf.int64, trainable=False, name="rollbacks")
        # The settings each checkpoint was trained with, for the resume guard.
        self.saved_config = tf.Variable(config_lib.to_yaml(config), trainable=False, name="config")
        self.checkpoints = checkpoint.RunCheckpoint(
            model_dir,
            chief=self.chief,
            max_to_keep=train.keep_checkpoints,
            keep_every_n_hours=train.keep_checkpoint_every_n_hours,
            worker=distribute.worker_index(strategy),
            model=self.model,
            optimizer=self.optimizer,
            global_step=self.global_step,
            data_position=self.data_position,
            num_replicas=self.num_replicas,
            rollbacks=self.rollback_count,
            config=self.saved_config,
            lr_value=self.learning_rate.value,
            lr_scale=self.learning_rate.scale,
        )
        self.averaging = None
        if average:
            self.averaging = averaging.ModelAveraging(
                self.model, self.optimizer, strategy, config.sync.interval
            )
            # The moving statistics are averaged with the weights, and evaluations
            # and saves happen right after an average: nothing left to sync.
            self.sync_statistics = lambda: None
        else:
            self.sync_statistics = distribute.moving_statistics_sync(self.model, strategy)
        self.writer = MetricsWriter(model_dir, enabled=self.chief)
        self._intervals_logged, self._warned_input_bound = 0, False

    # -- resuming ----------------------------------------------------------------

    def _check_settings(self, allow: bool) -> None:
        """Compares the settings with the checkpoint's; refuses a change of what it computes."""
        step, prefix = self.resume_from
        old = config_lib.from_yaml(
            checkpoint.read_value(prefix, "config").decode(), f"the config saved in {prefix}"
        )
        self.config_changes = changes = config_lib.changes(old, self.config)
        refused = [key for key in changes if key not in config_lib.RESUMABLE_CHANGES]
        explanations = [f"{key} {changes[key][0]!r} -> {changes[key][1]!r}" for key in refused]
        if not refused:
            # The same schedule may give other rates for another length (cosine):
            # then the steps already run, and the next one, were not this run's.
            old_plan = plan_run(old, self.pipeline.num_train_examples)
            for s in range(0, step + 1, max(1, step // 4000)):
                before = old_plan.schedule(s, old_plan.steps_per_epoch)
                after = self.plan.schedule(s, self.plan.steps_per_epoch)
                if not math.isclose(before, after, rel_tol=1e-9, abs_tol=1e-15):
                    explanations.append(
                        f"the learning rate at step {s} {before:.6g} -> {after:.6g} (the "
                        "schedule depends on the run's length)"
                    )
                    break
        saved_replicas = checkpoint.read_value(prefix, "num_replicas")
        replicas = self.strategy.num_replicas_in_sync
        if saved_replicas is not None and int(saved_replicas) != replicas:
            if self.config.sync.mode == "model_average":
                batch = self.config.train.batch_size
                explanations.append(
                    f"replicas {int(saved_replicas)} -> {replicas} (with model averaging each "
                    f"replica trains alone on {batch // int(saved_replicas)} -> "
                    f"{batch // replicas} examples per step)"
                )
            elif not self.preset.bn_synchronized:
                batch = self.config.train.batch_size
                explanations.append(
                    f"replicas {int(saved_replicas)} -> {replicas} (each BatchNorm normalizes "
                    f"over {batch // int(saved_replicas)} -> {batch // replicas} examples)"
                )
            changes["replicas"] = (int(saved_replicas), replicas)
        if explanations and not allow:
            raise ConfigError(
                f"cannot resume {self.model_dir} from step {step}: these settings differ from "
                f"the run's: {'; '.join(explanations)}. Rerun with the run's settings (give "
                "--model_dir alone to reuse them), or pass --restart to start over, or "
                "--allow_config_change"
            )
        if explanations:
            logging.warning("--allow_config_change: resuming despite %s", "; ".join(explanations))
        elif changes:
            logging.info(
                "Settings changed on resume: %s",
                "; ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items()),
            )

    def restore(self, prefix: str | None, verb: str = "Resumed from") -> int:
        """Restores a checkpoint (None: none, a fresh start); returns the step."""
        if prefix:
            self.checkpoints.restore(prefix)
            # What this run is: its next checkpoints are saved with these.
            self.num_replicas.assign(self.strategy.num_replicas_in_sync)
            self.saved_config.assign(config_lib.to_yaml(self.config))
        step = int(self.global_step.numpy())
        steps = distribute.gather_from_workers(self.strategy, step)
        if min(steps) != max(steps):
            raise ConfigError(
                f"the workers resumed from different steps {sorted(set(steps))}: every "
                f"worker must see the chief's checkpoints, so put --model_dir on a shared "
                "filesystem"
            )
        if prefix:
            epoch, position = divmod(int(self.data_position.numpy()), self._examples_per_epoch)
            logging.info(
                "%s step %d (epoch %d, example %d of %d) from %s",
                verb,
                step,
                epoch,
                position,
                self._examples_per_epoch,
                prefix,
            )
        return step

    @property
    def _examples_per_epoch(self) -> int:
        return self.pipeline.num_train_examples

    def check_finite(self, step: int) -> None:
        """Raises `_DivergedError` if a weight is not finite (on any worker: all raise)."""
        self.sync_statistics()  # Per-tower statistics differ until averaged.
        finite = self.checkpoints.finite()
        if distribute.is_multi_worker(self.strategy):
            finite = min(distribute.gather_from_workers(self.strategy, float(finite))) > 0
        if not finite:
            raise _DivergedError(step, "the weights")

    def save(self, step: int) -> None:
        """Saves a checkpoint; raises `_DivergedError` instead if the weights are not finite."""
        self.check_finite(step)
        self.checkpoints.save(step)

    # -- evaluation and logging --------------------------------------------------

    def evaluate(self, step: int) -> dict[str, Any]:
        """Evaluates the whole split and writes the record."""
        self.sync_statistics()
        train = self.config.train
        result = evaluation.evaluate(
            self.model,
            self.pipeline,
            train.eval_batch_size or train.batch_size,
            self.strategy,
        )
        record = {
            "step": step,
            "split": self.pipeline.eval_split_name,
            "top1": result.accuracy,
            "top5": result.top5_accuracy,
            "loss": result.loss,
            "num_examples": result.examples,
        }
        self.writer.write(record)
        self.writer.scalars("eval", step, {k: record[k] for k in ("top1", "top5", "loss")})
        self.writer.flush()
        return record

    def _read_override(self, step: int) -> bool:
        """Applies a live LR override (the chief's, on every worker); True if one came."""
        applied = self.learning_rate.apply_override(self.model_dir) if self.chief else None
        # The chief's state and whether it changed, so every worker decides alike.
        *state, changed = distribute.broadcast_from_chief(
            self.strategy, [*self.learning_rate.state(), float(bool(applied))]
        )
        self.learning_rate.set_state(*state)
        if applied:
            logging.warning("Learning rate override from step %d on: %s", step + 1, applied)
            self.writer.write({"step": step, "event": "lr_override", "override": applied})
        return bool(changed)

    def _roll_back(self, diverged: _DivergedError) -> int:
        """Handles divergence: an error, or a rollback; returns the step rolled back to."""
        train, step = self.config.train, diverged.step
        latest = checkpoint.find_latest(self.model_dir)
        kept = f"the last good checkpoint is {latest[1]}" if latest else "no checkpoint was written"
        if train.on_nan != "rollback":
            raise ConfigError(
                f"training diverged: {diverged.what} is not finite at step {step}; {kept}. Lower "
                "the learning rate (optimizer.learning_rate), or rerun with --on_nan=rollback"
            )
        count = int(self.rollback_count.numpy())
        if latest is None or count >= config_lib.MAX_ROLLBACKS:
            raise ConfigError(
                f"training diverged at step {step} after {count} rollback(s) (at most "
                f"{config_lib.MAX_ROLLBACKS}); {kept}. Lower the learning rate "
                "(optimizer.learning_rate)"
            )
        scale = self.learning_rate.state()[1]
        self.restore(latest[1], verb="Rolled back to")
        value, restored_scale = self.learning_rate.state()
        # A second rollback to the same checkpoint lowers the rate further. The
        # new rate is saved with the next checkpoint; the one rolled back to is
        # not rewritten (a crash while overwriting it would lose it).
        new_scale = min(scale, restored_scale) * train.nan_lr_factor
        self.learning_rate.set_state(value, new_scale)
        self.rollback_count.assign(count + 1)
        logging.error(
            "ROLLBACK %d/%d: %s is not finite at step %d; restored step %d from %s and "
            "multiplied the learning rate by %g (now x%g of the schedule)",
            count + 1,
            config_lib.MAX_ROLLBACKS,
            diverged.what,
            step,
            latest[0],
            latest[1],
            train.nan_lr_factor,
            new_scale,
        )
        self.writer.write(
            {"step": step, "event": "rollback", "to_step": latest[0], "lr_scale": new_scale}
        )
        return latest[0]

    # -- the loop ----------------------------------------------------------------

    def _train_dataset(self) -> tf.distribute.DistributedDataset:
        global_batch = self.config.train.batch_size
        replicas = self.strategy.num_replicas_in_sync
        start_example = int(self.data_position.numpy())

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            dataset = self.pipeline.train_dataset(
                global_batch,
                start_example=start_example,
                num_shards=context.num_input_pipelines,
                shard_index=context.input_pipeline_id,
            )
            if replicas > context.num_input_pipelines:
                # Each local replica takes its consecutive slice of the worker's batch.
                dataset = dataset.rebatch(global_batch // replicas)
            # The next batches are ready (and sliced) before the step asks for them.
            return dataset.prefetch(tf.data.AUTOTUNE)

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def run(self) -> RunResult:
        """Trains to the end of the plan, evaluating and saving on the way."""
        with preemption.StopRequest() as stop:
            try:
                return self._run(stop)
            finally:
                self.writer.close()
                self.checkpoints.close()

    def _run(self, stop: preemption.StopRequest) -> RunResult:
        train, plan = self.config.train, self.plan
        total = plan.total_steps
        eval_every = train.eval_every or plan.steps_per_epoch
        checkpoint_every = train.checkpoint_every or eval_every
        if self.averaging is not None:
            eval_every = self._at_averages("eval_every", eval_every)
            checkpoint_every = self._at_averages("checkpoint_every", checkpoint_every)
        steps_per_loop = train.steps_per_loop or train.log_every
        multi_worker = distribute.is_multi_worker(self.strategy)
        start = self.restore(self.resume_from[1] if self.resume_from else None)
        if self.chief:  # Once resumed: the file describes the run from here on.
            write_yaml(self.config, os.path.join(self.model_dir, CONFIG_FILE))
            input_pipeline.write_data_info(self.pipeline, self.model_dir)
        if self.config_changes:
            self.writer.write(
                {
                    "step": start,
                    "event": "config_change",
                    "changes": {k: list(v) for k, v in self.config_changes.items()},
                }
            )
        step_fn = TrainStep(
            self.model,
            self.optimizer,
            self.strategy,
            train.label_smoothing,
            jit=train.jit,
            time_input=not train.deterministic,
            averaging=self.averaging,
        )
        iterator = iter(self._train_dataset())
        progress = Progress(total, start) if self.chief else None
        logging.info(
            "Training %s on %s: %d steps (%.2f epochs of %d examples), global batch %d on %d "
            "replica(s), evaluating on %s every %d steps; run directory %s",
            self.config.model_name,
            self.config.data.dataset,
            total,
            total * train.batch_size / self._examples_per_epoch,
            self._examples_per_epoch,
            train.batch_size,
            self.strategy.num_replicas_in_sync,
            self.pipeline.eval_split_name,
            eval_every,
            self.model_dir,
        )
        self.writer.write({"step": start, "event": "start", "total_steps": total})
        last_saved = start if self.resume_from else None
        if train.on_nan == "rollback" and last_saved is None:
            self.save(start)  # Something to roll back to.
            last_saved = start

        step, last_eval, train_loss = start, None, math.nan
        interval = dict.fromkeys((*METRICS, "input_wait"), 0.0)
        interval_steps, interval_time, trained_examples = 0, 0.0, 0.0
        held_save = False  # Model averaging: a save waiting for the next average.
        started = time.monotonic()
        while step < total:
            try:
                # Workers must stop at the same step: they agree between calls.
                stopping = stop.requested
                if multi_worker:
                    stopping = max(distribute.gather_from_workers(self.strategy, stopping)) > 0
                # With model averaging, only right after an average do the copies
                # hold the global model a checkpoint needs: a stop waits for it.
                wait = stopping and self._between_averages(step)
                if stopping and not wait:
                    if interval_steps:  # The steps since the last record.
                        train_loss = self._log(step, interval, interval_steps, interval_time)
                    if last_saved != step:
                        self.save(step)
                    return self._stopped(step, stop.signal_name or "a signal on another worker")

                stop_at = min(
                    total,
                    step + steps_per_loop,
                    *((step // every + 1) * every for every in (train.log_every, eval_every)),
                    (step // checkpoint_every + 1) * checkpoint_every,
                )
                if wait or held_save:
                    stop_at = min(stop_at, self._next_average(step))
                rates = self.learning_rate.rates(step, stop_at)
                call_started = time.monotonic()
                # Within one machine, a stop request ends the call after its step
                # (with model averaging, after the next average).
                result = step_fn.loop(iterator, rates, None if multi_worker else stop.flag)
                interval_time += time.monotonic() - call_started
                if result.steps == 0:
                    continue  # Stopped before its first step.
                step = self._advance(step, result, rates)
                if not result.finite:
                    raise _DivergedError(step, "the loss")
                for name in METRICS:
                    interval[name] += result.sums[name]
                interval["input_wait"] += result.input_wait
                interval_steps += result.steps
                trained_examples += result.sums["examples"]

                save = step % checkpoint_every == 0
                if step % train.log_every == 0 or step == total:
                    train_loss = self._log(step, interval, interval_steps, interval_time)
                    if progress and progress.interactive:
                        progress.update(step, self._status)
                    elif progress:
                        logging.info(
                            "step %d/%d epoch %.2f: %s, ETA %s",
                            step,
                            total,
                            step * train.batch_size / self._examples_per_epoch,
                            self._status,
                            format_duration(progress.eta(step)),
                        )
                    interval = dict.fromkeys(interval, 0.0)
                    interval_steps, interval_time = 0, 0.0
                    # The override survives a crash from here on.
                    save = self._read_override(step) or save
                if self.averaging is not None:
                    if step == total and self._between_averages(step):
                        self.averaging.average()  # The run ends with the global model.
                    elif self._between_averages(step):
                        held_save, save = held_save or save, False
                    else:
                        save, held_save = save or held_save, False
                evaluate = step % eval_every == 0 or step == total
                if evaluate:
                    self.check_finite(step)  # No evaluation of a diverged model.
                    if progress:
                        progress.finish()  # Log lines start on a line of their own.
                    last_eval = self.evaluate(step)
                if save or evaluate:
                    self.save(step)
                    last_saved = step
            except _DivergedError as diverged:
                if progress:
                    progress.finish()
                step = last_saved = self._roll_back(diverged)
                iterator = iter(self._train_dataset())
                held_save = False
                interval = dict.fromkeys(interval, 0.0)
                interval_steps, interval_time = 0, 0.0

        if last_eval is None:  # Resumed at the end: report what is there.
            last_eval = self.evaluate(step)
        elapsed = time.monotonic() - started
        summary = {
            **last_eval,
            "train_loss": train_loss,
            "examples_per_sec": trained_examples / max(elapsed, 1e-9),
        }
        self.writer.write({"step": step, "event": "end", "seconds": elapsed})
        logging.info(
            "Done: %d steps in %s (%.0f examples/s); %s top-1 %.4f, top-5 %.4f, loss %.4f on "
            "%d examples; run directory %s",
            step,
            format_duration(elapsed),
            summary["examples_per_sec"],
            last_eval["split"],
            last_eval["top1"],
            last_eval["top5"],
            last_eval["loss"],
            last_eval["num_examples"],
            self.model_dir,
        )
        return RunResult(summary=summary, model=self.model)

    def _at_averages(self, name: str, every: int) -> int:
        """`every` rounded up to a multiple of the averaging interval, logged if changed."""
        interval = self.averaging.interval
        rounded = -(-every // interval) * interval
        if rounded != every:
            logging.info(
                "Model averaging every %d steps: %s %d -> %d (evaluations and checkpoints "
                "need the averaged model)",
                interval,
                name,
                every,
                rounded,
            )
        return rounded

    def _between_averages(self, step: int) -> bool:
        """With model averaging, whether the copies have drifted apart at `step`."""
        return self.averaging is not None and step % self.averaging.interval != 0

    def _next_average(self, step: int) -> int:
        return (step // self.averaging.interval + 1) * self.averaging.interval

    def _advance(self, step: int, result: LoopResult, rates: list[float]) -> int:
        """Moves the step and data position past the steps a call ran; returns the step."""
        for index, rate in enumerate(rates[: result.steps], start=step + 1):
            # Each step's rate, against the step count after it.
            self.writer.scalars("train", index, {"learning_rate": rate})
        step += result.steps
        self.global_step.assign(step)
        self.data_position.assign_add(result.steps * self.config.train.batch_size)
        return step

    def _stopped(self, step: int, signal_name: str) -> RunResult:
        self.writer.write({"step": step, "event": "stopped", "signal": signal_name})
        logging.warning(
            "Stopped by %s at step %d of %d; saved a checkpoint in %s. Rerun the same command "
            "to resume.",
            signal_name,
            step,
            self.plan.total_steps,
            self.model_dir,
        )
        return RunResult(
            summary={"step": step, "stopped": signal_name}, model=self.model, stopped=signal_name
        )

    def _log(self, step, interval, steps, seconds) -> float:
        """Writes a training record for the interval; returns its loss."""
        examples = max(interval["examples"], 1.0)
        loss = interval["loss"] / examples + interval["regularization"] / max(steps, 1)
        record = {
            "step": step,
            "epoch": step * self.config.train.batch_size / self._examples_per_epoch,
            "loss": loss,
            "accuracy": interval["correct"] / examples,
            # The rate of the interval's last step.
            "learning_rate": self.learning_rate.rates(step - 1, step)[0],
            "examples_per_sec": interval["examples"] / max(seconds, 1e-9),
            # The fraction of the time the steps waited for their batches.
            "input_wait": min(interval["input_wait"] / max(seconds, 1e-9), 1.0),
            "time": time.time(),  # Wall clock (Unix seconds), for rates that include the host.
        }
        self.writer.write(record)
        self.writer.scalars(
            "train",
            step,
            {k: record[k] for k in ("loss", "accuracy", "examples_per_sec", "input_wait")},
        )
        self.writer.flush()
        self._status = (
            f"loss {loss:.4f} acc {record['accuracy']:.4f} lr {record['learning_rate']:.4g} "
            f"{record['examples_per_sec']:.0f} img/s"
        )
        self._check_input_bound(step, record)
        return loss

    def _check_input_bound(self, step: int, record: dict[str, Any]) -> None:
        """Warns once when training waits for its input (after a first interval of warm-up)."""
        self._intervals_logged += 1
        if self._intervals_logged < 2 or self._warned_input_bound:
            return
        if record["input_wait"] > INPUT_BOUND_WAIT:
            self._warned_input_bound = True
            logging.warning(
                "Training is input-bound: the steps waited for data %.0f%% of the time (at "
                "%.0f images/s). Faster input: more CPU cores for tf.data, data on a faster "
                "disk, or a smaller data.image_size; scripts/benchmark.py measures both sides",
                100 * record["input_wait"],
                record["examples_per_sec"],
            )
            self.writer.write(
                {"step": step, "event": "input_bound", "input_wait": record["input_wait"]}
            )
