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

from resnet_app import config as config_lib
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
    for s in range(0, step + 1, max(1, step // SCHEDULE_SAMPLES)):
        before = before_plan.schedule(s, before_plan.steps_per_epoch)
        after = after_plan.schedule(s, after_plan.steps_per_epoch)
        if not math.isclose(before, after, rel_tol=1e-9, abs_tol=1e-15):
            return (
                f"the learning rate at step {s} {before:.6g} -> {after:.6g} (the schedule "
                "depends on the run's length)"
            )
    return None


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
