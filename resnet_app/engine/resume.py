"""The resume guard: which differences from a run's saved settings a resume refuses.

A resume is refused when it changes what the run computes: a setting outside
`config.RESUMABLE_CHANGES`, a length that moves the rate at a step already run, or
another number of replicas when each normalizes or steps on its own share. Pure
functions: `setup.py` reads the checkpoint and reports.
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
    """Every changed setting ("section.key" or "replicas" -> (saved, new)), and one
    explanation per change a resume must not make silently ("train.batch_size 16 -> 32")."""

    changes: dict[str, tuple[Any, Any]]
    refused: list[str]


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
    """`new`, or, for a run lengthened on resume, a copy whose fraction drops (the
    default's 1/2 and 3/4) stay of the length it had (`schedule.total_steps`) rather
    than move under steps already trained; the steps added train at the last rate."""
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
        ", ".join(f"{b:g}" for b in kept.boundaries), length, length,
    )  # fmt: skip
    return dataclasses.replace(new, schedule=dataclasses.replace(given, total_steps=length))


def same_rates(saved: Config, new: Config, examples_per_epoch: int) -> bool:
    """Whether the new `schedule:`, planned over the saved run, gives it the rate it had
    at every step: the same schedule written otherwise (fractions for steps) passes."""
    before = plan_run(saved, examples_per_epoch)
    try:
        after = plan_run(dataclasses.replace(saved, schedule=new.schedule), examples_per_epoch)
    except ConfigError:
        return False
    return _first_difference(before, after, range(before.total_steps + 1)) is None


def check_resume(
    saved: Config,
    new: Config,
    step: int,
    saved_replicas: int | None,
    replicas: int,
    examples_per_epoch: int,
    plan: RunPlan | None = None,
) -> ResumeCheck:
    """Compares the new settings with those a checkpoint of `step` was trained with
    (`saved_replicas`: None for a checkpoint that does not say; `plan`: the new one's)."""
    changes = config_lib.changes(saved, new)
    refused_keys = [key for key in changes if key not in config_lib.RESUMABLE_CHANGES]
    rewritten = [key for key in refused_keys if key.startswith("schedule.")]
    if rewritten and same_rates(saved, new, examples_per_epoch):
        # The same schedule written otherwise (fractions for steps, say).
        refused_keys = [key for key in refused_keys if key not in rewritten]
    refused = [f"{key} {changes[key][0]!r} -> {changes[key][1]!r}" for key in refused_keys]
    if not refused_keys:
        # The same schedule may give other rates over another length (a cosine).
        steps = range(0, step + 1, max(1, step // SCHEDULE_SAMPLES))
        before = plan_run(saved, examples_per_epoch)
        moved = _first_difference(before, plan or plan_run(new, examples_per_epoch), steps)
        if moved:
            at, rate_before, rate_after = moved
            refused.append(
                f"the learning rate at step {at} {rate_before:.6g} -> {rate_after:.6g} (the "
                "schedule depends on the run's length)"
            )
    if saved_replicas is not None and saved_replicas != replicas:
        # Each replica normalizes (per-tower BatchNorm) or steps (model averaging) alone.
        batch = new.train.batch_size
        shares = f"{batch // saved_replicas} -> {batch // replicas} examples"
        why = None
        if new.sync.mode == "model_average":
            why = f"with model averaging each replica trains alone on {shares} per step"
        elif not get_config(new.model_name, **new.model_overrides).bn_synchronized:
            why = f"each BatchNorm normalizes over {shares}"
        if why:
            refused.append(f"replicas {saved_replicas} -> {replicas} ({why})")
        changes["replicas"] = (saved_replicas, replicas)
    return ResumeCheck(changes=changes, refused=refused)
