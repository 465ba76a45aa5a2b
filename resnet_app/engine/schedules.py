"""Learning-rate schedules: pure Python functions of the step, without TensorFlow.

A schedule is any callable `schedule(step, steps_per_epoch) -> float`, where
`step` counts optimizer updates from 0. The training loop calls it on the host
before every step and logs the value it used, so the schedules here use only
`math`: cheap to call, and testable without TensorFlow.

Conventions shared by every schedule here:
- Epochs become steps as `round(epochs * steps_per_epoch)` (Python's round,
  half to even), so epoch 30 at 1251 steps per epoch is step 37530.
- A boundary belongs to the interval it starts: the new value is used from step
  `b` on (`step >= b`), the old one up to step `b - 1`.
- A linear warmup of W steps ends at its target and never uses 0 (Goyal et al.
  2017): `lr = start + (target - start) * (step + 1) / W` for `step < W`, where
  `target` is the wrapped schedule's value at step W. So step 0 trains at
  target / W (when `start` is 0), step W - 1 at the target, and from step W on
  the wrapped schedule takes over, continuously.

`create_schedule` builds a schedule from the `schedule:` section of a config
(`config/schedule_kinds.py`, whose checks the factories here share).
`load_script` loads a user's function from a Python file
(`--lr_schedule=PATH.py:FUNCTION`); `check_schedule` tries any schedule at a few
steps before training starts, so that a broken one fails in a second, not after
an epoch.
"""

from __future__ import annotations

import bisect
import functools
import importlib.util
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from resnet_app.common.errors import ConfigError
from resnet_app.config import schedule_kinds
from resnet_app.config.schedule_kinds import (
    ScheduleSection,
    check_boundaries,
    check_flag,
    check_number,
    check_one_of,
    check_positive_int,
    check_rates,
    key,
)

Schedule = Callable[[int, int], float]
"""`schedule(step, steps_per_epoch) -> learning rate`, `step` counting from 0."""


def _to_steps(epochs: float, steps_per_epoch: int) -> int:
    """The step count of a (possibly fractional) number of epochs, at least 1."""
    return max(1, round(epochs * steps_per_epoch))


def constant(value: float) -> Schedule:
    """The same learning rate at every step.

    Args:
      value: the learning rate, >= 0.

    Returns:
      The schedule.
    """
    value = check_number("a constant learning rate", value)

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
      boundaries: strictly increasing, >= 0, in `unit`s. Epochs may be
        fractional; they are compared as `round(b * steps_per_epoch)` steps.
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
      ConfigError: for a bad unit, boundaries that do not increase, lists of
        the wrong length, negative rates, or not exactly one of `values` and
        `multipliers`.
    """
    bounds = check_boundaries(boundaries, unit)
    check_one_of(("values", "multipliers"), values, multipliers)
    if multipliers is not None:
        if base is None:
            raise ConfigError("piecewise 'multipliers' need the base learning rate they multiply")
        base = check_number("the base learning rate", base)
        rates = [base * m for m in check_rates("multipliers", multipliers, len(bounds) + 1)]
    else:
        if base is not None:
            raise ConfigError(
                "piecewise 'values' are absolute learning rates; give 'multipliers' to use a base"
            )
        rates = check_rates("values", values, len(bounds) + 1)

    # bisect_right counts the boundaries b <= step: the index of the interval.
    if unit == "fraction":
        check_positive_int("the run's total_steps", total_steps)
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
      start: the learning rate the ramp starts from, >= 0.

    Returns:
      The schedule with the warmup.

    Raises:
      ConfigError: for a warmup <= 0, both `steps` and `epochs` or neither, or
        a negative `start`.
    """
    check_one_of(("warmup_steps", "warmup_epochs"), steps, epochs)
    if steps is not None:
        steps = check_positive_int(key("warmup_steps"), steps)
    else:
        epochs = check_number(key("warmup_epochs"), epochs, positive=True)
    start = check_number("the warmup start", start)

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
      base: the learning rate at step 0, >= 0.
      total_steps: T, the decay length in steps, >= 1.
      total_epochs: or in epochs (> 0); T is then
        `round(total_epochs * steps_per_epoch)`, at least 1.
      final: the learning rate at and after step T, >= 0.

    Returns:
      The schedule.

    Raises:
      ConfigError: for negative rates, a length <= 0, or not exactly one of
        `total_steps` and `total_epochs`.
    """
    base = check_number("the base learning rate", base)
    final = check_number(key("final"), final)
    check_one_of(("total_steps", "total_epochs"), total_steps, total_epochs)
    if total_steps is not None:
        total_steps = check_positive_int(key("total_steps"), total_steps)
    else:
        total_epochs = check_number(key("total_epochs"), total_epochs, positive=True)

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
      base: the learning rate until step B, >= 0.
      total_steps: the run's length: `final` at its end.
      final: the learning rate at the end, >= 0.
      begin_steps: B in steps (default 0) ...
      begin_epochs: ... or in epochs (the warmup's length).
    """
    base = check_number("the base learning rate", base)
    final = check_number(key("final"), final)
    total_steps = check_positive_int("the run's total_steps", total_steps)

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
      base: the learning rate at step 0, >= 0.
      decay_rate: the factor per period D, > 0 (e.g. 0.97).
      decay_steps: D in steps, > 0.
      decay_epochs: or in epochs, > 0; D is then
        `round(decay_epochs * steps_per_epoch)`, at least 1.
      staircase: use `floor(step / D)`: the rate drops once per period.

    Returns:
      The schedule.

    Raises:
      ConfigError: for a negative base, a decay rate or period <= 0, not exactly
        one of `decay_steps` and `decay_epochs`, or a non-boolean `staircase`.
    """
    base = check_number("the base learning rate", base)
    decay_rate = check_number(key("decay_rate"), decay_rate, positive=True)
    check_one_of(("decay_steps", "decay_epochs"), decay_steps, decay_epochs)
    if decay_steps is not None:
        decay_steps = check_number(key("decay_steps"), decay_steps, positive=True)
    else:
        decay_epochs = check_number(key("decay_epochs"), decay_epochs, positive=True)
    check_flag("staircase", staircase)

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
      factor: the multiplier, >= 0.

    Returns:
      The scaled schedule.
    """
    factor = check_number("a schedule scale factor", factor)

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


def create_schedule(
    spec: ScheduleSection | Mapping[str, Any] | None,
    *,
    base_lr: float,
    global_batch_size: int,
    total_steps: int,
) -> Schedule:
    """Builds the schedule a config's `schedule:` section describes.

    Keys (a key set to null counts as absent; `config/schedule_kinds.py`
    declares them, their defaults and their checks):
    - `name`: constant (the default), piecewise, cosine, linear, exponential or script.
    - `batch_scaling`: a reference batch such as 256: every learning rate of the
      schedule (`base_lr`, piecewise `values`, cosine `final`) is multiplied by
      `global_batch_size / batch_scaling`. Not for scripts.
    - `warmup_steps` or `warmup_epochs`: a linear warmup (see `warmup`), from
      `warmup_start` (default 0, not scaled) to the schedule's (scaled) value
      at the end of the warmup. Not for scripts.
    - piecewise: `boundaries`, `unit` (steps, the default, epochs, or
      fraction of the run), and `values` (absolute rates) or `multipliers`
      (of `base_lr`).
    - cosine: `final` (default 0); it decays over the run's `total_steps`
      unless `total_steps` or `total_epochs` is given.
    - linear: `final` (default 0), reached at the run's end, from the end of
      the warmup (a one-cycle triangle with a warmup from 0).
    - exponential: `decay_rate`, `decay_steps` or `decay_epochs`, `staircase`.
    - script: `path`, "PATH.py:FUNCTION"; the function's value is used as is.

    He et al. (2015), CIFAR (64k steps at batch 128: the default, at half and
    three quarters of any run), and Goyal et al. (2017), ImageNet (90 epochs):

        {"name": "piecewise", "boundaries": [0.5, 0.75], "unit": "fraction",
         "multipliers": [1, 0.1, 0.01]}
        {"name": "piecewise", "boundaries": [30, 60, 80], "unit": "epochs",
         "multipliers": [1, 0.1, 0.01, 0.001], "warmup_epochs": 5,
         "batch_scaling": 256}

    Args:
      spec: the `schedule:` section, or a mapping of its keys (None or empty:
        a constant `base_lr`).
      base_lr: the optimizer's configured learning rate.
      global_batch_size: the batch over all towers and workers.
      total_steps: the length of the run, in steps.

    Returns:
      The schedule.

    Raises:
      ConfigError: for an unknown schedule, an unknown or missing key, or an
        impossible value; the message names the key.
    """
    if not isinstance(spec, ScheduleSection):
        spec = ScheduleSection.from_mapping({} if spec is None else spec)
    if isinstance(spec, schedule_kinds.Script):
        return load_script(spec.path)
    base_lr = check_number("optimizer.learning_rate", base_lr)
    check_positive_int("the global batch size", global_batch_size)
    check_positive_int("the run's total_steps", total_steps)
    schedule = _create_kind(spec, base_lr, total_steps)
    # Scaling the whole schedule scales absolute rates (values, final) as well.
    if spec.batch_scaling is not None:
        schedule = scaled(schedule, linear_scaling(1.0, global_batch_size, spec.batch_scaling))
    if spec.has_warmup:
        schedule = warmup(
            schedule, steps=spec.warmup_steps, epochs=spec.warmup_epochs, start=spec.warmup_start
        )
    return schedule


def _create_kind(spec: schedule_kinds.RateSchedule, base_lr: float, total_steps: int) -> Schedule:
    """The schedule of `spec`'s kind, before batch scaling and warmup."""
    if isinstance(spec, schedule_kinds.Piecewise):
        return piecewise(
            spec.boundaries,
            values=spec.values,
            multipliers=spec.multipliers,
            base=base_lr if spec.multipliers is not None else None,
            unit=spec.unit,
            total_steps=spec.total_steps or total_steps,
        )
    if isinstance(spec, schedule_kinds.Cosine):
        run_length = total_steps if spec.total_epochs is None else None
        return cosine(
            base_lr,
            total_steps=spec.total_steps if spec.total_steps is not None else run_length,
            total_epochs=spec.total_epochs,
            final=spec.final,
        )
    if isinstance(spec, schedule_kinds.Linear):
        return linear(
            base_lr,
            total_steps=total_steps,
            final=spec.final,
            begin_steps=spec.warmup_steps,
            begin_epochs=spec.warmup_epochs,
        )
    if isinstance(spec, schedule_kinds.Exponential):
        return exponential(
            base_lr,
            decay_rate=spec.decay_rate,
            decay_steps=spec.decay_steps,
            decay_epochs=spec.decay_epochs,
            staircase=spec.staircase,
        )
    return constant(base_lr)


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


def _as_learning_rate(value: Any, step: int, source: str) -> float:
    """`value` as a Python float, if it is a finite number >= 0."""
    if value is None or isinstance(value, (str, bytes, bool)):
        problem = f"returned {value!r}"
    else:
        try:
            rate = float(value)  # Also numpy scalars, 0-d arrays, eager tensors.
        except (TypeError, ValueError):
            problem = f"returned a {type(value).__name__}"
        else:
            if math.isfinite(rate) and rate >= 0:
                return rate
            problem = f"returned {rate!r}"
    raise ConfigError(f"{source} {problem} at step {step}; it must return a finite number >= 0")


def load_script(spec: str) -> Schedule:
    """Loads a user's schedule function from a Python file.

    The function is called as `function(step, steps_per_epoch)` and its value
    used as is; the returned schedule converts it to a Python float and raises
    `ConfigError` if it is not a finite number >= 0.

    Args:
      spec: "PATH.py:FUNCTION", e.g. "scripts/schedules/one_cycle.py:one_cycle".

    Returns:
      The schedule.

    Raises:
      ConfigError: for a spec without ':', a missing file, a file that fails
        to import, or a FUNCTION it does not define or that is not callable.
    """
    path, _, function_name = spec.rpartition(":") if isinstance(spec, str) else ("", "", "")
    if not path or not function_name:
        raise ConfigError(
            f"--lr_schedule={spec} needs PATH.py:FUNCTION, "
            "e.g. scripts/schedules/one_cycle.py:one_cycle"
        )
    if not os.path.isfile(path):
        raise ConfigError(
            f"schedule script {path} not found (relative paths start at {os.getcwd()})"
        )
    module_name = "_lr_schedule_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"schedule script {path} is not a Python file; name it *.py")
    module = importlib.util.module_from_spec(module_spec)
    # Registered only while it runs, for code that looks itself up (dataclasses).
    previous = sys.modules.get(module_name)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:  # The user's code: any failure is theirs.
        raise ConfigError(f"schedule script {path} failed on import: {_one_line(error)}") from error
    finally:
        if previous is None:
            sys.modules.pop(module_name, None)
        else:
            sys.modules[module_name] = previous

    if not hasattr(module, function_name):
        defined = sorted(
            name
            for name, value in vars(module).items()
            if callable(value)
            and not name.startswith("_")
            and getattr(value, "__module__", None) == module_name
        )
        raise ConfigError(
            f"schedule script {path} defines no {function_name!r}; "
            f"callables defined there: {', '.join(defined) or 'none'}"
        )
    function = getattr(module, function_name)
    if not callable(function):
        raise ConfigError(
            f"{function_name!r} in schedule script {path} is a {type(function).__name__}, "
            "not a function of (step, steps_per_epoch)"
        )
    source = f"schedule script {spec}"

    @functools.wraps(function)
    def script_schedule(step: int, steps_per_epoch: int) -> float:
        return _as_learning_rate(function(step, steps_per_epoch), step, source)

    return script_schedule


def check_schedule(schedule: Schedule, steps_per_epoch: int, total_steps: int) -> dict[int, float]:
    """Tries `schedule` at a few steps, so that a broken one fails before training.

    The steps are 0, 1, the last step of the first epoch and the first of the
    second, every eighth of the run, and the last step, `total_steps - 1`.

    Args:
      schedule: the schedule to check.
      steps_per_epoch: steps in one epoch, >= 1.
      total_steps: the length of the run, >= 1.

    Returns:
      The learning rate at each step tried, as Python floats.

    Raises:
      ConfigError: naming the step, if the schedule raises there or returns
        something other than a finite number >= 0.
    """
    check_positive_int("steps_per_epoch", steps_per_epoch)
    check_positive_int("the run's total_steps", total_steps)
    last = total_steps - 1
    steps = {0, 1, steps_per_epoch - 1, steps_per_epoch, last}
    steps.update(round(last * eighth / 8) for eighth in range(1, 8))
    source = f"learning-rate schedule {getattr(schedule, '__name__', repr(schedule))}"
    rates = {}
    for step in sorted(step for step in steps if step <= last):
        try:
            value = schedule(step, steps_per_epoch)
        except ConfigError:
            raise
        except Exception as error:  # Whoever wrote it, say where it broke.
            raise ConfigError(f"{source} raised at step {step}: {_one_line(error)}") from error
        rates[step] = _as_learning_rate(value, step, source)
    return rates
