"""What `train.init_from` names, the network its weights belong to, and their preprocessing.

`parse(spec)` turns the setting into a `Source`: `keras:resnet50` (or 101,
152: Keras applications' ImageNet weights, from Keras's cache or downloaded),
a Keras applications `PATH.h5`, a torchvision or timm `PATH.safetensors`, a
run directory of this app or one of its checkpoints (`RUN/ckpt-N`). A source
brings the `ResNetConfig` fields that make our network exactly theirs and the
mean and std they expect (0-255, RGB); `adopt` puts both into a run's config,
so that config.yaml, evaluate and export follow the weights.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from absl import logging

from resnet_app.common import run_dir
from resnet_app.common.errors import ConfigError
from resnet_app.config import Config
from resnet_app.data import channels as image_channels

KERAS, TORCHVISION, RUN = "keras", "torchvision", "run"
KERAS_PRESETS = ("resnet50", "resnet101", "resnet152")
KERAS_V2 = ("resnet50v2", "resnet101v2", "resnet152v2")

# Keras applications' ResNet v1 (Caffe's): images minus the ImageNet mean, unscaled
# (its BGR order is undone on the stem kernel's input channels).
KERAS_MEAN = (123.68, 116.779, 103.939)
KERAS_STD = (1.0, 1.0, 1.0)
# torchvision: RGB in [0, 1], minus the ImageNet mean, over its std.
TORCHVISION_MEAN = tuple(255 * value for value in (0.485, 0.456, 0.406))
TORCHVISION_STD = tuple(255 * value for value in (0.229, 0.224, 0.225))

# The ResNetConfig fields a source's network fixes (depth and widths are checked on its shapes).
EXACT_FIELDS = ("stride_in_1x1", "padding", "bn_epsilon")
KERAS_FIELDS = {"stride_in_1x1": True, "padding": "symmetric", "bn_epsilon": 1.001e-5}
TORCHVISION_FIELDS = {"stride_in_1x1": False, "padding": "symmetric", "bn_epsilon": 1e-5}
# A weights file's kind by its suffix; a kind's (fields, mean, std).
SUFFIXES = {".h5": KERAS, ".safetensors": TORCHVISION}
NETWORKS = {
    KERAS: (KERAS_FIELDS, KERAS_MEAN, KERAS_STD),
    TORCHVISION: (TORCHVISION_FIELDS, TORCHVISION_MEAN, TORCHVISION_STD),
}


@dataclasses.dataclass(frozen=True)
class Source:
    """Pretrained weights named by `train.init_from`.

    Attributes:
      spec: the setting as given.
      kind: KERAS, TORCHVISION or RUN.
      path: the file, run directory or checkpoint prefix; None for `keras:NAME`.
      name: the Keras applications model of `keras:NAME`, else None.
      model_fields: `ResNetConfig` fields the source's network has.
      mean, std: the per-channel statistics the weights expect, or None.
      key: the setting that names it (`train.teacher` names a source too).
    """

    spec: str
    kind: str
    path: str | None = None
    name: str | None = None
    model_fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    key: str = "train.init_from"


def parse(spec: str, key: str = "train.init_from") -> Source:
    """The `Source` that `train.init_from` (or `key`) names.

    Raises:
      ConfigError: for a Keras model that cannot be represented exactly, a
        missing path, or a file of an unknown kind.
    """
    if spec.startswith("keras:"):
        name = spec.split(":", 1)[1].strip().lower().replace("_", "")
        if name in KERAS_V2:
            raise ConfigError(
                f"{key}={spec}: Keras applications' ResNetV2 cannot be represented "
                "exactly here (it downsamples in the last unit of each stage, not the first, and "
                "has no BatchNorm after the stem); use keras:resnet50/101/152 or a torchvision file"
            )
        if name not in KERAS_PRESETS:
            raise ConfigError(
                f"{key}={spec}: unknown Keras applications model; use one of "
                f"{', '.join('keras:' + preset for preset in KERAS_PRESETS)}"
            )
        return _network_source(spec, KERAS, None, name, key)
    path = os.path.expanduser(spec)
    kind = next((kind for suffix, kind in SUFFIXES.items() if path.endswith(suffix)), None)
    if kind is not None:
        if not os.path.isfile(path):
            raise ConfigError(f"{key}={spec}: no such file; check the path")
        return _network_source(spec, kind, path, None, key)
    if os.path.isdir(path) or os.path.isfile(path + ".index"):
        return Source(spec, RUN, path, key=key)
    if os.path.exists(path):
        raise ConfigError(
            f"{key}={spec}: not a weights file this app reads; give keras:resnet50, "
            "a Keras applications .h5 file, a torchvision .safetensors file, or a run directory"
        )
    raise ConfigError(f"{key}={spec}: no such file or directory; check the path")


def check_teacher(spec: str, model_name: str | None) -> None:
    """Refuses (ConfigError) a `train.teacher` that cannot load, without TensorFlow: a missing
    path, a file of an unknown kind, or a weights file whose network is not named (a
    directory passes: a run's or an export's, told apart when it is read)."""
    key = "train.teacher"
    if os.path.isdir(os.path.expanduser(spec)):
        return
    source = parse(spec, key)
    if source.kind != RUN and not (model_name or source.name):
        raise ConfigError(
            f"{key}={spec} is a weights file: name its network with train.teacher_model "
            "(e.g. resnet50)"
        )


def _network_source(spec: str, kind: str, path: str | None, name: str | None, key: str) -> Source:
    fields, mean, std = NETWORKS[kind]
    return Source(spec, kind, path, name, dict(fields), mean, std, key)


def describe(source: Source) -> str:
    """One phrase for logs: what the weights are and where they come from."""
    if source.kind == KERAS and source.name:
        return f"Keras applications {source.name} (ImageNet)"
    kinds = {KERAS: "Keras applications file", TORCHVISION: "torchvision file", RUN: "run"}
    return f"{kinds[source.kind]} {source.path}"


def with_run_details(source: Source) -> Source:
    """A RUN source with the network (its checkpoint's saved config) and preprocessing
    (its run's data_info.json) the run recorded. Needs TensorFlow."""
    from resnet_app import config as config_lib
    from resnet_app.common import checkpoint
    from resnet_app.data import run_pipeline

    prefix, directory = checkpoint_of(source)
    saved = checkpoint.read_value(prefix, "config")
    fields: dict[str, Any] = {}
    if saved is not None:
        saved_config = config_lib.from_yaml(saved.decode(), f"the config saved in {prefix}")
        fields = _exact_fields(saved_config)
    recorded = run_pipeline.read_data_info(directory)
    mean = std = None
    if recorded is None:
        logging.warning(
            "%s records no preprocessing (no data_info.json); this run measures its own", directory
        )
    else:
        mean, std = tuple(recorded[1].mean), tuple(recorded[1].std)
    return dataclasses.replace(source, path=prefix, model_fields=fields, mean=mean, std=std)


def checkpoint_of(source: Source) -> tuple[str, str]:
    """(checkpoint prefix, its run directory) of a RUN source; ConfigError without one."""
    from resnet_app.common import checkpoint

    path = source.path
    if os.path.isfile(path + ".index"):
        reason = checkpoint.unreadable(path)
        if reason:
            raise ConfigError(f"{source.key}={source.spec}: unreadable checkpoint ({reason})")
        return path, os.path.dirname(path) or "."
    latest = checkpoint.find_latest(path)
    if latest is None:
        raise ConfigError(
            f"{source.key}={source.spec}: the directory holds no checkpoint "
            f"({run_dir.checkpoint_name(1).replace('1', 'N')}.index); give a run directory "
            "that has trained, or a weights file"
        )
    return latest[1], path


def recorded(saved: Config, spec: str) -> Source:
    """What a resumed run adopted from its source, as the run's own config recorded it."""
    fields = _exact_fields(saved)
    return Source(spec, RUN, model_fields=fields, mean=saved.data.mean, std=saved.data.std)


def _exact_fields(config: Config) -> dict[str, Any]:
    """The `EXACT_FIELDS` of a config's network, as its preset resolves them."""
    from resnet_app.nets.presets import get_config  # Pure data: no TensorFlow.

    preset = get_config(config.model_name, **config.model_overrides)
    return {name: getattr(preset, name) for name in EXACT_FIELDS}


def adopt(config: Config, source: Source) -> Config:
    """`config` with the source's network and preprocessing, unless the user set them.

    A model field set to another value than the source's is refused
    (ConfigError); a mean or std the user set is kept, with a warning.
    """
    given = config.model_overrides
    for name, value in source.model_fields.items():
        if name in given and given[name] != value:
            raise ConfigError(
                f"model.{name}={given[name]!r}, but the weights of {source.spec} were "
                f"trained with {name}={value!r}; drop model.{name}"
            )
    model = dataclasses.replace(config.model, **source.model_fields)
    data = config.data
    if source.mean is not None:
        if data.mean is None and data.std is None:
            mean = _in_channels(source.mean, data.channels)
            data = dataclasses.replace(data, mean=mean, std=_in_channels(source.std, data.channels))
        elif (data.mean, data.std) != (source.mean, source.std):
            logging.warning(
                "data.mean=%s, data.std=%s as set, but the weights of %s expect mean %s and "
                "std %s (0-255 scale, RGB); drop data.mean and data.std to follow the weights",
                data.mean,
                data.std,
                source.spec,
                tuple(round(value, 3) for value in source.mean),
                tuple(round(value, 3) for value in source.std),
            )
    return dataclasses.replace(config, model=model, data=data)


def _in_channels(values: tuple[float, ...], channels: int | None) -> tuple[float, ...]:
    """The weights' statistics for data.channels when it asks for the other kind: RGB
    ones' luma-weighted mean for greyscale, a grey one repeated for RGB."""
    if not channels or channels == len(values):
        return values
    if channels == image_channels.GREY:
        weights = image_channels.LUMA_WEIGHTS
        return (sum(w * v for w, v in zip(weights, values, strict=True)) / sum(weights),)
    return tuple(values) * image_channels.RGB
