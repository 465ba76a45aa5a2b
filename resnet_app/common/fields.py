"""A config field's type (from `typing.get_type_hints`) and its declared range, checked.

Every way a value reaches a field (YAML, `--set`, flags) goes through here;
`field_types` refuses an unsupported type when the class is first read. A field
declares its range once, with its default (`setting(0.0, FRACTION)`), as a
`Rule`, so a mistake reads the same everywhere: "WHAT must be a number >= 0, got VALUE".
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from typing import Any

from resnet_app.common.errors import ConfigError

# Field metadata keys: the key that sets a field that is not a key of its own; a
# setting a resumed run may change (it does not change what the run computes);
# the `Rule` the value meets.
SET_BY, RESUMABLE, CHECK = "set_by", "resumable", "check"
SCALARS = (bool, int, float, str)
TUPLE_ITEMS = (int, float, str)


def resumable(default: Any = None, rule: Rule | None = None, **metadata: Any) -> Any:
    """A `setting` a resumed run may change (`RESUMABLE` metadata)."""
    return setting(default, rule, **{RESUMABLE: True, **metadata})


def resumable_keys(cls: type, section: str) -> set[str]:
    """ "section.field" for every field of dataclass `cls` marked `resumable`."""
    return {f"{section}.{f.name}" for f in dataclasses.fields(cls) if f.metadata.get(RESUMABLE)}


@dataclasses.dataclass(frozen=True)
class FieldType:
    """A field's type: `base` (bool, int, float, str, tuple, dict or a nested dataclass),
    `optional` (`| None`), `item` (a tuple's items', a dict's values'), `or_word`
    (`str | dict[str, float]`)."""

    base: type
    optional: bool = False
    item: type | None = None
    or_word: bool = False

    @property
    def nested(self) -> bool:
        return dataclasses.is_dataclass(self.base)

    @property
    def name(self) -> str:
        return self.base.__name__


def read_annotation(annotation: Any) -> FieldType:
    """The `FieldType` of a type annotation object; TypeError for one a field cannot have."""
    optional = False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = typing.get_args(annotation)
        others = [member for member in members if member is not type(None)]
        optional = len(others) < len(members)
        if len(others) == 2 and str in others and dict[str, float] in others:
            return FieldType(dict, optional, float, or_word=True)
        if len(others) != 1:
            raise TypeError(f"a config field has one type, or that type | None; got {annotation}")
        annotation = others[0]
    if typing.get_origin(annotation) is tuple:
        item = typing.get_args(annotation)[0]
        if item not in TUPLE_ITEMS:
            raise TypeError(f"a config tuple holds ints, floats or strs; got {annotation}")
        return FieldType(tuple, optional, item)
    if typing.get_origin(annotation) is dict:
        if typing.get_args(annotation) != (str, float):
            raise TypeError(f"a config dict maps strs to floats; got {annotation}")
        return FieldType(dict, optional, float)
    if dataclasses.is_dataclass(annotation) and not optional:
        return FieldType(annotation)  # A nested group: `data.augment.flip`.
    if annotation not in SCALARS:
        raise TypeError(f"unsupported config field type {annotation!r}")
    return FieldType(annotation, optional)


@functools.cache
def field_types(cls: type) -> dict[str, FieldType]:
    """{field name: `FieldType`} of dataclass `cls`, in declaration order."""
    hints = typing.get_type_hints(cls)
    return {field.name: read_annotation(hints[field.name]) for field in dataclasses.fields(cls)}


def config_keys(cls: type) -> dict[str, FieldType]:
    """The fields of dataclass `cls` a config sets by name (all but `SET_BY` ones)."""
    own = {field.name for field in dataclasses.fields(cls) if SET_BY not in field.metadata}
    return {name: kind for name, kind in field_types(cls).items() if name in own}


def is_number(value: Any) -> bool:
    """Whether `value` is a finite real number (not a bool)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def is_whole(value: Any) -> bool:
    """Whether `value` is an integer, Python's or NumPy's (not a bool)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class Rule:
    """A setting's valid values: `test` (never given None), `wanted` (completes "WHAT
    must be ...", or a function giving it) and `convert` (what a value is stored as)."""

    test: Callable[[Any], bool]
    wanted: str | Callable[[], str]
    convert: Callable[[Any], Any] | None = None

    def check(self, what: str, value: Any) -> Any:
        """`value` (converted) if it passes; else ConfigError "WHAT must be WANTED, got VALUE"."""
        if not self.test(value):
            wanted = self.wanted() if callable(self.wanted) else self.wanted
            raise ConfigError(f"{what} must be {wanted}, got {value!r}")
        return value if self.convert is None else self.convert(value)


def interval(low: float, high: float, *, low_in: bool = True, high_in: bool = False) -> Rule:
    """A number between `low` and `high`, each end included or not: "in [0, 1)"."""

    def test(x: Any) -> bool:
        above = x >= low if low_in else x > low
        return above and (x <= high if high_in else x < high)

    wanted = f"in {'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"
    return Rule(lambda x: is_number(x) and test(x), wanted, float)


def whole_at_least(minimum: int) -> Rule:
    """A whole number >= `minimum` (Python's or NumPy's; a bool is not one)."""
    return Rule(lambda x: is_whole(x) and x >= minimum, f"a whole number >= {minimum}", int)


def one_of(choices: Collection[str]) -> Rule:
    """One of `choices`, a collection read when checking (a registry may grow)."""
    return Rule(
        lambda x: isinstance(x, Hashable) and x in choices, lambda: "one of: " + ", ".join(choices)
    )


AT_LEAST_0 = Rule(lambda x: is_number(x) and x >= 0, "a number >= 0", float)
MORE_THAN_0 = Rule(lambda x: is_number(x) and x > 0, "a number > 0", float)
AT_LEAST_1 = whole_at_least(1)
FRACTION = interval(0, 1)  # [0, 1): a rate, a decay, a smoothing.
PROBABILITY = interval(0, 1, low_in=False)  # (0, 1): neither never nor always.
SHARE = interval(0, 1, low_in=False, high_in=True)  # (0, 1]: some of it, up to all.
FLAG = Rule(lambda x: isinstance(x, bool), "true or false")


def changed_from_defaults(instance: Any, names: Iterable[str]) -> list[str]:
    """The fields among `names` whose value in the dataclass `instance` is not their default."""
    defaults = {field.name: field.default for field in dataclasses.fields(instance)}
    return [name for name in names if getattr(instance, name) != defaults[name]]


def setting(default: Any = dataclasses.MISSING, rule: Rule | None = None, **metadata: Any) -> Any:
    """A config field: its default (none: required) and the `Rule` its value (each item) meets."""
    if rule is not None:
        metadata[CHECK] = rule
    return dataclasses.field(default=default, metadata=metadata)


def check_declared(instance: Any, name: str) -> None:
    """Checks every field against its `Rule` (each item of a tuple or mapping), storing
    it converted; `name` names a field in messages ("train.{}")."""
    types = field_types(type(instance))
    for field in dataclasses.fields(instance):
        rule, value = field.metadata.get(CHECK), getattr(instance, field.name)
        if rule is None or value is None:
            continue
        what, base = name.format(field.name), types[field.name].base
        if base is tuple and isinstance(value, (tuple, list)):
            value = tuple(rule.check(f"an entry of {what}", item) for item in value)
        elif base is dict and isinstance(value, Mapping):
            value = {key: rule.check(f"{what}.{key}", item) for key, item in value.items()}
        else:
            value = rule.check(what, value)
        object.__setattr__(instance, field.name, value)


def coerce(key: str, value: Any, kind: FieldType) -> Any:
    """`value` in the field's type (an int for a float, a whole float for an int, a list for
    a tuple), or a ConfigError naming `key`."""
    if value is None:
        if kind.optional:
            return None
        raise ConfigError(f"{key} must not be empty")
    bad = ConfigError(f"{key}={value!r}: expected {kind.name}")
    if kind.base is dict:
        if kind.or_word and isinstance(value, str):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}={value!r}: expected a mapping, e.g. {{head: 10}}")
        if not all(isinstance(name, str) and is_number(item) for name, item in value.items()):
            raise ConfigError(f"{key}={value!r}: expected names mapped to numbers")
        return {name: float(item) for name, item in value.items()}
    if kind.base is tuple:
        if not isinstance(value, (list, tuple)):
            raise bad
        if kind.item is str:
            if not all(isinstance(item, str) for item in value):
                raise ConfigError(f"{key}={value!r}: expected a list of names")
            return tuple(value)
        if not all(is_number(item) for item in value):
            raise ConfigError(f"{key}={value!r}: expected a list of numbers")
        if kind.item is int and not all(float(item).is_integer() for item in value):
            raise ConfigError(f"{key}={value!r}: expected a list of integers")
        return tuple(kind.item(item) for item in value)
    if kind.base is bool or kind.base is str:
        if not isinstance(value, kind.base):
            raise bad
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad
    if kind.base is int:
        if isinstance(value, float) and not value.is_integer():
            raise bad
        return int(value)
    if not math.isfinite(value):
        raise ConfigError(f"{key}={value}: expected a finite number")
    return float(value)


def replace_from(default: Any, section: str, values: Any) -> Any:
    """`default` (a dataclass instance) with the fields `values` sets, each type-checked;
    its `__post_init__` checks them together. `section` names it in messages."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"config section '{section}' must be a mapping of keys")
    types = config_keys(type(default))
    unknown = sorted(str(key) for key in values if key not in types)
    if unknown:
        raise ConfigError(
            f"unknown {section} key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(types))}"
        )
    typed = {
        key: replace_from(getattr(default, key), f"{section}.{key}", value or {})
        if types[key].nested
        else coerce(f"{section}.{key}", value, types[key])
        for key, value in values.items()
    }
    return dataclasses.replace(default, **typed)
