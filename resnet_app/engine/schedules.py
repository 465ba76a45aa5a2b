"""A run's learning-rate schedule: its `schedule:` section's curve, or a user's script.

The kinds and their curves are `config/schedule_kinds.py`'s. Loading a script
(`--lr_schedule=PATH.py:FUNCTION`) is the engine's business, not the config's:
code runs. `check_schedule` tries any schedule at a few steps, so that a broken
one fails in a second, not after an epoch.
"""

from __future__ import annotations

import functools
import math
import os
import re
import runpy
from collections.abc import Mapping
from typing import Any

from resnet_app.common.errors import ConfigError
from resnet_app.common.fields import AT_LEAST_1
from resnet_app.config.schedule_kinds import Schedule, ScheduleSection, Script


def create_schedule(
    spec: ScheduleSection | Mapping[str, Any] | None,
    *,
    base_lr: float,
    global_batch_size: int,
    total_steps: int,
) -> Schedule:
    """The schedule of a `schedule:` section, or of a mapping of its keys (None: constant).

    A script's function is used as is; any other kind's `build` gives its curve.

    Raises:
      ConfigError: for an unknown kind or key, or a bad value; the message names the key.
    """
    if not isinstance(spec, ScheduleSection):
        spec = ScheduleSection.from_mapping({} if spec is None else spec)
    if isinstance(spec, Script):
        return load_script(spec.path)
    return spec.build(base_lr, global_batch_size, total_steps)


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
    """The function FUNCTION(step, steps_per_epoch) of a "PATH.py:FUNCTION" spec, its
    value returned as a Python float (a `ConfigError` if not a finite number >= 0).

    Raises:
      ConfigError: for a spec without ':', a missing file, a file that fails
        to import, or a FUNCTION it does not define or that is not callable.
    """
    path, _, function_name = spec.rpartition(":") if isinstance(spec, str) else ("", "", "")
    if not path or not function_name:
        raise ConfigError(
            f"--lr_schedule={spec} needs PATH.py:FUNCTION, e.g. my_schedule.py:learning_rate"
        )
    if not os.path.isfile(path):
        raise ConfigError(
            f"schedule script {path} not found (relative paths start at {os.getcwd()})"
        )
    if not path.endswith(".py"):
        raise ConfigError(f"schedule script {path} is not a Python file; name it *.py")
    # run_path registers the module only while it runs, for code that looks itself up.
    module_name = "_lr_schedule_" + re.sub(r"\W", "_", os.path.basename(path)[:-3])
    try:
        namespace = runpy.run_path(path, run_name=module_name)
    except (Exception, SystemExit) as error:  # The user's code: any failure is theirs.
        raise ConfigError(f"schedule script {path} failed on import: {_one_line(error)}") from error
    if function_name not in namespace:
        defined = sorted(
            name
            for name, value in namespace.items()
            if callable(value)
            and not name.startswith("_")
            and getattr(value, "__module__", None) == module_name
        )
        raise ConfigError(
            f"schedule script {path} defines no {function_name!r}; "
            f"callables defined there: {', '.join(defined) or 'none'}"
        )
    function = namespace[function_name]
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
    """Tries `schedule` at steps 0, 1, both sides of the first epoch's end, every eighth
    of the run and its last step; returns {step: rate} as Python floats.

    Raises:
      ConfigError: naming the step, if the schedule raises there or returns
        something other than a finite number >= 0.
    """
    AT_LEAST_1.check("steps_per_epoch", steps_per_epoch)
    AT_LEAST_1.check("the run's total_steps", total_steps)
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
