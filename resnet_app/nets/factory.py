"""The model of a run: its config's preset, classes, input size and precision.

Training, evaluation and export all build a run's network here, so that the
three agree on what the network is (and serving never imports the training
loop to get it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import keras

from resnet_app.common import precision as precision_names
from resnet_app.common.errors import ConfigError
from resnet_app.nets.resnet import create_model


@contextlib.contextmanager
def dtype_policy(name: str) -> Iterator[None]:
    """Layers made inside compute in `name`'s dtype; the global policy is restored after."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _check_num_classes(config, num_classes: int) -> None:
    """Refuses a `model.num_classes` that contradicts the dataset's `num_classes`.

    Raises:
      ConfigError: naming both numbers and the fix.
    """
    classes = config.model_overrides.get("num_classes")
    if classes is not None and classes != num_classes:
        raise ConfigError(
            f"model.num_classes={classes} but dataset {config.data.dataset} has "
            f"{num_classes} classes; drop model.num_classes"
        )


def create_run_model(
    config, num_classes: int, image_size: int, precision: str = "fp32", channels: int = 3
) -> keras.Model:
    """The config's model with `num_classes` outputs, built for `image_size` inputs.

    Create it in a strategy's scope to distribute it.

    Args:
      config: the run's resolved `Config`.
      num_classes: width of the logits (the dataset's classes).
      image_size: input height and width.
      precision: a `train.precision` value: the layers compute in its dtype.
      channels: input channels: 3 (RGB) or 1 (greyscale).

    Raises:
      ConfigError: when `model.num_classes` contradicts `num_classes`.
    """
    _check_num_classes(config, num_classes)
    return create_network(
        config.model_name, config.model_overrides, num_classes, image_size, precision, channels
    )


def create_network(
    name: str,
    overrides: dict,
    num_classes: int,
    image_size: int,
    precision: str = "fp32",
    channels: int = 3,
) -> keras.Model:
    """Preset `name` with `overrides` and `num_classes` outputs, built for `image_size` inputs."""
    with dtype_policy(precision_names.get(precision).keras_policy):
        model = create_model(name, **{**overrides, "num_classes": num_classes})
        model.build((None, image_size, image_size, channels))
    return model
