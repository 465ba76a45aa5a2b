"""The model of a run, from its config: training, evaluation and export all build it here."""

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


def create_run_model(
    config, num_classes: int, image_size: int, precision: str = "fp32", channels: int = 3
) -> keras.Model:
    """The config's model with `num_classes` logits, built for `image_size` inputs in
    `precision` (`train.precision`); ConfigError if `model.num_classes` contradicts it."""
    classes = config.model_overrides.get("num_classes")
    if classes is not None and classes != num_classes:
        raise ConfigError(
            f"model.num_classes={classes} but dataset {config.data.dataset} has "
            f"{num_classes} classes; drop model.num_classes"
        )
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
