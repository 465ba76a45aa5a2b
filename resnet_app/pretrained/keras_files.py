"""Keras applications' ResNet v1 weights (`keras.applications.ResNet50/101/152`), read exactly.

That network is the original Caffe ResNet, which `sources.KERAS_FIELDS` makes
ours (stride on the first 1x1, epsilon 1.001e-5, symmetric padding); the model
declares its layers' names there (`parts.source_names`). Two conversions, both
exact: a conv's bias `b` is folded into the next BatchNorm's moving mean
(`mean - b`; in training the batch mean takes `b` with it), and the stem
kernel's input channels are reversed (the file's network reads BGR). Files
are Keras 2's HDF5 (`layer_names`, per layer `weight_names`) or Keras 3's
`.weights.h5`, whose layers are numbered by class: those are loaded into the
Keras applications model they fit and read back by its layer names.
"""

from __future__ import annotations

import os
import re
import warnings

import numpy as np

from resnet_app.common import compat
from resnet_app.common.errors import ConfigError, first_line
from resnet_app.data import sources as data_sources
from resnet_app.nets import blocks, parts
from resnet_app.pretrained.weights import SourceWeights, check_units

# A layer's arrays, in the order Keras keeps them.
CONV = ("kernel", "bias")
BATCH_NORM = ("gamma", "beta", "moving_mean", "moving_variance")


def file_names(name: str) -> tuple[str, str]:
    """(with the classifier, without it): the file names Keras caches `name`'s weights under."""
    stem = f"{name}_weights_tf_dim_ordering_tf_kernels"
    return f"{stem}.h5", f"{stem}_notop.h5"


def find_or_fetch(name: str, with_top: bool) -> str:
    """The path of Keras applications' `name` weights (`with_top`: preferably with the
    classifier): cached, or downloaded by Keras; offline and not cached, ConfigError."""
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


def _text(value) -> str:
    """An HDF5 attribute's string (h5py gives bytes or str)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_arrays(path: str) -> dict[str, list[np.ndarray]]:
    """{layer name: its arrays in order} of a Keras HDF5 weights file (Keras 2's or Keras 3's)."""
    import h5py

    try:
        with h5py.File(path, "r") as file:
            if "layer_names" in file.attrs:
                layers = {}
                for name in map(_text, file.attrs["layer_names"]):
                    group = file[name]
                    names = map(_text, group.attrs.get("weight_names", []))
                    layers[name] = [np.asarray(group[weight]) for weight in names]
                return layers
            keras3 = "layers" in file
    except (OSError, KeyError, ValueError) as error:
        raise ConfigError(
            f"{path} is not a readable Keras weights file ({first_line(error)}); download it again"
        ) from None
    if keras3:
        return _read_keras3(path)
    raise ConfigError(f"{path} is an HDF5 file without Keras weights; give a weights file")


# The Keras applications ResNets a Keras 3 `.weights.h5` file may hold, by their number of
# convolutions (its layers are named by class: conv2d, conv2d_1, ...): the stem, 3 in each of
# 16, 33 or 50 bottleneck units, and 4 projection shortcuts.
_APPLICATIONS = {53: "ResNet50", 104: "ResNet101", 155: "ResNet152"}


def _read_keras3(path: str) -> dict[str, list[np.ndarray]]:
    """{layer name: arrays} of a Keras 3 `.weights.h5` file of a Keras applications ResNet,
    loaded into the model of its depth (its classifier's width from the file)."""
    import h5py
    import keras

    with h5py.File(path, "r") as file:
        layers = list(file["layers"])
        convolutions = sum(re.fullmatch(r"conv2d(_\d+)?", name) is not None for name in layers)
        dense = [name for name in layers if name.startswith("dense")]
        classes = None
        if dense and "vars" in file["layers"][dense[0]]:
            classes = int(file["layers"][dense[0]]["vars"]["1"].shape[0])
    if convolutions in _APPLICATIONS:
        model = getattr(keras.applications, _APPLICATIONS[convolutions])(
            weights=None,
            include_top=classes is not None,
            classes=classes or 1000,
            classifier_activation=None,
        )
        try:
            # Keras warns once per layer it skips in another network's file; the
            # error below says all of it.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.load_weights(path)
        except Exception:  # noqa: BLE001 - another network of that depth: refused below.
            pass
        else:
            return {
                layer.name: [np.asarray(w) for w in layer.get_weights()] for layer in model.layers
            }
    raise ConfigError(
        f"{path} is a Keras 3 .weights.h5 file of none of Keras applications' "
        f"{', '.join(_APPLICATIONS.values())} (it holds {convolutions} convolutions; they hold "
        f"{', '.join(map(str, _APPLICATIONS))}); give one of theirs, or their published .h5 file"
    )


_UNIT_PREFIX = re.compile(r"^conv(\d+)_block(\d+)_")


def read(path: str, model, model_name: str) -> SourceWeights:
    """The weights of a Keras applications ResNet v1 file, under `model`'s layer names;
    ConfigError for an unreadable, V2 or other-depth file, or layers `model` lacks."""
    arrays = {name: values for name, values in _read_arrays(path).items() if values}
    if any(name == "post_bn" or name.endswith("_preact_bn") for name in arrays):
        raise ConfigError(
            f"{path} holds a Keras applications ResNetV2, which cannot be represented exactly "
            "here (it downsamples in the last unit of each stage); use a ResNet v1 file"
        )
    check_units(_UNIT_PREFIX, arrays, model, path, model_name, first=2)  # conv2_block1_...
    ours_by_theirs = {
        theirs: ours for ours, theirs in parts.source_names(model, blocks.KERAS).items()
    }
    layers: dict[str, dict[str, np.ndarray]] = {}
    biases: dict[str, np.ndarray] = {}
    for name, values in arrays.items():
        ours = ours_by_theirs.get(name)
        if ours is None:
            raise ConfigError(
                f"{path} has layer {name!r}, which {model_name} does not; "
                "give a Keras applications ResNet50/101/152 weights file"
            )
        order = BATCH_NORM if name.endswith("_bn") else CONV
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
