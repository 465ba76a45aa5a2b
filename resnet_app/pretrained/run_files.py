"""Weights from another run of this app: its newest readable checkpoint, or a chosen one.

Only the network's weights and BatchNorm statistics (their moving average when
the run kept one), never the optimizer or the step. The network is rebuilt
from the config saved in the checkpoint and restored, so the weights come out
under our layer names whatever the checkpoint's layout.
"""

from __future__ import annotations

import tensorflow as tf
from absl import logging

from resnet_app import config as config_lib
from resnet_app.common import checkpoint
from resnet_app.common.errors import ConfigError
from resnet_app.nets import factory, parts
from resnet_app.nets.presets import get_config
from resnet_app.pretrained.weights import SourceWeights

_LOGITS_KEY = "model/logits/_kernel/.ATTRIBUTES/VARIABLE_VALUE"
# The stem's first convolution: "stem_conv1" of a deep stem, else "stem_conv".
_STEM_KEYS = [
    f"model/{name}/_kernel/.ATTRIBUTES/VARIABLE_VALUE" for name in ("stem_conv1", "stem_conv")
]


def _input_channels(shapes: dict) -> int:
    """The source network's input channels (1 or 3): its first kernel's input depth."""
    first = next((shapes[key] for key in _STEM_KEYS if key in shapes), None)
    return int(first[2]) if first is not None and len(first) == 4 else 3


def build(prefix: str, key: str = "train.init_from"):
    """(the network restored from the run checkpoint at `prefix`, its config, its input
    channels); ConfigError for a checkpoint without a saved config or a model."""
    saved = checkpoint.read_value(prefix, "config")
    shapes = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    if saved is None or _LOGITS_KEY not in shapes:
        raise ConfigError(f"{key}: {prefix} is not a checkpoint of this app's training runs")
    config = config_lib.from_yaml(saved.decode(), f"the config saved in {prefix}")
    num_classes = int(shapes[_LOGITS_KEY][-1])
    size = get_config(config.model_name, **config.model_overrides).default_image_size
    channels = _input_channels(shapes)
    model = factory.create_run_model(config, num_classes, size, channels=channels)
    if checkpoint.restore_model(model, prefix, "auto") == "ema":
        logging.info("%s: taking the moving average of the weights from %s", key, prefix)
    return model, config, channels


def read(prefix: str) -> SourceWeights:
    """The network weights of the run checkpoint at `prefix`, under our layer names."""
    model, _, _ = build(prefix)
    return SourceWeights(layers=parts.get_weights(model), skipped={})
