"""A config as layers: the defaults, a recipe file, `--set`s, then flags; merged, then checked.

A new optimizer class or schedule name starts its section afresh; one of two
alternative keys (epochs or train_steps) drops the other set before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from absl import logging

from resnet_app.common import migration
from resnet_app.common.errors import ConfigError
from resnet_app.common.fields import field_types, replace_from
from resnet_app.config.loading import parse_set, read_yaml
from resnet_app.config.oneof import OneOfSection, alternatives
from resnet_app.config.recipes import find as find_recipe
from resnet_app.config.sections import SECTIONS, Config
from resnet_app.nets.presets import model_names

Tree = dict[str, dict[str, Any]]

LENGTH_KEYS = ("epochs", "train_steps")

# Keys that come with another: boundaries given without a unit are in the
# kind's own unit (steps), not in the default schedule's fractions of the run.
TIED_KEYS = {"boundaries": ("unit",)}

# Each section's default, as `Config` declares it (data.dtype still unset).
_DEFAULTS = {field.name: field.default for field in dataclasses.fields(Config)}
DEFAULT_STEPS = _DEFAULTS["train"].train_steps  # The run's length when nothing sets it.


def resolve(
    config_file: str | None = None,
    sets: Iterable[str] = (),
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    resumed: bool = False,
) -> Config:
    """The validated `Config`: defaults, `config_file`, `sets`, then `overrides` (flags).

    `resumed`: the file is a run's own config.yaml, whose schedule stays as trained
    when a flag changes the length (else `follow_length`).
    """
    tree: Tree = {}
    if config_file:
        merge(tree, read_yaml(find_recipe(config_file)), f" in {config_file}")
    recipe = {section: dict(values) for section, values in tree.items()}
    later = [set_layer(sets), overrides or {}]
    for layer, where in zip(later, (" in --set", "")):
        merge(tree, layer, where)
    if config_file and not resumed and _sets_length_only(later):
        follow_length(tree, recipe, config_file)
    return build(tree)


def _sets_length_only(layers: Iterable[Mapping[str, Mapping[str, Any]]]) -> bool:
    """Whether the layers set the run's length and leave the schedule as it was."""
    length = any(
        (layer.get("train") or {}).get(key) is not None for layer in layers for key in LENGTH_KEYS
    )
    return length and not any(layer.get("schedule") for layer in layers)


def follow_length(tree: Tree, recipe: Tree, where: str) -> None:
    """Makes a recipe's piecewise boundaries fractions of its length when a flag changed it,
    so that they fall at the same points of the new run (`--set train.epochs=3`).
    Boundaries in another unit than the length are kept (`plan.py` warns)."""
    schedule = tree.get("schedule", {})
    if schedule.get("name", "piecewise") != "piecewise" or "boundaries" not in schedule:
        return
    unit = schedule.get("unit") or "steps"
    train = recipe.get("train", {})
    if train.get("epochs") is not None:
        length, length_unit = train["epochs"], "epochs"
    else:
        length, length_unit = train.get("train_steps") or DEFAULT_STEPS, "steps"
    boundaries = schedule["boundaries"]
    if unit != length_unit or not isinstance(boundaries, list | tuple):
        return
    try:
        fractions = [float(boundary) / float(length) for boundary in boundaries]
    except (TypeError, ValueError, ZeroDivisionError):
        return  # The checks of `build` name the bad value.
    if not all(0 < fraction < 1 for fraction in fractions):
        return
    schedule.update(boundaries=fractions, unit="fraction")
    logging.info(
        "schedule.boundaries %s %s of %s's %g %s follow the run's length given after it: at "
        "%s of this run (set schedule.boundaries to choose others)",
        list(boundaries),
        unit,
        where,
        length,
        unit,
        ", ".join(f"{fraction:.4g}" for fraction in fractions),
    )


def from_dict(tree: Mapping[str, Any]) -> Config:
    """Validates a config tree, as written to config.yaml, over the defaults."""
    given: Tree = {}
    merge(given, tree, "")
    return build(given)


def merge(tree: Tree, layer: Mapping[str, Any], where: str) -> None:
    """Applies one layer of settings (a file, the --sets, the flags) to `tree`, in place;
    `where` (" in FILE") names it in messages."""
    for section, values in layer.items():
        if section not in SECTIONS:
            raise ConfigError(
                f"unknown config section '{section}'{where}; valid sections: {', '.join(SECTIONS)}"
            )
        values = {} if values is None else values
        if not isinstance(values, Mapping):
            raise ConfigError(f"config section '{section}'{where} must be a mapping of keys")
        for key in values:
            if not isinstance(key, str):
                raise ConfigError(f"{section} key {key!r} must be a name")
        values = migration.config_section(section, values)  # Old keys in today's places.
        given = tree.setdefault(section, {})
        default, owner = _DEFAULTS[section], type(_DEFAULTS[section])
        if isinstance(default, OneOfSection):  # The class of the kind named (None: unknown).
            if default.KEY in values and values[default.KEY] != given.get(
                default.KEY, default.kind
            ):
                given.clear()  # A new kind starts its section afresh.
            owner = default.kind_class({**given, **values}.get(default.KEY, default.kind))
        for name, other in (alternatives(owner) if owner else {}).items():
            if values.get(name) is not None and values.get(other) is None:
                given[other] = None
        groups = {key for key, kind in field_types(owner).items() if kind.nested} if owner else ()
        for key, value in values.items():
            group = given.get(key)
            if key in groups and isinstance(value, Mapping) and isinstance(group, Mapping):
                given[key] = {**group, **value}  # A group's keys add up across layers.
            else:
                given[key] = value


def set_layer(sets: Iterable[str]) -> Tree:
    """The --set assignments as one layer {section: {key: value}}; later ones win."""
    layer: Tree = {}
    for assignment in sets:
        path, value = parse_set(assignment)
        key = ".".join(path)
        if len(path) not in (2, 3) or (len(path) == 3 and path[0] != "data"):
            raise ConfigError(
                f"--set {key}: keys look like section.key, e.g. train.batch_size (or "
                f"data.group.key, e.g. data.augment.flip); sections: {', '.join(SECTIONS)}"
            )
        if path[0] not in SECTIONS:
            raise ConfigError(
                f"unknown config section '{path[0]}' in --set {key}; valid sections: "
                f"{', '.join(SECTIONS)}"
            )
        section = layer.setdefault(path[0], {})
        if len(path) == 3:  # data.augment.flip=false
            group = section.get(path[1])
            section[path[1]] = {**(group if isinstance(group, dict) else {}), path[2]: value}
            continue
        section.pop(path[1], None)  # Keep the order of the last assignment.
        section[path[1]] = value
    return layer


def build(tree: Mapping[str, Mapping[str, Any]]) -> Config:
    """The `Config` of merged settings: each section's default with the keys set."""
    sections = {}
    for section in SECTIONS:
        default, given = _DEFAULTS[section], tree.get(section, {})
        if isinstance(default, OneOfSection):
            sections[section] = _build_one_of(default, given)
        elif section == "model" and not isinstance(given.get("name", ""), str):
            names = ", ".join(model_names())
            raise ConfigError(f"model.name={given['name']!r}; valid models: {names}")
        else:
            sections[section] = replace_from(default, section, given)
    return Config(**sections)


def _build_one_of(default: OneOfSection, given: Mapping[str, Any]) -> OneOfSection:
    """The section of the kind `given` names: over `default` if it is that kind."""
    family = default.family()
    if family.KEY in given and given[family.KEY] != default.kind:
        return family.from_mapping(given)
    inherited = default.field_values()
    for key, tied in TIED_KEYS.items():
        if key in given:
            for other in set(tied) - set(given):
                inherited.pop(other, None)
    return family.from_mapping({family.KEY: default.kind, **inherited, **given})
