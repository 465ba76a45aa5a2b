"""The training loop: `train_and_evaluate(config, model_dir)`.

The loop owns the host side of training. Before each call of the compiled
multi-step function (`step.TrainStep.loop`) it computes, for every step of
the call, the learning rate from the schedule (and any live override), so the
LR variable is set before every step, and the rate logged is the one used.
It logs every `log_every` steps, evaluates every `eval_every` steps and at the
end, and saves a checkpoint at each evaluation and at the end.

Live LR control: write a number (`0.01`) or a multiplier (`x0.1`) into
`model_dir/lr_override`. The loop reads it at the next log interval, applies
it from the next step, logs it, and renames the file to
`lr_override.applied`. A number replaces the schedule; multipliers multiply
the schedule (and each other). The override is part of the checkpoint.
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
from resnet_app.metrics import MetricsWriter, Progress, format_duration
from resnet_app.model import create_model
from resnet_app.presets import get_config
from resnet_app.step import TrainStep

LR_OVERRIDE_FILE = "lr_override"
CONFIG_FILE = "config.yaml"


class LearningRate:
    """The schedule plus the live override; its state is checkpointed.

    Args:
      schedule: f(step, steps_per_epoch) -> learning rate.
      steps_per_epoch: passed to the schedule.
    """

    def __init__(self, schedule: schedules.Schedule, steps_per_epoch: int):
        self.schedule = schedule
        self.steps_per_epoch = steps_per_epoch
        # NaN: no fixed value, follow the schedule times `scale`.
        self.value = tf.Variable(math.nan, dtype=tf.float64, trainable=False, name="lr_value")
        self.scale = tf.Variable(1.0, dtype=tf.float64, trainable=False, name="lr_scale")

    def __call__(self, step: int) -> float:
        value = float(self.value.numpy())
        if not math.isnan(value):
            return value
        return self.schedule(step, self.steps_per_epoch) * float(self.scale.numpy())

    def rates(self, start: int, stop: int) -> list[float]:
        value, scale = float(self.value.numpy()), float(self.scale.numpy())
        if not math.isnan(value):
            return [value] * (stop - start)
        return [self.schedule(s, self.steps_per_epoch) * scale for s in range(start, stop)]

    def apply_override(self, path: str) -> str | None:
        """Reads and consumes an override file; returns what was applied, or None."""
        if not os.path.exists(path):
            return None
        with open(path) as f:
            text = f.read().strip()
        os.replace(path, path + ".applied")
        try:
            if text.lower().startswith("x"):
                factor = float(text[1:])
                if not factor > 0 or not math.isfinite(factor):
                    raise ValueError
                self.scale.assign(self.scale * factor)
                self.value.assign(math.nan)
                return f"multiplier {factor:g} (schedule x {float(self.scale.numpy()):g})"
            value = float(text)
            if not value >= 0 or not math.isfinite(value):
                raise ValueError
            self.value.assign(value)
            return f"fixed value {value:g}"
        except ValueError:
            logging.error(
                "Ignored %s: %r is neither a learning rate (0.01) nor a multiplier (x0.1)",
                path,
                text,
            )
            return None


def _check_batch(config: Config, strategy: tf.distribute.Strategy) -> None:
    replicas = strategy.num_replicas_in_sync
    batch = config.train.batch_size
    if batch % replicas:
        raise ConfigError(
            f"train.batch_size={batch} is not divisible by the {replicas} towers; "
            f"use a multiple of {replicas}"
        )


def _model_config(config: Config, pipeline: data.InputPipeline) -> dict[str, Any]:
    overrides = config.model_overrides
    classes = overrides.get("num_classes")
    if classes is not None and classes != pipeline.num_classes:
        raise ConfigError(
            f"model.num_classes={classes} but dataset {config.data.dataset} has "
            f"{pipeline.num_classes} classes; drop model.num_classes"
        )
    return {**overrides, "num_classes": pipeline.num_classes}


def _train_dataset(pipeline, strategy, global_batch, start_step):
    replicas = strategy.num_replicas_in_sync

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = pipeline.train_dataset(
            global_batch,
            start_example=start_step * global_batch,
            num_shards=context.num_input_pipelines,
            shard_index=context.input_pipeline_id,
        )
        # Each local replica takes its consecutive slice of the worker's batch.
        return dataset.rebatch(global_batch // replicas)

    return strategy.distribute_datasets_from_function(dataset_fn)


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
      ConfigError: for a bad optimizer config or a schedule that fails.
    """
    train = config.train
    global_batch = train.batch_size
    steps_per_epoch = max(1, examples_per_epoch // global_batch)
    total_steps = train.train_steps or math.ceil(train.epochs * examples_per_epoch / global_batch)
    schedule = schedules.create_schedule(
        config.schedule,
        base_lr=optim.check_optimizer_config(config.optimizer)["learning_rate"],
        global_batch_size=global_batch,
        total_steps=total_steps,
    )
    rates = schedules.check_schedule(schedule, steps_per_epoch, total_steps)
    if not any(rates.values()):
        raise ConfigError(
            f"the learning rate is 0 at every step tried over the {total_steps} steps (is a "
            "warmup longer than the run?); lengthen the run or shorten schedule.warmup_*"
        )
    return RunPlan(steps_per_epoch, total_steps, schedule)


def _record_metrics(sums: dict[str, float], steps: int) -> tuple[float, float]:
    examples = max(sums["examples"], 1.0)
    loss = sums["loss"] / examples + sums["regularization"] / max(steps, 1)
    return loss, sums["correct"] / examples


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
      ConfigError: for settings that do not fit the data or machine.
    """
    train = config.train
    optimizer_config = optim.check_optimizer_config(config.optimizer)  # Fails before loading.
    strategy = distribute.create_strategy(train.num_towers)
    _check_batch(config, strategy)
    chief = distribute.is_chief(strategy)
    os.makedirs(model_dir, exist_ok=True)

    preset = get_config(config.model_name, **config.model_overrides)
    pipeline = data.create_pipeline(config.data, default_image_size=preset.default_image_size)
    model_fields = _model_config(config, pipeline)
    global_batch = train.batch_size
    examples_per_epoch = pipeline.num_train_examples
    plan = plan_run(config, examples_per_epoch)
    steps_per_epoch, total_steps, schedule = plan.steps_per_epoch, plan.total_steps, plan.schedule
    eval_every = train.eval_every or steps_per_epoch
    if chief:
        write_yaml(config, os.path.join(model_dir, CONFIG_FILE))

    keras.utils.set_random_seed(train.seed)
    size = pipeline.preprocessing.image_size
    with strategy.scope():
        model = create_model(config.model_name, **model_fields)
        model.build((None, size, size, 3))
        optimizer = optim.create_optimizer(optimizer_config)
        optimizer.build(model.trainable_variables)
        learning_rate = LearningRate(schedule, steps_per_epoch)
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    checkpoint = tf.train.Checkpoint(
        model=model,
        optimizer=optimizer,
        global_step=global_step,
        lr_value=learning_rate.value,
        lr_scale=learning_rate.scale,
    )
    # Every worker takes part in saving; only the chief's copy is kept.
    save_dir = model_dir if chief else tempfile.mkdtemp(prefix="resnet_app_worker_")
    manager = tf.train.CheckpointManager(checkpoint, save_dir, max_to_keep=3)
    latest = tf.train.latest_checkpoint(model_dir)  # Every worker resumes from the chief's.
    if latest:
        checkpoint.restore(latest).assert_existing_objects_matched()
        logging.info("Resumed from step %d (%s)", int(global_step.numpy()), latest)
    start_step = int(global_step.numpy())

    train_step = TrainStep(model, optimizer, strategy, train.label_smoothing)
    iterator = iter(_train_dataset(pipeline, strategy, global_batch, start_step))
    sync_statistics = distribute.moving_statistics_sync(model, strategy)
    writer = MetricsWriter(model_dir, enabled=chief)
    progress = Progress(total_steps, start_step) if chief else None
    steps_per_loop = train.steps_per_loop or train.log_every
    override_path = os.path.join(model_dir, LR_OVERRIDE_FILE)
    logging.info(
        "Training %s on %s: %d steps (%.2f epochs of %d examples), global batch %d on %d "
        "replica(s), evaluating on %s every %d steps; run directory %s",
        config.model_name,
        config.data.dataset,
        total_steps,
        total_steps * global_batch / examples_per_epoch,
        examples_per_epoch,
        global_batch,
        strategy.num_replicas_in_sync,
        pipeline.eval_split_name,
        eval_every,
        model_dir,
    )
    writer.write({"step": start_step, "event": "start", "total_steps": total_steps})

    def run_evaluation(step: int) -> dict[str, Any]:
        if progress:
            progress.finish()  # Log lines start on a line of their own.
        sync_statistics()
        result = evaluate.evaluate(model, pipeline, train.eval_batch_size or global_batch, strategy)
        record = {
            "step": step,
            "split": pipeline.eval_split_name,
            "top1": result.accuracy,
            "top5": result.top5_accuracy,
            "loss": result.loss,
            "num_examples": result.examples,
        }
        writer.write(record)
        writer.scalars("eval", step, {k: record[k] for k in ("top1", "top5", "loss")})
        manager.save(checkpoint_number=step)
        return record

    step = start_step
    interval = {"examples": 0.0, "loss": 0.0, "correct": 0.0, "regularization": 0.0}
    interval_steps, interval_time = 0, 0.0
    run_started = time.monotonic()
    trained_examples, train_loss, last_eval = 0.0, math.nan, None
    while step < total_steps:
        stop = min(
            total_steps,
            step + steps_per_loop,
            (step // train.log_every + 1) * train.log_every,
            (step // eval_every + 1) * eval_every,
        )
        rates = learning_rate.rates(step, stop)
        started = time.monotonic()
        sums = train_step.loop(iterator, rates)
        elapsed = time.monotonic() - started
        for s, rate in enumerate(rates, start=step + 1):
            # The rate each step used, against the step count after it.
            writer.scalars("train", s, {"learning_rate": rate})
        for name in interval:
            interval[name] += sums[name]
        interval_steps += stop - step
        interval_time += elapsed
        trained_examples += sums["examples"]
        step = stop
        global_step.assign(step)

        if step % train.log_every == 0 or step == total_steps:
            loss, accuracy = _record_metrics(interval, interval_steps)
            if not math.isfinite(loss):
                raise ConfigError(
                    f"training diverged: the loss is {loss} at step {step}; lower the "
                    "learning rate (optimizer.learning_rate) or check the data"
                )
            record = {
                "step": step,
                "epoch": step * global_batch / examples_per_epoch,
                "loss": loss,
                "accuracy": accuracy,
                "learning_rate": rates[-1],
                "examples_per_sec": interval["examples"] / max(interval_time, 1e-9),
            }
            writer.write(record)
            writer.scalars(
                "train",
                step,
                {k: record[k] for k in ("loss", "accuracy", "examples_per_sec")},
            )
            status = (
                f"loss {loss:.4f} acc {accuracy:.4f} lr {rates[-1]:.4g} "
                f"{record['examples_per_sec']:.0f} img/s"
            )
            if progress and progress.interactive:
                progress.update(step, status)
            elif progress:
                logging.info(
                    "step %d/%d epoch %.2f: %s, ETA %s",
                    step,
                    total_steps,
                    record["epoch"],
                    status,
                    format_duration(progress.eta(step)),
                )
            writer.flush()
            train_loss = loss
            interval = dict.fromkeys(interval, 0.0)
            interval_steps, interval_time = 0, 0.0
            applied = learning_rate.apply_override(override_path) if chief else None
            if applied:
                logging.warning("Learning rate override from step %d: %s", step + 1, applied)
                writer.write({"step": step, "event": "lr_override", "override": applied})
        if step % eval_every == 0 or step == total_steps:
            last_eval = run_evaluation(step)

    if last_eval is None:  # Resumed at the end: evaluate what is there.
        last_eval = run_evaluation(step)
    elapsed = time.monotonic() - run_started
    summary = {
        **last_eval,
        "train_loss": train_loss,
        "examples_per_sec": trained_examples / max(elapsed, 1e-9),
    }
    writer.write({"step": step, "event": "end", "seconds": elapsed})
    writer.close()
    if not chief:
        shutil.rmtree(save_dir, ignore_errors=True)
    logging.info(
        "Done: %d steps in %s (%.0f examples/s); %s top-1 %.4f, top-5 %.4f, loss %.4f on %d "
        "examples; run directory %s",
        step,
        format_duration(elapsed),
        summary["examples_per_sec"],
        last_eval["split"],
        last_eval["top1"],
        last_eval["top5"],
        last_eval["loss"],
        last_eval["num_examples"],
        model_dir,
    )
    return RunResult(summary=summary, model=model)
