"""The `schedule:` section: one kind per learning-rate schedule, with its keys, checks and curve.

Each kind is one dataclass: its fields are its keys and defaults (the
"Attributes:" of its docstring are their help in docs/config.md), its
`check_kind` the one place its values are checked, and its `build` the curve
of `common/lr_curves.py` it describes. `class Name(RateSchedule, kind="name")`
registers it: `schedule.name: name` then reads, checks and builds it, with no
other edit. All of this is pure Python, so a bad key is answered before
TensorFlow loads.

A key set to null counts as absent. Every kind but `script` is a
`RateSchedule`: it also takes `batch_scaling` and a linear warmup, which
`engine/schedules.create_schedule` applies around what `build` returns; a
`script` (a user's code, which the engine loads) returns the learning rate as
is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from resnet_app.common import lr_curves
from resnet_app.common.errors import ConfigError
from resnet_app.common.fields import (
    AT_LEAST_0,
    AT_LEAST_1,
    FLAG,
    MORE_THAN_0,
    Rule,
    check_declared,
    check_number,
    is_number,
    is_whole,
    setting,
)
from resnet_app.common.lr_curves import UNITS, Schedule
from resnet_app.config.oneof import OneOfSection, alternative, check_alternatives

REFERENCE_BATCH = Rule(
    lambda x: is_whole(x) and x >= 1,
    "the batch size the learning rates are meant for, such as 256 (or null for none)",
    int,
)


UNIT = Rule(lambda x: x in UNITS, "steps, epochs or fraction (of the run)")


def key(name: str) -> str:
    """How messages name a schedule key: "schedule key 'final'"."""
    return f"schedule key '{name}'"


def check_boundaries(boundaries: Any, unit: Any) -> list[float]:
    """Checks a piecewise schedule's boundaries in its (checked) unit; returns them as floats."""
    if not isinstance(boundaries, Sequence) or isinstance(boundaries, str):
        raise ConfigError(
            f"schedule key 'boundaries' needs a list of {unit}, e.g. [30, 60, 80]; "
            f"got {boundaries!r}"
        )
    bounds = [check_number(key("boundaries"), boundary) for boundary in boundaries]
    if unit == "fraction" and not all(0 < bound < 1 for bound in bounds):
        raise ConfigError(
            "schedule key 'boundaries' in fractions of the run must lie strictly between 0 "
            f"and 1, e.g. [0.5, 0.75]; got {list(boundaries)}"
        )
    if any(current <= previous for previous, current in zip(bounds, bounds[1:])):
        raise ConfigError(
            f"schedule key 'boundaries' must be strictly increasing, got {list(boundaries)}"
        )
    return bounds


def check_rates(name: str, rates: Any, length: int) -> list[float]:
    """Checks a piecewise schedule's `values` or `multipliers`; returns them as floats."""
    if not isinstance(rates, Sequence) or isinstance(rates, str):
        raise ConfigError(f"schedule key '{name}' needs a list of numbers, got {rates!r}")
    if len(rates) != length:
        raise ConfigError(
            f"schedule key '{name}' needs {length} entries (one more than 'boundaries'), "
            f"got {len(rates)}: {list(rates)}"
        )
    for rate in rates:
        if not is_number(rate) or rate < 0:
            raise ConfigError(
                f"schedule key '{name}' needs numbers >= 0, got {rate!r} in {list(rates)}"
            )
    return [float(rate) for rate in rates]


class ScheduleSection(OneOfSection):
    """The `schedule:` section's family: `name` names the kind (constant if absent)."""

    SECTION = "schedule"
    KEY = "name"
    KINDS: dict[str, type[ScheduleSection]] = {}
    DEFAULT_KIND = "constant"
    RUNS_CODE = False  # The kind imports and runs a user's file (`path`): it needs consent.
    NULL_IS_ABSENT = True

    def __post_init__(self):
        check_declared(self, "schedule key '{}'")
        check_alternatives(self, "schedule.{}")
        self.check()

    def check(self) -> None:
        """The checks its fields' declarations do not make: how they relate."""

    def warmup_length(self, steps_per_epoch: int) -> int:
        """The steps of the linear warmup the schedule starts with (0: none)."""
        return 0

    def describe(self, rate: Callable[[int], str], start: int, total: int, per_epoch: int) -> str:
        """The rate over a run of `total` steps, for the start line.

        Args:
          rate: step -> the rate there, formatted.
          start: the first step after the warmup.
          total: the run's steps.
          per_epoch: steps per epoch.
        """
        return f"{self.kind} from {rate(start)} to {rate(total - 1)}"

    def warnings(self, per_epoch: int, total: int) -> list[str]:
        """What in the section never applies in a run of `total` steps."""
        return []

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    @classmethod
    def valid_keys(cls) -> str:
        return ", ".join(sorted([cls.KEY, *(field.name for field in dataclasses.fields(cls))]))

    @classmethod
    def unknown_kind_error(cls, kind: Any) -> ConfigError:
        return ConfigError(f"unknown schedule {kind!r}; valid schedules: {cls.valid_kinds()}")

    @classmethod
    def unknown_keys_error(cls, keys: list[Any]) -> ConfigError:
        return ConfigError(
            f"unknown schedule key {keys[0]!r} for {cls.KIND}; valid keys: {cls.valid_keys()}"
        )

    @classmethod
    def missing_keys_error(cls, group: tuple[str, ...]) -> ConfigError:
        needed = " or ".join(f"'{name}'" for name in group)
        return ConfigError(
            f"schedule {cls.KIND} needs key {needed}; valid keys: {cls.valid_keys()}"
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
        self.check_kind()
        if self.warmup_start and not self.has_warmup:
            raise ConfigError("schedule key 'warmup_start' needs warmup_steps or warmup_epochs")

    def check_kind(self) -> None:
        """The checks of the kind's own keys."""

    def build(self, base_lr: float, total_steps: int) -> Schedule:
        """The kind's curve, before `batch_scaling` and the warmup (`create_schedule`'s).

        Args:
          base_lr: the optimizer's learning rate, a float >= 0.
          total_steps: the run's length in steps, >= 1.

        Returns:
          `schedule(step, steps_per_epoch) -> learning rate`.
        """
        raise NotImplementedError(f"schedule {self.KIND} has no build()")

    def field_values(self) -> dict[str, Any]:
        """Every field, the kind's own first, then the keys every schedule has."""
        values = super().field_values()
        shared = [field.name for field in dataclasses.fields(RateSchedule)]
        own = {name: value for name, value in values.items() if name not in shared}
        return {**own, **{name: values[name] for name in shared}}

    @property
    def has_warmup(self) -> bool:
        """Whether the schedule starts with a linear warmup."""
        return self.warmup_steps is not None or self.warmup_epochs is not None

    def warmup_length(self, steps_per_epoch: int) -> int:
        if not self.has_warmup:
            return 0
        return self.warmup_steps or round(self.warmup_epochs * steps_per_epoch)


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class Constant(RateSchedule, kind="constant"):
    """The optimizer's learning rate at every step."""

    def build(self, base_lr: float, total_steps: int) -> Schedule:
        return lr_curves.constant(base_lr)


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

    def check_kind(self) -> None:
        length = len(check_boundaries(self.boundaries, self.unit)) + 1
        self._set("boundaries", tuple(self.boundaries))
        if self.total_steps is not None and self.unit != "fraction":
            raise ConfigError(
                "schedule key 'total_steps' is for boundaries in fractions "
                f"(schedule.unit=fraction), not in {self.unit}"
            )
        for name in ("values", "multipliers"):
            if getattr(self, name) is not None:
                self._set(name, tuple(check_rates(name, getattr(self, name), length)))

    def boundary_steps(self, per_epoch: int, total: int) -> list[int]:
        """The steps the boundaries fall at in a run of `total` steps."""
        of = self.total_steps or total
        return [
            round(s) for s in lr_curves.boundary_steps(self.boundaries, self.unit, per_epoch, of)
        ]

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

    def build(self, base_lr: float, total_steps: int) -> Schedule:
        return lr_curves.piecewise(
            self.boundaries,
            values=self.values,
            multipliers=self.multipliers,
            base=base_lr if self.multipliers is not None else None,
            unit=self.unit,
            total_steps=self.total_steps or total_steps,
        )


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

    def build(self, base_lr: float, total_steps: int) -> Schedule:
        if self.total_epochs is not None:
            return lr_curves.cosine(base_lr, total_epochs=self.total_epochs, final=self.final)
        length = self.total_steps or total_steps
        return lr_curves.cosine(base_lr, total_steps=length, final=self.final)


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

    def build(self, base_lr: float, total_steps: int) -> Schedule:
        return lr_curves.linear(
            base_lr,
            total_steps=total_steps,
            final=self.final,
            begin_steps=self.warmup_steps,
            begin_epochs=self.warmup_epochs,
        )


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

    def build(self, base_lr: float, total_steps: int) -> Schedule:
        return lr_curves.exponential(
            base_lr,
            decay_rate=self.decay_rate,
            decay_steps=self.decay_steps,
            decay_epochs=self.decay_epochs,
            staircase=self.staircase,
        )


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
