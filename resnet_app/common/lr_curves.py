"""Learning-rate curves: pure Python functions of the step, without TensorFlow or a config.

A schedule is any callable `schedule(step, steps_per_epoch) -> float`, where
`step` counts optimizer updates from 0. The training loop calls it on the host
before every step and logs the value it used, so the curves here use only
`math`: cheap to call, and testable without TensorFlow. They live below the
config layer so that each `schedule:` kind (`config/schedule_kinds.py`) builds
its own curve, and a user's schedule script may compose them.

Conventions shared by every curve here:
- Epochs become steps as `round(epochs * steps_per_epoch)` (Python's round,
  half to even), so epoch 30 at 1251 steps per epoch is step 37530.
- A boundary belongs to the interval it starts: the new value is used from step
  `b` on (`step >= b`), the old one up to step `b - 1`.
- A linear warmup of W steps ends at its target and never uses 0 (Goyal et al.
  2017): `lr = start + (target - start) * (step + 1) / W` for `step < W`, where
  `target` is the wrapped schedule's value at step W. So step 0 trains at
  target / W (when `start` is 0), step W - 1 at the target, and from step W on
  the wrapped schedule takes over, continuously.

Checks: a config's values are checked once, by the dataclass of their kind, with
messages naming the key. The curves check only what they would otherwise get
silently wrong when Python calls them directly: a length given both in steps
and in epochs (or in neither), rates that do not fit the boundaries, boundaries
that do not increase, an unknown unit. Those raise `ValueError`. Ranges are not
checked here: a negative rate comes out as a negative rate, which
`engine/schedules.check_schedule` refuses, with the step, before training.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import Any

Schedule = Callable[[int, int], float]
"""`schedule(step, steps_per_epoch) -> learning rate`, `step` counting from 0."""

UNITS = ("steps", "epochs", "fraction")  # fraction: of the run's steps, in (0, 1)


def _to_steps(epochs: float, steps_per_epoch: int) -> int:
    """The step count of a (possibly fractional) number of epochs, at least 1."""
    return max(1, round(epochs * steps_per_epoch))


def _one_of(names: tuple[str, str], first: Any, second: Any) -> None:
    """Exactly one of two alternative arguments is given."""
    if (first is None) == (second is None):
        raise ValueError(f"give exactly one of {names[0]} and {names[1]}")


def constant(value: float) -> Schedule:
    """The same learning rate at every step.

    Args:
      value: the learning rate.

    Returns:
      The schedule.
    """
    value = float(value)

    def constant_schedule(step: int, steps_per_epoch: int) -> float:
        return value

    return constant_schedule


def piecewise(
    boundaries: Sequence[float],
    *,
    values: Sequence[float] | None = None,
    multipliers: Sequence[float] | None = None,
    base: float | None = None,
    unit: str = "steps",
    total_steps: int | None = None,
) -> Schedule:
    """A piecewise-constant schedule: one learning rate between two boundaries.

    With boundaries `[b0, b1]` the rate is the first value for `step < b0`, the
    second for `b0 <= step < b1` and the third from `b1` on.

    Args:
      boundaries: strictly increasing, in `unit`s. Epochs may be fractional;
        they are compared as `round(b * steps_per_epoch)` steps.
      values: absolute learning rates, one more than `boundaries`.
      multipliers: or, factors of `base`, one more than `boundaries`.
      base: the learning rate the multipliers multiply; only with `multipliers`.
      unit: "steps", "epochs" or "fraction": of `total_steps`, compared as
        `round(b * total_steps)` steps (He et al.'s [0.5, 0.75] for a run of
        any length).
      total_steps: the run's length; only for the unit "fraction".

    Returns:
      The schedule.

    Raises:
      ValueError: for an unknown unit, boundaries that do not increase, rates
        not one more than the boundaries, or not exactly one of `values` and
        `multipliers` (with `base`).
    """
    bounds = [float(boundary) for boundary in boundaries]
    _one_of(("values", "multipliers"), values, multipliers)
    if (base is None) != (values is not None):
        raise ValueError("piecewise takes a base with multipliers, and none with values")
    if multipliers is not None:
        rates = [float(base) * float(multiplier) for multiplier in multipliers]
    else:
        rates = [float(value) for value in values]
    if unit not in UNITS:
        raise ValueError(f"piecewise unit must be one of {', '.join(UNITS)}, got {unit!r}")
    if len(rates) != len(bounds) + 1:
        raise ValueError(f"piecewise needs one rate more than its {len(bounds)} boundaries")
    if any(current <= previous for previous, current in zip(bounds, bounds[1:])):
        raise ValueError(f"piecewise boundaries must be strictly increasing, got {bounds}")

    # bisect_right counts the boundaries b <= step: the index of the interval.
    if unit != "epochs":  # Steps known now; epochs' depend on the call's steps_per_epoch.
        bounds = boundary_steps(bounds, unit, 1, total_steps)

        def piecewise_schedule(step: int, steps_per_epoch: int) -> float:
            return rates[bisect.bisect_right(bounds, step)]

    else:

        def piecewise_schedule(step: int, steps_per_epoch: int) -> float:
            steps = boundary_steps(bounds, unit, steps_per_epoch, total_steps)
            return rates[bisect.bisect_right(steps, step)]

    return piecewise_schedule


def boundary_steps(
    boundaries: Sequence[float], unit: str, steps_per_epoch: int, total_steps: int | None
) -> list[float]:
    """The steps piecewise boundaries in `unit` fall at: `round(b * steps_per_epoch)` for
    epochs, `round(b * total_steps)` for fractions, the boundaries themselves for steps."""
    if unit == "steps":
        return list(boundaries)
    scale = steps_per_epoch if unit == "epochs" else total_steps
    return [round(boundary * scale) for boundary in boundaries]


def warmup(
    schedule: Schedule,
    *,
    steps: int | None = None,
    epochs: float | None = None,
    start: float = 0.0,
) -> Schedule:
    """A linear warmup in front of `schedule`.

    With W warmup steps, step `s < W` trains at
    `start + (target - start) * (s + 1) / W`, where `target = schedule(W)`:
    the ramp ends at the target on step W - 1 and never uses `start` itself.
    From step W on, `schedule` decides. Goyal et al. 2017 start from the
    one-GPU rate (0.1) and reach 0.1 x B/256 after 5 epochs.

    Args:
      schedule: the schedule after the warmup.
      steps: the warmup length in steps, >= 1.
      epochs: or in epochs (> 0, may be fractional); the warmup then lasts
        `round(epochs * steps_per_epoch)` steps, at least 1.
      start: the learning rate the ramp starts from.

    Returns:
      The schedule with the warmup.

    Raises:
      ValueError: for both `steps` and `epochs`, or neither.
    """
    _one_of(("steps", "epochs"), steps, epochs)
    start = float(start)

    def warmup_schedule(step: int, steps_per_epoch: int) -> float:
        length = steps if steps is not None else _to_steps(epochs, steps_per_epoch)
        if step >= length:
            return float(schedule(step, steps_per_epoch))
        target = float(schedule(length, steps_per_epoch))
        return float(start + (target - start) * (step + 1) / length)

    return warmup_schedule


def cosine(
    base: float,
    *,
    total_steps: int | None = None,
    total_epochs: float | None = None,
    final: float = 0.0,
) -> Schedule:
    """Cosine decay from `base` to `final` (Loshchilov & Hutter 2017, no restarts).

    `lr = final + (base - final) * (1 + cos(pi * min(step, T) / T)) / 2`, so
    `base` at step 0, and `final` from step T on.

    Args:
      base: the learning rate at step 0.
      total_steps: T, the decay length in steps, >= 1.
      total_epochs: or in epochs (> 0); T is then
        `round(total_epochs * steps_per_epoch)`, at least 1.
      final: the learning rate at and after step T.

    Returns:
      The schedule.

    Raises:
      ValueError: for both `total_steps` and `total_epochs`, or neither.
    """
    _one_of(("total_steps", "total_epochs"), total_steps, total_epochs)
    base, final = float(base), float(final)

    def cosine_schedule(step: int, steps_per_epoch: int) -> float:
        total = total_steps if total_steps is not None else _to_steps(total_epochs, steps_per_epoch)
        progress = min(step, total) / total
        return float(final + 0.5 * (base - final) * (1.0 + math.cos(math.pi * progress)))

    return cosine_schedule


def linear(
    base: float,
    *,
    total_steps: int,
    final: float = 0.0,
    begin_steps: int | None = None,
    begin_epochs: float | None = None,
) -> Schedule:
    """Linear decay from `base` at step B to `final` at step `total_steps`.

    `lr = base + (final - base) * clip((step - B) / (total_steps - B), 0, 1)`:
    with a warmup of B steps in front (`warmup`), the triangle of a one-cycle
    schedule, whose peak `base` is reached at the warmup's end.

    Args:
      base: the learning rate until step B.
      total_steps: the run's length: `final` at its end.
      final: the learning rate at the end.
      begin_steps: B in steps (default 0) ...
      begin_epochs: ... or in epochs (the warmup's length).

    Raises:
      ValueError: for both `begin_steps` and `begin_epochs`.
    """
    if begin_steps is not None and begin_epochs is not None:
        raise ValueError("give at most one of begin_steps and begin_epochs")
    base, final = float(base), float(final)

    def linear_schedule(step: int, steps_per_epoch: int) -> float:
        begin = begin_steps or 0
        if begin_epochs is not None:
            begin = _to_steps(begin_epochs, steps_per_epoch)
        length = max(1, total_steps - begin)
        progress = min(max(step - begin, 0), length) / length
        return float(base + (final - base) * progress)

    return linear_schedule


def exponential(
    base: float,
    *,
    decay_rate: float,
    decay_steps: float | None = None,
    decay_epochs: float | None = None,
    staircase: bool = False,
) -> Schedule:
    """Exponential decay: `base * decay_rate ** (step / D)`.

    Args:
      base: the learning rate at step 0.
      decay_rate: the factor per period D, > 0 (e.g. 0.97).
      decay_steps: D in steps, > 0.
      decay_epochs: or in epochs, > 0; D is then
        `round(decay_epochs * steps_per_epoch)`, at least 1.
      staircase: use `floor(step / D)`: the rate drops once per period.

    Returns:
      The schedule.

    Raises:
      ValueError: for both `decay_steps` and `decay_epochs`, or neither.
    """
    _one_of(("decay_steps", "decay_epochs"), decay_steps, decay_epochs)
    base, decay_rate = float(base), float(decay_rate)

    def exponential_schedule(step: int, steps_per_epoch: int) -> float:
        period = (
            decay_steps if decay_steps is not None else _to_steps(decay_epochs, steps_per_epoch)
        )
        exponent = step // period if staircase else step / period
        return float(base * decay_rate**exponent)

    return exponential_schedule


def scaled(schedule: Schedule, factor: float) -> Schedule:
    """`schedule` multiplied by `factor` (e.g. the linear scaling rule's B / 256).

    Args:
      schedule: the schedule to scale.
      factor: the multiplier.

    Returns:
      The scaled schedule.
    """
    factor = float(factor)

    def scaled_schedule(step: int, steps_per_epoch: int) -> float:
        return factor * float(schedule(step, steps_per_epoch))

    return scaled_schedule


def linear_scaling(base_lr: float, global_batch_size: int, reference: int = 256) -> float:
    """The linear scaling rule (Goyal et al. 2017): the rate grows with the batch.

    Args:
      base_lr: the learning rate for a batch of `reference` examples.
      global_batch_size: the batch over all towers and workers.
      reference: the batch size `base_lr` is meant for.

    Returns:
      `base_lr * global_batch_size / reference`, e.g. 0.4 for 0.1 at batch 1024.
    """
    return base_lr * global_batch_size / reference
