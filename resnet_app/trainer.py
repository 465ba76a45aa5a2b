"""The training loop: `train_and_evaluate(config, model_dir)`.

The loop owns the host side of training. Before each call of the compiled
multi-step function (`step.TrainStep.loop`) it asks `LearningRate` for the
rate of every step of the call, so the optimizer's LR variable is set before
every step, and the rate logged is the one used. A call never crosses a log,
evaluation or checkpoint step. The loop logs every `log_every` steps (and
reads `model_dir/lr_override` then), evaluates every `eval_every` steps and
at the end, and saves a checkpoint every `checkpoint_every` steps, at every
evaluation, after a learning-rate override and at the end.

Resuming: a run directory that holds a checkpoint continues from it. The data
stream is entered at step x global batch (see `data.py`), so no example is
skipped or repeated across the restart.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import tempfile
import time
from typing import Any

import keras
import tensorflow as tf
from absl import logging

from resnet_app import data, distribute, evaluate, optim, schedules
from resnet_app.config import Config, write_yaml
from resnet_app.errors import ConfigError
from resnet_app.learning_rate import LearningRate
from resnet_app.metrics import MetricsWriter, Progress, format_duration
from resnet_app.model import create_model
from resnet_app.presets import get_config
from resnet_app.step import TrainStep

CONFIG_FILE = "config.yaml"


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
        training loss) and "examples_per_sec" (over the whole run).
      model: the trained model (moving statistics averaged over towers).
    """

    summary: dict[str, Any]
    model: keras.Model


def train_and_evaluate(config: Config, model_dir: str) -> RunResult:
    """Trains and evaluates `config`, writing everything to `model_dir`.

    Args:
      config: the resolved config.
      model_dir: the run directory (created if needed). If it holds a
        checkpoint, training resumes from it.

    Returns:
      The `RunResult`.

    Raises:
      ConfigError: for settings that do not fit the data or machine, a run
        directory holding another model, or a diverged run.
    """
    return Trainer(config, model_dir).run()


def _model_fields(config: Config, pipeline: data.InputPipeline) -> dict[str, Any]:
    overrides = config.model_overrides
    classes = overrides.get("num_classes")
    if classes is not None and classes != pipeline.num_classes:
        raise ConfigError(
            f"model.num_classes={classes} but dataset {config.data.dataset} has "
            f"{pipeline.num_classes} classes; drop model.num_classes"
        )
    return {**overrides, "num_classes": pipeline.num_classes}


class Trainer:
    """One run: the strategy, data, model, optimizer and their checkpoint.

    Args:
      config: the resolved config.
      model_dir: the run directory.
    """

    def __init__(self, config: Config, model_dir: str):
        self.config = config
        self.model_dir = model_dir
        train = config.train
        optimizer_config = optim.check_optimizer_config(config.optimizer)  # Before loading.
        self.strategy = strategy = distribute.create_strategy(train.num_towers)
        replicas = strategy.num_replicas_in_sync
        if train.batch_size % replicas:
            raise ConfigError(
                f"train.batch_size={train.batch_size} is not divisible by the {replicas} "
                f"towers; use a multiple of {replicas}"
            )
        self.chief = distribute.is_chief(strategy)

        preset = get_config(config.model_name, **config.model_overrides)
        self.pipeline = data.create_pipeline(
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
        os.makedirs(model_dir, exist_ok=True)
        if self.chief:
            write_yaml(config, os.path.join(model_dir, CONFIG_FILE))

        keras.utils.set_random_seed(train.seed)
        size = self.pipeline.preprocessing.image_size
        with strategy.scope():
            self.model = create_model(config.model_name, **_model_fields(config, self.pipeline))
            self.model.build((None, size, size, 3))
            self.optimizer = optim.create_optimizer(optimizer_config)
            self.optimizer.build(self.model.trainable_variables)
            self.learning_rate = LearningRate(self.plan.schedule, self.plan.steps_per_epoch)
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.checkpoint = tf.train.Checkpoint(
            model=self.model,
            optimizer=self.optimizer,
            global_step=self.global_step,
            lr_value=self.learning_rate.value,
            lr_scale=self.learning_rate.scale,
        )
        # Every worker takes part in saving; only the chief's copy is kept.
        self.save_dir = model_dir if self.chief else tempfile.mkdtemp(prefix="resnet_app_")
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.save_dir, max_to_keep=3)
        self.sync_statistics = distribute.moving_statistics_sync(self.model, strategy)
        self.writer = MetricsWriter(model_dir, enabled=self.chief)

    # -- checkpoints -------------------------------------------------------------

    def restore(self) -> int:
        """Restores the latest checkpoint of the run directory; returns the step."""
        latest = tf.train.latest_checkpoint(self.model_dir)  # The chief's, on every worker.
        if latest:
            try:
                self.checkpoint.restore(latest).assert_existing_objects_matched()
            except (AssertionError, ValueError, tf.errors.OpError) as error:
                first_line = str(error).strip().splitlines()[0][:200]
                raise ConfigError(
                    f"cannot resume from {latest} ({first_line}); it was saved by another "
                    f"model or optimizer (see {self.model_dir}/{CONFIG_FILE}); use a new "
                    "--model_dir"
                ) from None
        step = int(self.global_step.numpy())
        steps = distribute.gather_from_workers(self.strategy, step)
        if min(steps) != max(steps):
            raise ConfigError(
                f"the workers resumed from different steps {sorted(set(steps))}: every "
                f"worker must see the chief's checkpoints, so put --model_dir on a shared "
                "filesystem"
            )
        if latest:
            logging.info("Resumed from step %d (%s)", step, latest)
        return step

    def save(self, step: int) -> None:
        self.sync_statistics()
        self.manager.save(checkpoint_number=step)

    # -- evaluation and logging --------------------------------------------------

    def evaluate(self, step: int) -> dict[str, Any]:
        """Evaluates the whole split, writes the record and saves a checkpoint."""
        self.sync_statistics()
        train = self.config.train
        result = evaluate.evaluate(
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
        self.manager.save(checkpoint_number=step)
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

    # -- the loop ----------------------------------------------------------------

    def _train_dataset(self, start_step: int) -> tf.distribute.DistributedDataset:
        global_batch = self.config.train.batch_size
        replicas = self.strategy.num_replicas_in_sync

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            dataset = self.pipeline.train_dataset(
                global_batch,
                start_example=start_step * global_batch,
                num_shards=context.num_input_pipelines,
                shard_index=context.input_pipeline_id,
            )
            # Each local replica takes its consecutive slice of the worker's batch.
            return dataset.rebatch(global_batch // replicas)

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def run(self) -> RunResult:
        """Trains to the end of the plan, evaluating and saving on the way."""
        train, plan = self.config.train, self.plan
        total = plan.total_steps
        eval_every = train.eval_every or plan.steps_per_epoch
        checkpoint_every = train.checkpoint_every or eval_every
        steps_per_loop = train.steps_per_loop or train.log_every
        examples_per_epoch = self.pipeline.num_train_examples
        start = self.restore()
        step_fn = TrainStep(self.model, self.optimizer, self.strategy, train.label_smoothing)
        iterator = iter(self._train_dataset(start))
        progress = Progress(total, start) if self.chief else None
        logging.info(
            "Training %s on %s: %d steps (%.2f epochs of %d examples), global batch %d on %d "
            "replica(s), evaluating on %s every %d steps; run directory %s",
            self.config.model_name,
            self.config.data.dataset,
            total,
            total * train.batch_size / examples_per_epoch,
            examples_per_epoch,
            train.batch_size,
            self.strategy.num_replicas_in_sync,
            self.pipeline.eval_split_name,
            eval_every,
            self.model_dir,
        )
        self.writer.write({"step": start, "event": "start", "total_steps": total})

        step, last_eval, train_loss = start, None, math.nan
        interval = dict.fromkeys(("examples", "loss", "correct", "regularization"), 0.0)
        interval_steps, interval_time, trained_examples = 0, 0.0, 0.0
        started = time.monotonic()
        while step < total:
            stop = min(
                total,
                step + steps_per_loop,
                *((step // every + 1) * every for every in (train.log_every, eval_every)),
                (step // checkpoint_every + 1) * checkpoint_every,
            )
            rates = self.learning_rate.rates(step, stop)
            call_started = time.monotonic()
            sums = step_fn.loop(iterator, rates)
            interval_time += time.monotonic() - call_started
            for name in interval:
                interval[name] += sums[name]
            interval_steps += stop - step
            trained_examples += sums["examples"]
            for index, rate in enumerate(rates, start=step + 1):
                # Each step's rate, against the step count after it.
                self.writer.scalars("train", index, {"learning_rate": rate})
            step = stop
            self.global_step.assign(step)

            saved = False
            if step % train.log_every == 0 or step == total:
                train_loss = self._log(step, interval, interval_steps, interval_time, rates[-1])
                if progress and progress.interactive:
                    progress.update(step, self._status)
                elif progress:
                    logging.info(
                        "step %d/%d epoch %.2f: %s, ETA %s",
                        step,
                        total,
                        step * train.batch_size / examples_per_epoch,
                        self._status,
                        format_duration(progress.eta(step)),
                    )
                interval = dict.fromkeys(interval, 0.0)
                interval_steps, interval_time = 0, 0.0
                if self._read_override(step) and step < total:
                    self.save(step)  # The override survives a crash from here on.
                    saved = True
            if step % eval_every == 0 or step == total:
                if progress:
                    progress.finish()  # Log lines start on a line of their own.
                last_eval = self.evaluate(step)
            elif step % checkpoint_every == 0 and not saved:
                self.save(step)

        if last_eval is None:  # Resumed at the end: report what is there.
            last_eval = self.evaluate(step)
        elapsed = time.monotonic() - started
        summary = {
            **last_eval,
            "train_loss": train_loss,
            "examples_per_sec": trained_examples / max(elapsed, 1e-9),
        }
        self.writer.write({"step": step, "event": "end", "seconds": elapsed})
        self.writer.close()
        if not self.chief:
            shutil.rmtree(self.save_dir, ignore_errors=True)
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

    def _log(self, step, interval, steps, seconds, rate) -> float:
        """Writes a training record for the interval; returns its loss."""
        examples = max(interval["examples"], 1.0)
        loss = interval["loss"] / examples + interval["regularization"] / max(steps, 1)
        if not math.isfinite(loss):
            raise ConfigError(
                f"training diverged: the loss is {loss} at step {step}; lower the learning "
                "rate (optimizer.learning_rate) or check the data"
            )
        record = {
            "step": step,
            "epoch": step * self.config.train.batch_size / self.pipeline.num_train_examples,
            "loss": loss,
            "accuracy": interval["correct"] / examples,
            "learning_rate": rate,
            "examples_per_sec": interval["examples"] / max(seconds, 1e-9),
        }
        self.writer.write(record)
        self.writer.scalars(
            "train", step, {k: record[k] for k in ("loss", "accuracy", "examples_per_sec")}
        )
        self.writer.flush()
        self._status = (
            f"loss {loss:.4f} acc {record['accuracy']:.4f} lr {rate:.4g} "
            f"{record['examples_per_sec']:.0f} img/s"
        )
        return loss
