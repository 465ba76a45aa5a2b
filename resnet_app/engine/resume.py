"""The resume guard: which differences from a run's saved settings a resume refuses.

A checkpoint holds the config it was trained with and the number of replicas.
Resuming with other settings is refused when it would change what the run
computes: a setting outside `config.RESUMABLE_CHANGES`; a run length that
moves the schedule's rate at a step already run (a cosine over another
length); or another number of replicas when each replica normalizes (per-tower
BatchNorm) or steps (model averaging) on its own share of the batch.

`check_resume` is a pure function of the two configs, the saved step and the
replica counts: no TensorFlow, no files. Reading the checkpoint, the error and
the log lines are the caller's (`setup.py`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from absl import logging

from resnet_app import config as config_lib
from resnet_app.common.errors import ConfigError
from resnet_app.config import Config
from resnet_app.engine.plan import RunPlan, plan_run
from resnet_app.nets.presets import get_config

# At most this many steps are compared between the two schedules.
SCHEDULE_SAMPLES = 4000


@dataclasses.dataclass(frozen=True)
class ResumeCheck:
    """What differs between a run's saved settings and the new ones.

    Attributes:
      changes: every changed setting, "section.key" -> (saved, new), and
        "replicas" -> (saved, new) when the number of replicas changed.
      refused: one explanation per difference a resume must not make
        silently, e.g. "train.batch_size 16 -> 32"; empty when it may go on.
    """

    changes: dict[str, tuple[Any, Any]]
    refused: list[str]


def schedule_change(
    saved: Config, new: Config, step: int, examples_per_epoch: int, plan: RunPlan | None = None
) -> str | None:
    """Whether the new schedule gives another rate at a step in [0, step].

    The same schedule may give other rates for another length (cosine): then
    the steps already run, and the next one, were not this run's.

    Args:
      saved: the config the checkpoint was trained with.
      new: the config to resume with.
      step: the checkpoint's step.
      examples_per_epoch: training examples per epoch.
      plan: `plan_run(new, examples_per_epoch)`, if already made.

    Returns:
      The explanation of the first step whose rate differs, or None.
    """
    before_plan = plan_run(saved, examples_per_epoch)
    after_plan = plan or plan_run(new, examples_per_epoch)
    steps = range(0, step + 1, max(1, step // SCHEDULE_SAMPLES))
    moved = _first_difference(before_plan, after_plan, steps)
    if moved is None:
        return None
    s, before, after = moved
    return (
        f"the learning rate at step {s} {before:.6g} -> {after:.6g} (the schedule "
        "depends on the run's length)"
    )


def _first_difference(
    before: RunPlan, after: RunPlan, steps: range
) -> tuple[int, float, float] | None:
    """(step, rate before, rate after) at the first of `steps` whose rate differs, or None."""
    for s in steps:
        rate_before = before.schedule(s, before.steps_per_epoch)
        rate_after = after.schedule(s, after.steps_per_epoch)
        if not math.isclose(rate_before, rate_after, rel_tol=1e-9, abs_tol=1e-15):
            return s, rate_before, rate_after
    return None


def keep_drops(saved: Config, new: Config, examples_per_epoch: int) -> Config:
    """`new`, with the drops of a schedule in fractions kept where they were.

    A run lengthened on resume (the same command with a larger --train_steps
    or --epochs) would move the drops of its fractions of the run (the
    default's 1/2 and 3/4) under steps already trained, which the guard
    refuses. It keeps them instead: the fractions stay of the length the run
    had (`schedule.total_steps`), and the steps added train at the last rate,
    as He et al.'s schedule in steps always did.

    Returns:
      `new`, or a copy whose schedule's `total_steps` is the saved run's length.
    """
    kept, given = saved.schedule, new.schedule
    if kept.kind != "piecewise" or kept.unit != "fraction" or given.kind != "piecewise":
        return new
    if given.total_steps is not None or given != dataclasses.replace(kept, total_steps=None):
        return new  # Another schedule, or one that says what its fractions are of.
    length = kept.total_steps or plan_run(saved, examples_per_epoch).total_steps
    if length == plan_run(new, examples_per_epoch).total_steps:
        return new
    logging.info(
        "The run's length changed on resume: its learning rate drops stay at %s of the %d "
        "steps it had (schedule.total_steps=%d)",
        ", ".join(f"{b:g}" for b in kept.boundaries),
        length,
        length,
    )
    return dataclasses.replace(new, schedule=dataclasses.replace(given, total_steps=length))


def same_rates(saved: Config, new: Config, examples_per_epoch: int) -> bool:
    """Whether the new `schedule:` gives the saved run the rate it had at every step.

    Both are planned over the saved run (its length, batch and optimizer):
    the same schedule written otherwise (fractions for steps) passes, and so
    does one that pins a fraction schedule's drops in steps to lengthen the
    run. What the new length then changes is `schedule_change`'s to judge.
    """
    before = plan_run(saved, examples_per_epoch)
    try:
        after = plan_run(dataclasses.replace(saved, schedule=new.schedule), examples_per_epoch)
    except ConfigError:
        return False
    return _first_difference(before, after, range(before.total_steps + 1)) is None


def replicas_change(new: Config, saved_replicas: int, replicas: int) -> str | None:
    """Why a change of the number of replicas changes what the run computes, or None."""
    batch = new.train.batch_size
    if new.sync.mode == "model_average":
        return (
            f"replicas {saved_replicas} -> {replicas} (with model averaging each replica "
            f"trains alone on {batch // saved_replicas} -> {batch // replicas} examples per step)"
        )
    if not get_config(new.model_name, **new.model_overrides).bn_synchronized:
        return (
            f"replicas {saved_replicas} -> {replicas} (each BatchNorm normalizes over "
            f"{batch // saved_replicas} -> {batch // replicas} examples)"
        )
    return None


def check_resume(
    saved: Config,
    new: Config,
    step: int,
    saved_replicas: int | None,
    replicas: int,
    examples_per_epoch: int,
    plan: RunPlan | None = None,
) -> ResumeCheck:
    """Compares the new settings with those a checkpoint was trained with.

    Args:
      saved: the config saved in the checkpoint.
      new: the config to resume with.
      step: the checkpoint's step.
      saved_replicas: the replicas the checkpoint was trained on (None for a
        checkpoint that does not say).
      replicas: the replicas the resumed run trains on.
      examples_per_epoch: training examples per epoch.
      plan: `plan_run(new, examples_per_epoch)`, if already made.

    Returns:
      The `ResumeCheck`: every change, and the refused ones explained.

    Raises:
      ConfigError: when the saved config's schedule cannot be planned.
    """
    changes = config_lib.changes(saved, new)
    refused_keys = [key for key in changes if key not in config_lib.RESUMABLE_CHANGES]
    rewritten = [key for key in refused_keys if key.startswith("schedule.")]
    if rewritten and same_rates(saved, new, examples_per_epoch):
        # The same schedule written otherwise (fractions for steps, say).
        refused_keys = [key for key in refused_keys if key not in rewritten]
    refused = [f"{key} {changes[key][0]!r} -> {changes[key][1]!r}" for key in refused_keys]
    if not refused_keys:
        moved = schedule_change(saved, new, step, examples_per_epoch, plan)
        if moved:
            refused.append(moved)
    if saved_replicas is not None and saved_replicas != replicas:
        explanation = replicas_change(new, saved_replicas, replicas)
        if explanation:
            refused.append(explanation)
        changes["replicas"] = (saved_replicas, replicas)
    return ResumeCheck(changes=changes, refused=refused)
