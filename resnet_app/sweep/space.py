"""What a sweep searches: config keys, each with a range or a list of values.

A parameter is a `--set` key and a spec, the same in a space file (`KEY: SPEC` per line)
and on the command line (`--param=KEY=SPEC`):

    optimizer.learning_rate: log(0.01, 1)      # log-uniform float
    train.label_smoothing: uniform(0, 0.2)     # uniform float; uniform(0, 0.2, 0.05) steps
    data.augment.randaugment_magnitude: int(5, 15)   # whole numbers; int(4, 16, 4) steps
    train.batch_size: logint(32, 256)          # whole numbers, log-uniform
    schedule.name: choice(cosine, piecewise)   # one of these values (read as YAML)
    optimizer.weight_decay: [1e-4, 5e-4]       # a YAML list is a choice too

No Optuna or TensorFlow here: a space is checked before either loads.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable
from typing import Any

import yaml

from resnet_app.common.errors import ConfigError
from resnet_app.config import loading

KINDS = ("log", "uniform", "int", "logint", "choice")
_SPEC = re.compile(r"^\s*([a-z]+)\s*\((.*)\)\s*$", re.S)
_EXAMPLE = "log(0.01, 1), uniform(0, 0.2), int(5, 15), logint(32, 256) or choice(a, b)"
# The values a choice may hold: what Optuna stores.
Scalar = bool | int | float | str | None


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched config key (`section.key`, as `--set` takes it) of a kind in `KINDS`: a
    range [low, high] on a grid of `step` (None: continuous floats, or 1), or `choices`."""

    key: str
    kind: str
    low: float | None = None
    high: float | None = None
    step: float | None = None
    choices: tuple[Scalar, ...] = ()

    @property
    def is_range(self) -> bool:
        return self.kind != "choice"

    def ends(self) -> tuple[Scalar, ...]:
        """The values that bound what the parameter can take, for the config to check."""
        if not self.is_range:
            return self.choices
        whole = self.kind in ("int", "logint")
        return (int(self.low), int(self.high)) if whole else (float(self.low), float(self.high))

    def grid(self) -> tuple[Scalar, ...] | None:
        """Every value, when there are finitely many (None for a continuous range)."""
        if not self.is_range:
            return self.choices
        if self.kind == "logint":
            return tuple(range(int(self.low), int(self.high) + 1))
        if self.kind != "int" and self.step is None:
            return None
        step = self.step or 1
        count = int(math.floor((self.high - self.low) / step + 1e-9)) + 1
        values = [self.low + i * step for i in range(count)]
        if self.kind == "int":
            return tuple(int(v) for v in values)
        return tuple(round(v, 12) for v in values)

    def describe(self) -> str:
        if not self.is_range:
            return f"choice({', '.join(value_text(c) for c in self.choices)})"
        step = f", {_number_text(self.step)}" if self.step is not None else ""
        return f"{self.kind}({_number_text(self.low)}, {_number_text(self.high)}{step})"


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def parse_param(key: str, spec: Any, where: str = "") -> Param:
    """A `Param` from its key and spec (text, or a YAML list for a choice)."""
    key = str(key).strip()
    if not re.fullmatch(r"[a-z_][a-z0-9_]*(\.[a-z0-9_]+)+", key):
        raise ConfigError(f"{where}{key!r} is not a config key: give section.key, e.g. {_EXAMPLE}")
    if isinstance(spec, str) and spec.strip().startswith("["):  # A YAML list, from --param.
        try:
            spec = loading.load_yaml(spec)
        except yaml.YAMLError:
            raise ConfigError(f"{where}{key}: {spec!r} is not a YAML list; fix it") from None
    if isinstance(spec, list):
        return _choice(key, spec, where)
    match = _SPEC.match(str(spec))
    if not match or match.group(1) not in KINDS:
        raise ConfigError(f"{where}{key}: {spec!r} is not a range or a choice; give {_EXAMPLE}")
    kind, inside = match.group(1), match.group(2)
    try:  # The arguments as YAML reads a list: quoted words may hold commas.
        values = loading.load_yaml(f"[{inside}]")
    except yaml.YAMLError:
        raise ConfigError(
            f"{where}{key}: cannot read the values of {spec!r}; give {_EXAMPLE}"
        ) from None
    if kind == "choice":
        return _choice(key, values, where)
    return _range(key, kind, values, where)


def _choice(key: str, values: list[Any], where: str) -> Param:
    if not values:
        raise ConfigError(f"{where}{key}: a choice needs at least one value")
    for value in values:
        if not isinstance(value, Scalar):
            raise ConfigError(
                f"{where}{key}: choice values are numbers, words, true/false or null, got {value!r}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where}{key}: choice values must be finite, got {value}")
    # Optuna tells choices apart by ==, so 1, 1.0 and true are one value.
    if any(a == b for i, a in enumerate(values) for b in values[i + 1 :]):
        raise ConfigError(f"{where}{key}: a choice names a value twice (by ==): {values}")
    return Param(key, "choice", choices=tuple(values))


def _range(key: str, kind: str, values: list[Any], where: str) -> Param:
    log = kind in ("log", "logint")
    form = f"{kind}(low, high)" + ("" if log else f" or {kind}(low, high, step)")
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if not numbers or len(values) not in ((2,) if log else (2, 3)):
        raise ConfigError(f"{where}{key}: give {form} with numbers, got {kind}{tuple(values)}")
    low, high, step = float(values[0]), float(values[1]), values[2] if len(values) == 3 else None
    if not all(math.isfinite(v) for v in values) or not low < high:
        raise ConfigError(f"{where}{key}: {kind}(low, high) needs finite low < high, got {values}")
    if kind in ("int", "logint") and not (low.is_integer() and high.is_integer()):
        raise ConfigError(f"{where}{key}: {kind}(...) takes whole numbers, got {values[:2]}")
    if log and low <= 0:
        raise ConfigError(f"{where}{key}: {kind}(low, high) needs low > 0, got {values[0]}")
    if step is not None and not (0 < step <= high - low):
        raise ConfigError(f"{where}{key}: the step must be > 0 and at most high - low, got {step}")
    if step is not None and kind == "int" and not float(step).is_integer():
        raise ConfigError(f"{where}{key}: int(...)'s step is a whole number, got {step}")
    return Param(key, kind, low, high, None if step is None else float(step))


def parse_space(file_mapping: dict[str, Any] | None, params: Iterable[str]) -> tuple[Param, ...]:
    """The space of a space file's mapping and the `--param=KEY=SPEC` flags, keys sorted."""
    found: dict[str, Param] = {}
    entries = [(k, v, "in --space: ") for k, v in (file_mapping or {}).items()]
    for text in params:
        key, equals, spec = text.partition("=")
        if not equals:
            raise ConfigError(f"--param={text}: give --param=KEY=SPEC, e.g. {_EXAMPLE}")
        entries.append((key, spec, "--param "))
    for key, spec, where in entries:
        param = parse_param(key, spec, where)
        if param.key in found:
            raise ConfigError(f"{param.key} is searched twice (--space and --param); keep one")
        found[param.key] = param
    if not found:
        raise ConfigError("nothing to search: give --space=FILE.yaml or --param=KEY=SPEC")
    return tuple(found[key] for key in sorted(found))


def value_text(value: Scalar) -> str:
    """A value as YAML writes it, so that `--set` (which reads YAML) reads back the same value."""
    if isinstance(value, str):
        text = loading.dump_yaml(value).strip().removesuffix("...").strip()
        try:  # Plain YAML, unless a list (a choice's spec) would read it otherwise.
            same = loading.load_yaml(f"[{text}]") == [value]
        except yaml.YAMLError:
            same = False
        return text if same else json.dumps(value)
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    return repr(value)


def assignment(key: str, value: Scalar) -> str:
    """`--set`'s `KEY=VALUE` for a drawn value."""
    return f"{key}={value_text(value)}"


def suggest(trial: Any, param: Param, grid: bool = False) -> Scalar:
    """Asks an Optuna trial for `param`'s value (a grid sampler: from its listed values)."""
    if grid or not param.is_range:
        return trial.suggest_categorical(param.key, list(param.grid()))
    if param.kind in ("int", "logint"):
        step = int(param.step or 1)
        log = param.kind == "logint"
        return trial.suggest_int(param.key, int(param.low), int(param.high), step=step, log=log)
    log = param.kind == "log"
    return trial.suggest_float(param.key, param.low, param.high, step=param.step, log=log)


def grid_space(space: Iterable[Param]) -> dict[str, list[Scalar]]:
    """{key: every value} for a grid search; refuses a continuous range."""
    grid = {}
    for param in space:
        values = param.grid()
        if values is None:
            raise ConfigError(
                f"--sampler=grid needs every value listed: {param.key} is {param.describe()}; give "
                f"a step, e.g. uniform(0, 0.2, 0.05), or choice(...)"
            )
        grid[param.key] = list(values)
    return grid
