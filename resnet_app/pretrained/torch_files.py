"""torchvision (and timm) ResNet weights in a `.safetensors` file, read exactly.

torchvision's ResNet (v1.5) is our v1 ResNet with the stride on the 3x3
convolution and symmetric padding (`sources.TORCHVISION_FIELDS`); timm's
`resnet18` ... `resnet152` use the same names. Names map as

    conv1, bn1                          stem_conv, stem_bn
    layer{s}.{u}.conv{k}, .bn{k}        stage{s}_unit{u}_conv{k}, _bn{k}
    layer{s}.{u}.downsample.0 / .1      stage{s}_unit{u}_shortcut_conv / _shortcut_bn
    fc                                  logits

and layouts convert: a convolution's OIHW kernel to HWIO, the linear layer's
[out, in] matrix to [in, out]. BatchNorm `weight`, `bias`, `running_mean`,
`running_var` are `gamma`, `beta`, `moving_mean`, `moving_variance`;
`num_batches_tracked` has no counterpart and is skipped.
"""

from __future__ import annotations

import re

import numpy as np

from resnet_app.common.errors import ConfigError, first_line
from resnet_app.pretrained.weights import SourceWeights

_NORM = {
    "weight": "gamma",
    "bias": "beta",
    "running_mean": "moving_mean",
    "running_var": "moving_variance",
}
_UNIT = re.compile(r"^layer(\d+)\.(\d+)\.(conv\d|bn\d|downsample\.0|downsample\.1)\.(\w+)$")


def _layer_of(key: str) -> tuple[str, str] | None:
    """(our layer name, torchvision's tensor kind) of a state-dict key, or None."""
    head, _, kind = key.rpartition(".")
    if head == "conv1":
        return "stem_conv", kind
    if head == "bn1":
        return "stem_bn", kind
    if head == "fc":
        return "logits", kind
    match = _UNIT.match(key)
    if not match:
        return None
    stage, unit, module, kind = match.groups()
    prefix = f"stage{stage}_unit{unit}"
    names = {"downsample.0": "shortcut_conv", "downsample.1": "shortcut_bn"}
    return f"{prefix}_{names.get(module, module)}", kind


def _convert(layer: str, kind: str, value: np.ndarray) -> tuple[str, np.ndarray]:
    """(Keras variable name, value in Keras's layout) of one torchvision tensor."""
    if layer == "logits":
        return ("kernel", value.T) if kind == "weight" else ("bias", value)
    if value.ndim == 4:  # A convolution: OIHW -> HWIO.
        return "kernel", value.transpose(2, 3, 1, 0)
    return _NORM[kind], value


def read(path: str) -> SourceWeights:
    """The weights of a torchvision-layout ResNet `.safetensors` file, under our layer names.

    Raises:
      ConfigError: for an unreadable file or tensors a torchvision ResNet does not have.
    """
    from safetensors.numpy import load_file

    try:
        tensors = load_file(path)
    except Exception as error:  # noqa: BLE001 - a corrupt or unsupported file is one line.
        raise ConfigError(
            f"{path} is not a readable .safetensors file ({first_line(error)}); check the "
            "file (float32 or float16 tensors)"
        ) from None
    layers: dict[str, dict[str, np.ndarray]] = {}
    skipped: dict[str, tuple[int, ...]] = {}
    for key, value in tensors.items():
        found = _layer_of(key)
        if found is None:
            raise ConfigError(
                f"{path} has tensor {key!r}, which torchvision's ResNet does not; give a "
                "torchvision or timm resnet18/34/50/101/152 file"
            )
        layer, kind = found
        if kind == "num_batches_tracked":
            skipped[key] = tuple(value.shape)
            continue
        if kind not in ("weight", "bias", *_NORM):
            raise ConfigError(f"{path} has tensor {key!r} of unknown kind {kind!r}")
        name, converted = _convert(layer, kind, np.asarray(value, np.float32))
        layers.setdefault(layer, {})[name] = np.ascontiguousarray(converted)
    return SourceWeights(layers=layers, skipped=skipped)
