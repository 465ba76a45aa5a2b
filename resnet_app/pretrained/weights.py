"""Imported weights, checked against a model and assigned to it, with a report.

Every reader returns `SourceWeights` (our layer and variable names and
layouts). `assign` checks them against the model (the first difference is one
line) and assigns them; the head is loaded only when its shape fits and
`init_head` is "auto". `Report.lines` is the start-up table.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

import numpy as np
from absl import logging

from resnet_app.common.errors import ConfigError
from resnet_app.nets import parts

HEAD_LAYER = "logits"
_UNIT = re.compile(r"^stage(\d+)_unit(\d+)_")


@dataclasses.dataclass
class SourceWeights:
    """Weights read from a source: {layer: {variable: array}}, and {name: shape} of the
    file's tensors that have no counterpart here."""

    layers: dict[str, dict[str, np.ndarray]]
    skipped: dict[str, tuple[int, ...]]


@dataclasses.dataclass
class Report:
    """What `assign` did, per part: {part: [(layer/variable, shape)]}."""

    loaded: dict[str, list[tuple[str, tuple[int, ...]]]]
    new: dict[str, list[tuple[str, tuple[int, ...]]]]
    skipped: dict[str, tuple[int, ...]]

    def lines(self) -> list[str]:
        """The start-up table: one row per part, then what was skipped."""
        rows = [f"{'part':<8} {'loaded':<34} newly initialised"]
        for part in dict.fromkeys([*self.loaded, *self.new]):
            loaded, new = self.loaded.get(part, []), self.new.get(part, [])
            rows.append(f"{part:<8} {_summary(loaded):<34} {_summary(new, shapes=True)}")
        if self.skipped:
            # The source's own head first: the rest are bookkeeping tensors.
            names = sorted(self.skipped, key=lambda name: HEAD_LAYER not in name)
            shown = [f"{name} {self.skipped[name]}" for name in names[:4]]
            more = len(self.skipped) - len(shown)
            rows.append(f"skipped: {', '.join(shown)}" + (f" and {more} more" if more > 0 else ""))
        return rows


def _summary(items: list[tuple[str, tuple[int, ...]]], shapes: bool = False) -> str:
    if not items:
        return "-"
    if shapes and len(items) <= 3:
        return ", ".join(f"{name} {shape}" for name, shape in items)
    values = sum(int(np.prod(shape)) for _, shape in items)
    return f"{len(items)} tensors, {values:,} values"


def check_units(
    pattern: re.Pattern, names: Iterable[str], model, label: str, model_name: str, first: int = 1
) -> None:
    """Refuses (ConfigError) weights of another depth, from the (stage, unit) numbers `pattern`
    finds in the source's `names` (its stages numbered from `first`)."""
    units: dict[int, set[int]] = {}
    for match in filter(None, map(pattern.match, names)):
        units.setdefault(int(match.group(1)) - first + 1, set()).add(int(match.group(2)))
    have = [len(units.get(stage, ())) for stage in range(1, max(units, default=0) + 1)]
    want = [len(stage) for stage in model.stages]
    if len(have) != len(want):
        raise ConfigError(
            f"{label} has {len(have)} stages, {model_name} has {len(want)}; give weights of "
            f"a {model_name} or pick the matching --model"
        )
    for stage, (a, b) in enumerate(zip(have, want, strict=True), start=1):
        if a != b:
            raise ConfigError(
                f"stage{stage} has {a} units in {label}, {b} in {model_name}; give weights of "
                f"a {model_name} or pick the matching --model"
            )


def check_compatible(weights: SourceWeights, model, label: str, model_name: str) -> None:
    """Refuses (ConfigError) weights of another network, naming the first difference."""
    ours = parts.get_weights(model)
    check_units(_UNIT, weights.layers, model, label, model_name)
    body = {layer: variables for layer, variables in ours.items() if layer != HEAD_LAYER}
    for layer in body:
        if layer not in weights.layers:
            raise ConfigError(
                f"{model_name} has layer {layer}, which {label} does not; the file holds "
                "another network"
            )
    for layer, variables in body.items():
        for name, value in variables.items():
            theirs = weights.layers[layer].get(name)
            if theirs is None:
                raise ConfigError(f"{label} has no {layer}/{name}; the file holds another network")
            if tuple(theirs.shape) != tuple(value.shape):
                raise ConfigError(
                    f"{layer}/{name} is {tuple(theirs.shape)} in {label}, "
                    f"{tuple(value.shape)} in {model_name}; the file holds another network"
                )
    extra = [layer for layer in weights.layers if layer not in ours]
    if extra:
        raise ConfigError(
            f"{label} has layer {extra[0]}, which {model_name} does not; the file holds "
            "another network"
        )


def adapt_input_channels(weights: SourceWeights, model, label: str) -> SourceWeights:
    """Weights of an RGB network for a greyscale one, or the reverse (timm's rule).

    The first kernel summed over its three input channels (the RGB network on
    a grey image in all three), or repeated over them and divided by three.
    """
    ours = parts.get_weights(model)
    layer, name, kernel = next(
        (layer, name, value)
        for layer, variables in ours.items()
        for name, value in variables.items()
        if value.ndim == 4
    )
    theirs = weights.layers.get(layer, {}).get(name)
    if theirs is None or theirs.ndim != 4:
        return weights
    have, want = theirs.shape[2], kernel.shape[2]
    others_fit = theirs.shape[:2] == kernel.shape[:2] and theirs.shape[3] == kernel.shape[3]
    if not others_fit or (have, want) not in ((3, 1), (1, 3)):
        return weights  # Any other difference is `check_compatible`'s.
    adapted = theirs.sum(axis=2, keepdims=True) if want == 1 else np.repeat(theirs, 3, axis=2) / 3
    logging.info(
        "%s: %s/%s takes %d input channels there and %d here: %s",
        label,
        layer,
        name,
        have,
        want,
        "summed over them" if want == 1 else "repeated over them, divided by 3",
    )
    layers = {**weights.layers, layer: {**weights.layers[layer], name: adapted}}
    return dataclasses.replace(weights, layers=layers)


def assign(
    model, weights: SourceWeights, label: str, model_name: str, init_head: str = "auto"
) -> Report:
    """Assigns checked weights to a built model (in cross-replica context under a strategy).

    `label` and `model_name` name the source and the preset in messages;
    `init_head` is "auto" (load the head when its shape fits) or "new".
    """
    weights = adapt_input_channels(weights, model, label)
    check_compatible(weights, model, label, model_name)
    part_of = parts.part_of_layer(model)
    report = Report(loaded={}, new={}, skipped=dict(weights.skipped))
    for layer_name, layer in parts.named_layers(model).items():
        part = part_of[layer_name]
        theirs = weights.layers.get(layer_name, {})
        fits = all(
            name in theirs and theirs[name].shape == tuple(variable.shape)
            for variable in layer.weights
            for name in [parts.short_name(variable)]
        )
        new = layer_name == HEAD_LAYER and (init_head == "new" or not fits)
        for variable in layer.weights:
            name = parts.short_name(variable)
            if not new:
                variable.assign(theirs[name].astype(variable.dtype))
            listed = report.new if new else report.loaded
            listed.setdefault(part, []).append((f"{layer_name}/{name}", tuple(variable.shape)))
        if new:  # The source's head, of another shape or not wanted.
            for name, value in theirs.items():
                report.skipped[f"{label}'s {layer_name}/{name}"] = tuple(value.shape)
    return report
