"""A ResNet's parts (stem, stage1..stageN, head) and its weights by layer name.

Fine-tuning freezes parts, and scales their learning rates, by the names of
`presets.part_names` (for v2 the last stage holds the final BatchNorm).
Weights are exchanged with other implementations as `{layer name: {variable
name: array}}`: our layer names (`stage2_unit0_conv1`, `logits`, ...) and
Keras's variable names (`kernel`, `gamma`, `moving_mean`, ...).
"""

from __future__ import annotations

from collections.abc import Iterable

import keras
import numpy as np

from resnet_app.common import compat
from resnet_app.common.errors import ConfigError
from resnet_app.nets import blocks
from resnet_app.nets import stem as stem_lib
from resnet_app.nets.presets import HEAD, STEM


def layers_by_part(model) -> dict[str, list[keras.layers.Layer]]:
    """Every layer with weights of a `ResNet`, grouped by part, input to output."""
    parts: dict[str, list[keras.layers.Layer]] = {STEM: model.stem_layers}
    for stage, units in enumerate(model.stages, start=1):
        parts[f"stage{stage}"] = list(units)
    if model.final_bn is not None:
        parts[f"stage{len(model.stages)}"].append(model.final_bn)
    parts[HEAD] = [model.logits]
    return parts


def named_layers(model) -> dict[str, keras.layers.Layer]:
    """Every layer that owns variables, by its name, input to output."""
    named: dict[str, keras.layers.Layer] = {}
    for layers in layers_by_part(model).values():
        for layer in layers:
            for leaf in _leaves(layer):
                named[leaf.name] = leaf
    return named


def _leaves(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """The layers under `layer` (itself included) that own variables directly."""
    leaves = []
    for candidate in [layer, *compat.nested_layers(layer)]:
        if candidate.weights and not any(
            inner.weights for inner in compat.nested_layers(candidate)
        ):
            leaves.append(candidate)
    return leaves


def part_of_layer(model) -> dict[str, str]:
    """{layer name: its part} for every layer that owns variables."""
    return {
        leaf.name: part
        for part, layers in layers_by_part(model).items()
        for layer in layers
        for leaf in _leaves(layer)
    }


def short_name(variable) -> str:
    """A variable's name within its layer: "kernel", "gamma", "moving_mean", ..."""
    return variable.path.rsplit("/", 1)[-1]


def get_weights(model) -> dict[str, dict[str, np.ndarray]]:
    """{layer name: {variable name: value}} of every layer with variables."""
    return {
        name: {short_name(variable): np.asarray(variable.numpy()) for variable in layer.weights}
        for name, layer in named_layers(model).items()
    }


def freeze(model, parts: Iterable[str], batch_norm_statistics: bool = True) -> None:
    """Keeps the weights of `parts` (names from `part_names`) fixed in training.

    With `batch_norm_statistics` their BatchNorms also run in inference mode
    (the usual fine-tuning practice); without, they keep batch statistics and
    moving averages, with gamma and beta fixed.
    """
    grouped = layers_by_part(model)
    for part in parts:
        for layer in grouped[part]:
            if batch_norm_statistics:
                layer.trainable = False
                continue
            for leaf in _leaves(layer):
                for variable in leaf.trainable_weights:
                    variable.trainable = False


def lr_multipliers(model, multipliers: dict[str, float]) -> dict[str, float]:
    """{variable path: factor} of the trainable variables of the parts `multipliers` names."""
    grouped = layers_by_part(model)
    return {
        variable.path: factor
        for part, factor in multipliers.items()
        for layer in grouped[part]
        for variable in layer.trainable_weights
    }


def source_names(model, layout: str) -> dict[str, str]:
    """{our layer name: its name in `layout`} for every layer with weights, input to output.

    `layout` is `blocks.TORCH` (torchvision's and timm's state dicts) or
    `blocks.KERAS` (Keras applications' v1); ConfigError for a network it cannot hold.
    """
    names = stem_lib.source_names(model.config, layout)
    for stage, units in enumerate(model.stages, start=1):
        for unit, block in enumerate(units):
            names.update(block.source_names(layout, stage, unit))
    if model.final_bn is not None:
        raise ConfigError(
            "pre-activation (v2) networks end in a BatchNorm that no torchvision, timm or "
            "Keras applications ResNet v1 file holds; use a v1 model"
        )
    names["logits"] = "fc" if layout == blocks.TORCH else "predictions"
    return names
