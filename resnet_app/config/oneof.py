"""Typed config sections that read as the YAML mappings they come from, and one-of sections.

A `Section` is a frozen dataclass that also reads as (and equals) the mapping
describing it. A one-of section (`optimizer`, `schedule`) holds one of several
kinds named by a key (`class`, `name`): `class Adam(OptimizerSection, kind="adam")`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from resnet_app.common.errors import ConfigError
from resnet_app.common.fields import RESUMABLE, Rule, setting

ALTERNATIVE = "alternative"  # Field metadata: the field this one replaces.
REQUIRED = "required"  # Field metadata: one of this field and its alternative is needed.


def alternative(
    other: str,
    default: Any = None,
    *,
    required: bool = False,
    resumable: bool = False,
    rule: Rule | None = None,
) -> Any:
    """A field that replaces `other` across layers; `required`: one of the two is needed."""
    return setting(default, rule, **{ALTERNATIVE: other, REQUIRED: required, RESUMABLE: resumable})


def alternatives(cls: type) -> dict[str, str]:
    """{field: the field it replaces} for the alternative fields of dataclass `cls`."""
    return {
        field.name: field.metadata[ALTERNATIVE]
        for field in dataclasses.fields(cls)
        if ALTERNATIVE in field.metadata
    }


def check_alternatives(instance: Any, name: str, within: str = "") -> None:
    """Refuses an instance that sets both of two alternative fields, or neither of a
    required pair. `name` names a field ("train.{}"), `within` starts the message."""
    named: set[str] = set()
    for field in dataclasses.fields(instance):
        other = field.metadata.get(ALTERNATIVE)
        if other is None or other in named:  # Each pair once, in the order declared.
            continue
        named.add(field.name)
        given = [getattr(instance, key) is not None for key in (field.name, other)]
        pair = f"{name.format(field.name)} and {name.format(other)}"
        start = f"{within}: " if within else ""
        if all(given):
            raise ConfigError(f"{start}{pair} exclude each other; keep one")
        if not any(given) and field.metadata.get(REQUIRED):
            raise ConfigError(f"{start}give one of {pair}")


def plain(value: Any) -> Any:
    """`value` as YAML writes it: mappings as dicts, tuples as lists."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


class Section(Mapping):
    """A typed config section, `@dataclasses.dataclass(frozen=True, eq=False)`, that reads
    as (and equals) its YAML mapping."""

    def field_values(self) -> dict[str, Any]:
        """Every field and its value, None included, in declaration order."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    def to_dict(self) -> dict[str, Any]:
        """The section as YAML-ready data (what `config.yaml` records)."""
        return plain(self._pairs())

    def _pairs(self) -> dict[str, Any]:
        return {key: value for key, value in self.field_values().items() if value is not None}

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> Section:
        """Reads a section from the mapping a user writes; see the subclasses."""
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return plain(self._pairs()[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._pairs())

    def __len__(self) -> int:
        return len(self._pairs())

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, Section):
            return type(self) is type(other) and self.field_values() == other.field_values()
        if isinstance(other, Mapping):
            try:
                return self == type(self).from_mapping(other)
            except ConfigError:
                return False
        return NotImplemented

    def __hash__(self) -> int:
        return hash((type(self), tuple(self.field_values().values())))


class OneOfSection(Section):
    """The base of a one-of family: `KEY` names the kind, `KINDS` fills as kinds are declared,
    `DEFAULT_KIND` (None: `KEY` required), `NULL_IS_ABSENT`, and the `*_error` messages."""

    SECTION: ClassVar[str]
    KEY: ClassVar[str]
    KINDS: ClassVar[dict[str, type[OneOfSection]]]
    KIND: ClassVar[str]
    DEFAULT_KIND: ClassVar[str | None] = None
    NULL_IS_ABSENT: ClassVar[bool] = False

    def __init_subclass__(cls, kind: str | None = None, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if kind is not None:
            cls.KIND = kind
            cls.family().KINDS[kind] = cls

    @classmethod
    def family(cls) -> type[OneOfSection]:
        """The family's base class (`OptimizerSection`), which lists its kinds."""
        return next(base for base in cls.__mro__ if "KINDS" in vars(base))

    @property
    def kind(self) -> str:
        """The kind's name, as the section's `KEY` gives it."""
        return self.KIND

    def _pairs(self) -> dict[str, Any]:
        return {self.KEY: self.KIND, **super()._pairs()}

    def to_dict(self) -> dict[str, Any]:
        """The kind and every field, None included: `config.yaml` spells them out."""
        return plain({self.KEY: self.KIND, **self.field_values()})

    @classmethod
    def kind_class(cls, kind: Any) -> type[OneOfSection] | None:
        """The class of kind `kind` (None: `DEFAULT_KIND`), or None if there is none."""
        kind = cls.DEFAULT_KIND if kind is None else kind
        return cls.KINDS.get(kind) if isinstance(kind, str) else None

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> OneOfSection:
        """Reads `{KEY: kind, field: value, ...}` as a section of that kind, over its defaults."""
        if not isinstance(mapping, Mapping):
            raise cls.not_a_mapping_error(mapping)
        if cls.DEFAULT_KIND is None and cls.KEY not in mapping:
            raise cls.missing_kind_error()
        kind_class = cls.kind_class(mapping.get(cls.KEY))
        if kind_class is None:
            raise cls.unknown_kind_error(mapping.get(cls.KEY))
        names = [field.name for field in dataclasses.fields(kind_class)]
        unknown = [key for key in mapping if key != cls.KEY and key not in names]
        if unknown:
            raise kind_class.unknown_keys_error(unknown)
        values = {key: value for key, value in mapping.items() if key != cls.KEY}
        if cls.NULL_IS_ABSENT:
            values = {key: value for key, value in values.items() if value is not None}
        for field in dataclasses.fields(kind_class):  # Needed: alone, or one of two.
            either = field.metadata.get(REQUIRED)
            group = (field.name, field.metadata[ALTERNATIVE]) if either else (field.name,)
            needed = either or field.default is dataclasses.MISSING
            if needed and all(values.get(key) is None for key in group):
                raise kind_class.missing_keys_error(group)
        return kind_class(**values)

    @classmethod
    def valid_kinds(cls) -> str:
        """The family's kinds, sorted, for error messages."""
        return ", ".join(sorted(cls.KINDS))

    # The family's one-line messages: not a mapping, a needed key missing (and, each
    # family's own, `missing_kind_error`, `unknown_kind_error`, `unknown_keys_error`).

    @classmethod
    def not_a_mapping_error(cls, value: Any) -> ConfigError:
        return ConfigError(f"the {cls.SECTION} section must be a mapping of keys, got {value!r}")

    @classmethod
    def valid_keys(cls) -> str:
        return ", ".join(sorted([cls.KEY, *(field.name for field in dataclasses.fields(cls))]))

    @classmethod
    def missing_keys_error(cls, group: tuple[str, ...]) -> ConfigError:
        needed = " or ".join(f"'{name}'" for name in group)
        return ConfigError(
            f"{cls.SECTION} {cls.KIND} needs key {needed}; valid keys: {cls.valid_keys()}"
        )
