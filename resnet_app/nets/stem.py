"""A ResNet's stem: plain or deep convolutions, then a max-pool or a strided conv.

    plain  conv(stem_kernel, init_stride) - BN - ReLU                He et al. 2015
    deep   [conv3x3 - BN - ReLU] x 3, the first at init_stride       He et al. 2019 (ResNet-C)
    then, with init_max_pool, a 3x3/2 max-pool, or with
    replace_stem_pool a 3x3/2 conv - BN - ReLU                       Bello et al. 2021

The layers are attributes of the network itself (`stem_conv1`, `stem_bn1`,
..., `stem_conv`, `stem_bn` for the last conv, then `stem_pool` or
`stem_pool_conv` and `stem_pool_bn`), so that older checkpoints keep their keys.
"""

from __future__ import annotations

import keras

from resnet_app.common.errors import ConfigError
from resnet_app.nets.layers import LayerFactory
from resnet_app.nets.spec import ResNetConfig

TORCH, KERAS = "torch", "keras"


def conv_names(config: ResNetConfig) -> list[tuple[str, str]]:
    """(conv, BatchNorm) attribute names of the stem's convolutions, input to output."""
    count = len(config.stem_channels())
    inner = [(f"stem_conv{n}", f"stem_bn{n}") for n in range(1, count)]
    return [*inner, ("stem_conv", "stem_bn")]


def make_layers(config: ResNetConfig) -> dict[str, keras.layers.Layer]:
    """{attribute name: layer} of the stem, in the order the network assigns them."""
    make = LayerFactory(config)
    layers: dict[str, keras.layers.Layer] = {}
    for index, ((conv, norm), (kernel, width)) in enumerate(
        zip(conv_names(config), config.stem_kind.convs(config), strict=True)
    ):
        stride = config.init_stride if index == 0 else 1
        layers[conv] = make.conv(width, kernel, stride, conv)
        # Both versions normalize and activate the stem: v1 as every conv, v2
        # so that the first unit can skip its own pre-activation.
        layers[norm] = make.batch_norm(norm)
    if config.replace_stem_pool:
        layers["stem_pool_conv"] = make.conv(config.stem_filters, 3, 2, "stem_pool_conv")
        layers["stem_pool_bn"] = make.batch_norm("stem_pool_bn")
    elif config.init_max_pool:
        layers["stem_pool"] = make.max_pool("stem_pool")
    return layers


def call(model, inputs, training=None):
    """The stem's output: each conv-BN-ReLU (a strided one in place of the pool, too), then
    the max-pool."""
    outputs = inputs
    for conv, norm in model.stem_pairs:
        outputs = keras.ops.relu(norm(conv(outputs), training=training))
    if model.stem_pool is not None:
        outputs = model.stem_pool(outputs)
    return outputs


def source_names(config: ResNetConfig, layout: str) -> dict[str, str]:
    """{our layer name: its name in `layout`} for the stem's layers (ConfigError if none)."""
    if layout == KERAS:
        if not config.stem_kind.keras_applications or config.replace_stem_pool:
            raise ConfigError(
                "Keras applications' ResNets have a plain 7x7 stem; this model's stem differs: "
                "use a torchvision or timm file"
            )
        return {"stem_conv": "conv1_conv", "stem_bn": "conv1_bn"}
    if config.stem_kind.torch_names is None:
        raise ConfigError(
            f"torchvision and timm files hold no stem={config.stem}; train it from scratch"
        )
    names = config.stem_kind.torch_names(len(conv_names(config)))
    if config.replace_stem_pool:
        names.update({"stem_pool_conv": "maxpool.0", "stem_pool_bn": "maxpool.1"})
    return names
