"""torchvision and timm ResNet weights in a `.safetensors` file, read exactly, by name.

torchvision's and timm's ResNets (and ResNeXt, wide, C/D/S, SE/ECA, RS) are
our v1 networks with `sources.TORCHVISION_FIELDS`; the model declares each
layer's state-dict name (`parts.source_names(model, TORCH)`), for example

    conv1, bn1                          stem_conv, stem_bn            (plain stem)
    conv1.0, conv1.1, ... conv1.6, bn1  stem_conv1, stem_bn1, ... stem_bn (timm's deep stem)
    layer{s}.{u}.conv{k}, .bn{k}        stage{s}_unit{u}_conv{k}, _bn{k}
    layer{s}.{u}.downsample.0 / .1      ..._shortcut_conv / _shortcut_bn
    layer{s}.{u}.downsample.1 / .2      the same after timm's average pool
    layer{s}.{u}.se.fc1 / .fc2 / .conv  ..._se_fc1 / _se_fc2 / _se_conv
    fc                                  logits

so this reader maps by name, and refuses a file of another variant at its
first difference. A convolution's OIHW kernel becomes HWIO, a linear layer's
[out, in] [in, out], a Conv1d's [1, 1, k] [k, 1, 1]; `num_batches_tracked`
is skipped.
"""

from __future__ import annotations

import re

import numpy as np

from resnet_app.common.errors import ConfigError, first_line
from resnet_app.nets import blocks, parts
from resnet_app.pretrained.weights import SourceWeights, check_units

# Our variable names by the state-dict tensor kind.
STATE_DICT_KINDS = {
    "kernel": "weight",
    "bias": "bias",
    "gamma": "weight",
    "beta": "bias",
    "moving_mean": "running_mean",
    "moving_variance": "running_var",
}
_UNIT = re.compile(r"^layer(\d+)\.(\d+)\.")


def _convert(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A state-dict tensor in the layout of our variable of `shape`."""
    if len(shape) == 4 and value.ndim == 4:  # A convolution: OIHW -> HWIO.
        return value.transpose(2, 3, 1, 0)
    if len(shape) == 2 and value.ndim in (2, 4):  # Linear, or a 1x1 conv as one.
        return value.reshape(value.shape[0], -1).T
    if len(shape) == 3 and value.ndim == 3:  # Conv1d [out, in, k] -> [k, in, out].
        return value.transpose(2, 1, 0)
    return value


def _load(path: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    try:
        return load_file(path)
    except Exception as error:  # noqa: BLE001 - a corrupt or unsupported file is one line.
        raise ConfigError(
            f"{path} is not a readable .safetensors file ({first_line(error)}); check the "
            "file (float32 or float16 tensors)"
        ) from None


def read(path: str, model, model_name: str) -> SourceWeights:
    """The weights of a torchvision- or timm-layout `.safetensors` file, under `model`'s names;
    ConfigError for an unreadable file or another network, naming the first difference."""
    tensors = _load(path)
    check_units(_UNIT, tensors, model, path, model_name)
    names = parts.source_names(model, blocks.TORCH)
    variables = parts.named_layers(model)
    layers: dict[str, dict[str, np.ndarray]] = {}
    expected = set()
    for ours, theirs in names.items():
        for variable in variables[ours].weights:
            short = parts.short_name(variable)
            key = f"{theirs}.{STATE_DICT_KINDS[short]}"
            expected.add(key)
            if key not in tensors:
                raise ConfigError(
                    f"{model_name} has {key} (our {ours}/{short}), which {path} does not; "
                    "the file holds another variant: pick its --model"
                )
            value = np.asarray(tensors[key], np.float32)
            converted = _convert(value, tuple(variable.shape))
            layers.setdefault(ours, {})[short] = np.ascontiguousarray(converted)
    skipped: dict[str, tuple[int, ...]] = {}
    for key, value in tensors.items():
        if key.endswith(".num_batches_tracked"):
            skipped[key] = tuple(value.shape)
        elif key not in expected:
            raise ConfigError(
                f"{path} has tensor {key} {list(value.shape)}, which {model_name} does not; "
                "the file holds another variant: pick its --model"
            )
    return SourceWeights(layers=layers, skipped=skipped)
