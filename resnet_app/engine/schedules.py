"""The learning-rate schedule of a run: built from its config, or loaded from a user's script.

A schedule is any callable `schedule(step, steps_per_epoch) -> float`, where
`step` counts optimizer updates from 0; the curves themselves, and their
conventions (epochs to steps, boundaries, the warmup's ramp), are
`common/lr_curves.py`'s.

`create_schedule` builds the schedule of a config's `schedule:` section: the
section's kind (`config/schedule_kinds.py`, which checks its keys) builds its
curve, and the keys every kind but `script` has, `batch_scaling` and the
warmup, wrap it here. `load_script` loads a user's function from a Python file
(`--lr_schedule=PATH.py:FUNCTION`), which is the engine's business rather than
the config's: code runs. `check_schedule` tries any schedule at a few steps
before training starts, so that a broken one fails in a second, not after an
epoch.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

from resnet_app.common import lr_curves
from resnet_app.common.errors import ConfigError
from resnet_app.common.fields import check_number, check_positive_int
from resnet_app.common.lr_curves import Schedule
from resnet_app.config.schedule_kinds import ScheduleSection, Script


def create_schedule(
    spec: ScheduleSection | Mapping[str, Any] | None,
    *,
    base_lr: float,
    global_batch_size: int,
    total_steps: int,
) -> Schedule:
    """Builds the schedule a config's `schedule:` section describes.

    `name` picks the kind (constant if absent); each kind's keys, defaults and
    checks are its dataclass in `config/schedule_kinds.py`, listed with their
    help in docs/config.md (generated from them). A key set to null counts as
    absent. The kind's `build` gives its curve; then, for every kind but
    `script`:
    - `batch_scaling`: a reference batch such as 256: every learning rate of the
      curve (`base_lr`, piecewise `values`, cosine `final`) is multiplied by
      `global_batch_size / batch_scaling`.
    - `warmup_steps` or `warmup_epochs`: a linear warmup (`lr_curves.warmup`),
      from `warmup_start` (default 0, not scaled) to the curve's (scaled) value
      at the end of the warmup.
    A `script`'s function (`path`, "PATH.py:FUNCTION") is used as is.

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
    if isinstance(spec, Script):  # A user's code: loaded here, not built by its section.
        return load_script(spec.path)
    base_lr = check_number("optimizer.learning_rate", base_lr)
    check_positive_int("the global batch size", global_batch_size)
    check_positive_int("the run's total_steps", total_steps)
    schedule = spec.build(base_lr, total_steps)
    # Scaling the whole schedule scales absolute rates (values, final) as well.
    if spec.batch_scaling is not None:
        factor = lr_curves.linear_scaling(1.0, global_batch_size, spec.batch_scaling)
        schedule = lr_curves.scaled(schedule, factor)
    if spec.has_warmup:
        schedule = lr_curves.warmup(
            schedule, steps=spec.warmup_steps, epochs=spec.warmup_epochs, start=spec.warmup_start
        )
    return schedule


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
