"""The `schedule:` section: one dataclass per learning-rate schedule, whose `build` is its curve.

A kind's fields are its keys, checked once when the section is read (their help,
in the docstring's "Attributes:", is docs/config.md); its `rate` is the learning
rate at a step, in pure Python. `class Name(RateSchedule, kind="name")` registers
a kind; nothing else needs an edit.

Epochs become steps as `max(1, round(epochs * steps_per_epoch))`. A boundary's
rate applies from its step on. A warmup of W steps ends on its target, the rate
at step W, and never trains at its start (Goyal et al. 2017).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from resnet_app.common import fields
from resnet_app.common.errors import ConfigError
from resnet_app.common.fields import AT_LEAST_0, AT_LEAST_1, FLAG, MORE_THAN_0, Rule, setting
from resnet_app.config.oneof import OneOfSection, alternative, check_alternatives

Schedule = Callable[[int, int], float]
"""`schedule(step, steps_per_epoch) -> learning rate`, `step` counting updates from 0."""

REFERENCE_BATCH = Rule(
    AT_LEAST_1.test,
    "the batch size the learning rates are meant for, such as 256 (or null for none)",
    int,
)
UNIT = Rule(
    lambda x: x in ("steps", "epochs", "fraction"), "steps, epochs or fraction (of the run)"
)


def to_steps(epochs: float, steps_per_epoch: int) -> int:
    """The steps of a (possibly fractional) number of epochs, at least 1."""
    return max(1, round(epochs * steps_per_epoch))


def is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str)


class ScheduleSection(OneOfSection):
    """The `schedule:` section's family: `name` names the kind (constant if absent)."""

    SECTION = "schedule"
    KEY = "name"
    KINDS: dict[str, type[ScheduleSection]] = {}
    DEFAULT_KIND = "constant"
    RUNS_CODE = False  # The kind imports and runs a user's file (`path`): it needs consent.
    NULL_IS_ABSENT = True

    def __post_init__(self):
        fields.check_declared(self, "schedule key '{}'")
        check_alternatives(self, "schedule.{}")
        self.check()

    def check(self) -> None:
        """The checks the fields' declared rules do not make: how they relate."""

    def warmup_length(self, steps_per_epoch: int) -> int:
        """The steps of the linear warmup the schedule starts with (0: none)."""
        return 0

    def describe(self, rate: Callable[[int], str], start: int, total: int, per_epoch: int) -> str:
        """The rate over a run of `total` steps, for the start line; `rate(step)` formats
        the rate at a step, `start` is the first step after the warmup."""
        return f"{self.kind} from {rate(start)} to {rate(total - 1)}"

    def warnings(self, per_epoch: int, total: int) -> list[str]:
        """What in the section never applies in a run of `total` steps."""
        return []

    @classmethod
    def unknown_kind_error(cls, kind: Any) -> ConfigError:
        return ConfigError(f"unknown schedule {kind!r}; valid schedules: {cls.valid_kinds()}")

    @classmethod
    def unknown_keys_error(cls, keys: list[Any]) -> ConfigError:
        return ConfigError(
            f"unknown schedule key {keys[0]!r} for {cls.KIND}; valid keys: {cls.valid_keys()}"
        )


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class RateSchedule(ScheduleSection):
    """The keys of every schedule of the optimizer's learning rate (all but scripts).

    Attributes:
      batch_scaling: a reference batch such as 256: every learning rate of the
        schedule is multiplied by global batch / batch_scaling (or null).
      warmup_steps: a linear warmup of this many steps (or null).
      warmup_epochs: or of this many epochs (or null).
      warmup_start: the learning rate the warmup starts from (not scaled).
    """

    batch_scaling: int | None = setting(None, REFERENCE_BATCH)
    warmup_steps: int | None = alternative("warmup_epochs", rule=AT_LEAST_1)
    warmup_epochs: float | None = alternative("warmup_steps", rule=MORE_THAN_0)
    warmup_start: float = setting(0.0, AT_LEAST_0)

    def check(self) -> None:
        if self.warmup_start and self.warmup_steps is None and self.warmup_epochs is None:
            raise ConfigError("schedule key 'warmup_start' needs warmup_steps or warmup_epochs")

    def rate(self, step: int, steps_per_epoch: int, base_lr: float, total_steps: int) -> float:
        """The kind's learning rate at `step` of a `total_steps` run, before scaling and warmup."""
        raise NotImplementedError(f"schedule {self.KIND} has no rate()")

    def build(self, base_lr: float, global_batch_size: int, total_steps: int) -> Schedule:
        """The schedule: `rate` times global_batch_size / batch_scaling, after the warmup."""
        scale = 1.0 if self.batch_scaling is None else 1.0 * global_batch_size / self.batch_scaling
        start = self.warmup_start

        def schedule(step: int, steps_per_epoch: int) -> float:
            warmup = self.warmup_length(steps_per_epoch)
            at = max(step, warmup)  # The ramp's target is the rate where it ends.
            rate = scale * float(self.rate(at, steps_per_epoch, base_lr, total_steps))
            return rate if step >= warmup else float(start + (rate - start) * (step + 1) / warmup)

        schedule.__name__ = f"{self.KIND}_schedule"  # What check_schedule's messages name.
        return schedule

    def field_values(self) -> dict[str, Any]:
        """Every field, the kind's own first, then the keys every schedule has."""
        values = super().field_values()
        shared = [field.name for field in dataclasses.fields(RateSchedule)]
        own = {name: value for name, value in values.items() if name not in shared}
        return {**own, **{name: values[name] for name in shared}}

    def warmup_length(self, steps_per_epoch: int) -> int:
        if self.warmup_epochs is not None:
            return to_steps(self.warmup_epochs, steps_per_epoch)
        return self.warmup_steps or 0


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class Constant(RateSchedule, kind="constant"):
    """The optimizer's learning rate at every step."""

    def rate(self, step: int, steps_per_epoch: int, base_lr: float, total_steps: int) -> float:
        return base_lr


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class Piecewise(RateSchedule, kind="piecewise"):
    """Piecewise constant: one learning rate between two boundaries.

    Attributes:
      boundaries: strictly increasing, in `unit`s.
      unit: "steps", "epochs" or "fraction" (of the run's steps: 0.5 is
        its middle, whatever its length).
      values: absolute learning rates, one more than the boundaries.
      multipliers: or factors of the optimizer's learning rate.
      total_steps: with unit "fraction", the steps the fractions are of
        (null: the run's length). A run lengthened on resume sets it to the
        length it had, so that its drops stay where they were.
    """

    boundaries: tuple[float, ...]
    unit: str = setting("steps", UNIT)
    values: tuple[float, ...] | None = alternative("multipliers", required=True)
    multipliers: tuple[float, ...] | None = alternative("values", required=True)
    total_steps: int | None = setting(None, AT_LEAST_1)

    def check(self) -> None:
        what, bounds = "schedule key 'boundaries'", self.boundaries
        if not is_list(bounds):
            raise ConfigError(
                f"{what} needs a list of {self.unit}, e.g. [30, 60, 80]; got {bounds!r}"
            )
        numbers = [AT_LEAST_0.check(what, bound) for bound in bounds]
        if self.unit == "fraction" and not all(0 < number < 1 for number in numbers):
            raise ConfigError(
                f"{what} in fractions of the run must lie strictly between 0 and 1, "
                f"e.g. [0.5, 0.75]; got {list(bounds)}"
            )
        if any(current <= previous for previous, current in zip(numbers, numbers[1:])):
            raise ConfigError(f"{what} must be strictly increasing, got {list(bounds)}")
        object.__setattr__(self, "boundaries", tuple(bounds))
        if self.total_steps is not None and self.unit != "fraction":
            raise ConfigError(
                "schedule key 'total_steps' is for boundaries in fractions "
                f"(schedule.unit=fraction), not in {self.unit}"
            )
        for name in ("values", "multipliers"):
            rates, what = getattr(self, name), f"schedule key '{name}'"
            if rates is None:
                continue
            if not is_list(rates):
                raise ConfigError(f"{what} needs a list of numbers, got {rates!r}")
            if len(rates) != len(bounds) + 1:
                raise ConfigError(
                    f"{what} needs {len(bounds) + 1} entries (one more than 'boundaries'), "
                    f"got {len(rates)}: {list(rates)}"
                )
            for rate in rates:
                if not AT_LEAST_0.test(rate):
                    raise ConfigError(f"{what} needs numbers >= 0, got {rate!r} in {list(rates)}")
            object.__setattr__(self, name, tuple(float(rate) for rate in rates))
        super().check()

    def _steps(self, per_epoch: int, total: int) -> list[float]:
        """Where the boundaries fall; in steps as written (a boundary may be fractional)."""
        if self.unit == "steps":
            return [float(boundary) for boundary in self.boundaries]
        scale = per_epoch if self.unit == "epochs" else self.total_steps or total
        return [round(float(boundary) * scale) for boundary in self.boundaries]

    def boundary_steps(self, per_epoch: int, total: int) -> list[int]:
        """The steps the boundaries fall at in a run of `total` steps."""
        return [round(step) for step in self._steps(per_epoch, total)]

    def rate(self, step: int, steps_per_epoch: int, base_lr: float, total_steps: int) -> float:
        rates = self.values or [base_lr * multiplier for multiplier in self.multipliers]
        return rates[bisect.bisect_right(self._steps(steps_per_epoch, total_steps), step)]

    def describe(self, rate: Callable[[int], str], start: int, total: int, per_epoch: int) -> str:
        changes = [
            f"{rate(step)} from step {step:,} ({step / total:.0%})"
            for step in self.boundary_steps(per_epoch, total)
            if start < step < total
        ]
        return rate(start) + (", then " + ", ".join(changes) if changes else "")

    def warnings(self, per_epoch: int, total: int) -> list[str]:
        steps = self.boundary_steps(per_epoch, total)
        late = [b for b, at in zip(self.boundaries, steps) if at >= total]
        if not late:
            return []
        return [
            f"Schedule boundaries {late} ({self.unit}) fall at or after the end of the run "
            f"({total} steps) and never apply; set schedule.boundaries for this length, or "
            "give them as fractions of the run (schedule.unit=fraction)"
        ]


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class Cosine(RateSchedule, kind="cosine"):
    """Cosine decay to `final` (Loshchilov & Hutter 2017, no restarts).

    Attributes:
      final: the learning rate at the end.
      total_steps: the decay's length in steps (null: the run's length).
      total_epochs: or in epochs.
    """

    final: float = setting(0.0, AT_LEAST_0)
    total_steps: int | None = alternative("total_epochs", rule=AT_LEAST_1)
    total_epochs: float | None = alternative("total_steps", rule=MORE_THAN_0)

    def rate(self, step: int, steps_per_epoch: int, base_lr: float, total_steps: int) -> float:
        length = self.total_steps or total_steps
        if self.total_epochs is not None:
            length = to_steps(self.total_epochs, steps_per_epoch)
        progress = min(step, length) / length
        return self.final + 0.5 * (base_lr - self.final) * (1.0 + math.cos(math.pi * progress))


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class Linear(RateSchedule, kind="linear"):
    """Linear decay to `final` at the end of the run, from the end of the warmup.

    With a warmup from 0 it is the triangular one-cycle schedule of Page
    2018's ResNet-9 (0 to 0.4 over 5 epochs, then to 0 at epoch 24) and of
    Smith 2018.

    Attributes:
      final: the learning rate at the end of the run.
    """

    final: float = setting(0.0, AT_LEAST_0)

    def rate(self, step: int, steps_per_epoch: int, base_lr: float, total_steps: int) -> float:
        begin = self.warmup_length(steps_per_epoch)
        length = max(1, total_steps - begin)
        return base_lr + (self.final - base_lr) * (min(max(step - begin, 0), length) / length)


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class Exponential(RateSchedule, kind="exponential"):
    """Exponential decay: the learning rate times decay_rate ** (step / period).

    Attributes:
      decay_rate: the factor per period, > 0.
      decay_steps: the period in steps.
      decay_epochs: or in epochs.
      staircase: drop once per period instead of smoothly.
    """

    decay_rate: float = setting(rule=MORE_THAN_0)  # Required.
    decay_steps: float | None = alternative("decay_epochs", required=True, rule=MORE_THAN_0)
    decay_epochs: float | None = alternative("decay_steps", required=True, rule=MORE_THAN_0)
    staircase: bool = setting(False, FLAG)

    def rate(self, step: int, steps_per_epoch: int, base_lr: float, total_steps: int) -> float:
        period = self.decay_steps or to_steps(self.decay_epochs, steps_per_epoch)
        return base_lr * self.decay_rate ** (step // period if self.staircase else step / period)


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class Script(ScheduleSection, kind="script"):
    """A user's function, used as is (no scaling, no warmup). It runs only when the
    command line names it (`--lr_schedule`) or allows it (`--allow_scripts`), or
    on the resume of a run that ran it, while its content is unchanged.

    Attributes:
      path: "PATH.py:FUNCTION", FUNCTION(step, steps_per_epoch) -> learning rate.
    """

    RUNS_CODE = True

    path: str = setting(rule=Rule(lambda x: isinstance(x, str), "PATH.py:FUNCTION"))

    def describe(self, rate: Callable[[int], str], start: int, total: int, per_epoch: int) -> str:
        return f"from {self.path}"
