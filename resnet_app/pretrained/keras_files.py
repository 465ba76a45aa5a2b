"""Keras applications' ResNet v1 weights (`keras.applications.ResNet50/101/152`), read exactly.

Keras applications' ResNet v1 is the original Caffe ResNet: the stride of a
downsampling unit on its first 1x1 convolution (`stride_in_1x1`), BatchNorm
epsilon 1.001e-5, symmetric padding of the stem's convolution and max-pool,
and a bias on every convolution. `sources.KERAS_FIELDS` makes our network that
network; this module maps the file's layers onto it:

    conv1_conv, conv1_bn                 stem_conv, stem_bn
    conv{s+1}_block{u+1}_{k}_conv / _bn  stage{s}_unit{u}_conv{k} / _bn{k}  (k = 1, 2, 3)
    conv{s+1}_block{u+1}_0_conv / _bn    stage{s}_unit{u}_shortcut_conv / _shortcut_bn
    predictions                          logits

Two conversions, both exact: a convolution's bias `b` followed by a BatchNorm
is folded into that BatchNorm's moving mean (`mean - b`: at inference
`(z + b - mean)` is `(z - (mean - b))`, and in training the batch mean takes
`b` with it); and the stem kernel's input channels are reversed, because the
file's network reads BGR images and ours reads RGB.

The files are HDF5, in the layout Keras applications publish (Keras 2's
`save_weights`: a `layer_names` attribute, and per layer a `weight_names`
attribute naming its arrays in the layer's order). Keras 3's `.weights.h5`
files are refused: they number layers by class instead of naming them.
"""

from __future__ import annotations

import os
import re

import numpy as np

from resnet_app.common import compat
from resnet_app.common.errors import ConfigError, first_line
from resnet_app.data import sources as data_sources
from resnet_app.pretrained.weights import SourceWeights

# A layer's arrays, in the order Keras keeps them.
CONV = ("kernel", "bias")
BATCH_NORM = ("gamma", "beta", "moving_mean", "moving_variance")
_UNIT = re.compile(r"^conv(\d+)_block(\d+)_(\d)_(conv|bn)$")


def file_names(name: str) -> tuple[str, str]:
    """(with the classifier, without it): the file names Keras caches `name`'s weights under."""
    stem = f"{name}_weights_tf_dim_ordering_tf_kernels"
    return f"{stem}.h5", f"{stem}_notop.h5"


def find_or_fetch(name: str, with_top: bool) -> str:
    """The path of Keras applications' `name` weights: cached, or downloaded by Keras.

    Args:
      name: "resnet50", "resnet101" or "resnet152".
      with_top: prefer the file with the 1000-class classifier.

    Raises:
      ConfigError: offline and not cached, naming where to put the file.
    """
    home = compat.keras_home()
    cache = os.path.join(home, "models")
    top, notop = file_names(name)
    preferred = (top, notop) if with_top else (notop, top)
    for file_name in preferred:
        if os.path.isfile(os.path.join(cache, file_name)):
            return os.path.join(cache, file_name)
    base_url, hashes = compat.keras_resnet_weights()
    file_name = preferred[0]
    if not data_sources.network_available():
        raise ConfigError(
            f"train.init_from=keras:{name}: {file_name} is not in {cache} and the download "
            f"host cannot be reached; fetch {base_url}{file_name} and put it in {cache}, or "
            "pass --init_from=PATH.h5"
        )
    import keras

    try:
        return keras.utils.get_file(
            file_name,
            base_url + file_name,
            cache_dir=home,
            cache_subdir="models",
            file_hash=hashes[name][0 if file_name == top else 1],
        )
    except Exception as error:  # noqa: BLE001 - any download failure is one line.
        raise ConfigError(
            f"train.init_from=keras:{name}: downloading {base_url}{file_name} failed "
            f"({first_line(error)}); put the file in {cache}"
        ) from None


def _read_arrays(path: str) -> dict[str, list[np.ndarray]]:
    """{layer name: its arrays in order} of a Keras HDF5 weights file."""
    import h5py

    try:
        with h5py.File(path, "r") as file:
            if "layer_names" in file.attrs:
                layers = {}
                for raw in file.attrs["layer_names"]:
                    name = raw.decode() if isinstance(raw, bytes) else str(raw)
                    group = file[name]
                    names = [
                        item.decode() if isinstance(item, bytes) else str(item)
                        for item in group.attrs.get("weight_names", [])
                    ]
                    layers[name] = [np.asarray(group[weight]) for weight in names]
                return layers
            if "layers" in file:
                raise ConfigError(
                    f"{path} is a Keras 3 .weights.h5 file, whose layers are numbered by class "
                    "(conv2d_12, ...), not named; give the .h5 file Keras applications publish"
                )
    except (OSError, KeyError, ValueError) as error:
        raise ConfigError(
            f"{path} is not a readable Keras weights file ({first_line(error)}); download it again"
        ) from None
    raise ConfigError(f"{path} is an HDF5 file without Keras weights; give a weights file")


def _target(name: str) -> tuple[str, tuple[str, ...]] | None:
    """(our layer name, array names) of a Keras applications layer name, or None."""
    if name in ("conv1_conv", "conv1_bn"):
        return ("stem_conv", CONV) if name.endswith("conv") else ("stem_bn", BATCH_NORM)
    if name == "predictions":
        return "logits", CONV
    match = _UNIT.match(name)
    if not match:
        return None
    stage, unit, k, kind = match.groups()
    prefix = f"stage{int(stage) - 1}_unit{int(unit) - 1}"
    # Branch layers 1-3 are conv{k}/bn{k}; layer 0 is the projection shortcut.
    layer = f"shortcut_{kind}" if k == "0" else f"{kind}{k}"
    return f"{prefix}_{layer}", CONV if kind == "conv" else BATCH_NORM


def read(path: str) -> SourceWeights:
    """The weights of a Keras applications ResNet v1 file, under our layer names.

    Raises:
      ConfigError: for an unreadable file, a ResNetV2 file, or layers that
        are not Keras applications' ResNet v1.
    """
    arrays = {name: values for name, values in _read_arrays(path).items() if values}
    if any(name == "post_bn" or name.endswith("_preact_bn") for name in arrays):
        raise ConfigError(
            f"{path} holds a Keras applications ResNetV2, which cannot be represented exactly "
            "here (it downsamples in the last unit of each stage); use a ResNet v1 file"
        )
    layers: dict[str, dict[str, np.ndarray]] = {}
    biases: dict[str, np.ndarray] = {}
    for name, values in arrays.items():
        target = _target(name)
        if target is None:
            raise ConfigError(
                f"{path} has layer {name!r}, which Keras applications' ResNet v1 does not; "
                "give a ResNet50/101/152 weights file"
            )
        ours, order = target
        named = dict(zip(order, values, strict=False))
        if ours != "logits" and "bias" in named:  # A convolution's bias: folded below.
            biases[ours] = named.pop("bias")
        layers[ours] = named
    for conv, bias in biases.items():
        norm = conv.replace("conv", "bn")  # stem_bn, stageS_unitU_bnK, ..._shortcut_bn.
        if norm not in layers:
            raise ConfigError(f"{path} has no BatchNorm after {conv}; not a Keras ResNet v1 file")
        layers[norm]["moving_mean"] = layers[norm]["moving_mean"] - bias
    if "stem_conv" in layers:  # BGR in the file, RGB here.
        layers["stem_conv"]["kernel"] = layers["stem_conv"]["kernel"][:, :, ::-1, :]
    return SourceWeights(layers=layers, skipped={})
