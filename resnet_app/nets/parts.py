"""A ResNet's parts (stem, stage1..stageN, head) and its weights by layer name.

Fine-tuning names what it freezes, and what learns at another rate, by part
(`presets.part_names`, pure data so that a config can be checked without
TensorFlow):

- `stem`: the stem's convolutions and their BatchNorms;
- `stage1` ... `stageN`: the residual units of each stage (for v2, the last
  stage also holds the final BatchNorm, which normalizes its output);
- `head`: the logits layer.

Weights are exchanged with other implementations as
`{layer name: {variable name: array}}`, with the layer names the model gives
its layers (`stem_conv`, `stage2_unit0_conv1`, `stage2_unit0_shortcut_bn`,
`logits`, ...) and Keras's variable names (`kernel`, `bias`, `gamma`, `beta`,
`moving_mean`, `moving_variance`). Model code only: nothing here trains.
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
    """Keeps the weights of `parts` fixed in training.

    Args:
      model: a built `ResNet`.
      parts: names from `part_names`.
      batch_norm_statistics: also run their BatchNorms in inference mode
        (moving statistics, not updated), the usual fine-tuning practice;
        False keeps batch statistics (and their moving averages) but fixes
        gamma and beta.
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

    Args:
      model: a `ResNet`.
      layout: `blocks.TORCH` (torchvision's and timm's state-dict modules) or
        `blocks.KERAS` (Keras applications' ResNet v1 layers).

    Each part declares its own names (`stem.source_names`,
    `ResidualBlock.source_names`); the head is `fc` or `predictions`.

    Raises:
      ConfigError: for a network that layout cannot hold (naming the part).
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
