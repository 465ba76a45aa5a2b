"""A run's plan: its length in steps, its learning-rate schedule and its image sizes.

`plan_run` is pure Python: the trainer, the resume guard (for the saved config
too) and `resnet-app schedule` call it before anything is built.
"""

from __future__ import annotations

import dataclasses
import math

from absl import logging

from resnet_app.common.errors import ConfigError
from resnet_app.config import Config
from resnet_app.data import progressive
from resnet_app.engine import schedules


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """Whole steps per epoch (the schedules' epoch unit), the run's length in steps,
    its schedule f(step, steps_per_epoch) -> rate, and each step's training image size."""

    steps_per_epoch: int
    total_steps: int
    schedule: schedules.Schedule
    sizes: progressive.SizeSchedule


def plan_run(config: Config, examples_per_epoch: int, image_size: int | None = None) -> RunPlan:
    """Works out the run's length, schedule and sizes at `image_size` (default:
    data.image_size, else 32), and tries the schedule (`ConfigError` if it fails or is 0)."""
    train = config.train
    steps_per_epoch = max(1, examples_per_epoch // train.batch_size)
    total_steps = train.train_steps or math.ceil(
        train.epochs * examples_per_epoch / train.batch_size
    )
    schedule = schedules.create_schedule(
        config.schedule,
        base_lr=config.optimizer.learning_rate,
        global_batch_size=train.batch_size,
        total_steps=total_steps,
    )
    rates = schedules.check_schedule(schedule, steps_per_epoch, total_steps)
    if not any(rates.values()):
        raise ConfigError(
            f"the learning rate is 0 at every step tried over the {total_steps} steps (is a "
            "warmup longer than the run?); lengthen the run or shorten schedule.warmup_*"
        )
    for warning in config.schedule.warnings(steps_per_epoch, total_steps):
        logging.warning("%s", warning)
    size = image_size or config.data.image_size or 32
    sizes = progressive.size_schedule(
        config.data.progressive, size, train.batch_size, examples_per_epoch, total_steps
    )
    return RunPlan(steps_per_epoch, total_steps, schedule, sizes)


def describe_schedule(config: Config, plan: RunPlan) -> str:
    """The learning rate over the run, for the start line, e.g. "0.1, then 0.01 from
    step 704 (50%), ..." or "cosine from 0.1 to 0 after a warmup of 390 steps"."""
    spec, total = config.schedule, plan.total_steps

    def rate(step: int) -> str:
        return f"{plan.schedule(step, plan.steps_per_epoch):.4g}"

    warmup = spec.warmup_length(plan.steps_per_epoch)
    text = spec.describe(rate, min(warmup, total - 1), total, plan.steps_per_epoch)
    return text + (f" after a warmup of {warmup:,} steps" if warmup else "")
