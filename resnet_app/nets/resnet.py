"""ResNet architectures, built from a stage table.

One parameterized network covers every depth of He et al. 2015 ("Deep Residual
Learning", v1, post-activation) and He et al. 2016 ("Identity Mappings", v2,
pre-activation). A preset is one line of data in `PRESETS`; `create_model` turns
a preset name plus overrides into a Keras 3 model. The stage tables and the
`ResNetConfig` they fill are in `presets.py`.

Architecture only: no loss, optimizer, schedule, logging or printing lives here.
The command-line summary (`python -m resnet_app.model`) is in `summary.py`.

Conventions:
  * NHWC everywhere. Convolutions have no bias (a BatchNorm follows or precedes).
  * Stages are numbered from 1, units within a stage from 0, convolutions within a
    unit from 1, so layer names read `stage2_unit0_conv1`.
  * A bottleneck unit's output width is 4x its stage width (the seed's filter
    multiplication: CIFAR widths 16-32-64 give unit outputs 64-128-256).
  * BatchNorm defaults: momentum 0.9 (PyTorch's 0.1), epsilon 1e-5, per-tower
    statistics. `bn_synchronized=True` makes the statistics cross-tower.
  * Weight decay is an L2 penalty `weight_decay * sum(w**2) / 2` (TF1
    `tf.nn.l2_loss`) on conv and dense kernels only, never on BatchNorm
    parameters or biases. It is reported through `model.losses`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras

from resnet_app.common.errors import ConfigError
from resnet_app.nets.batch_norm import BatchNorm
from resnet_app.nets.presets import ResNetConfig, get_config

Shape = tuple[int | None, ...]


def create_model(name: str, **overrides: Any) -> ResNet:
    """Creates preset `name`, e.g. `create_model("resnet50", num_classes=10)`.

    Args:
      name: a preset from `presets.model_names()`.
      **overrides: any `ResNetConfig` field.

    Returns:
      An unbuilt model: its variables are created by the first call, or by
      `model.build((None, height, width, 3))`.

    Raises:
      ConfigError: for an unknown preset, field or bad value.
    """
    return ResNet(get_config(name, **overrides), name=name)


def _l2(weight_decay: float) -> keras.regularizers.Regularizer | None:
    # keras L2(c) is c * sum(w**2); TF1's tf.nn.l2_loss is sum(w**2) / 2.
    return keras.regularizers.L2(weight_decay / 2) if weight_decay else None


class _Layers:
    """Makes the layers of a network from one config, with consistent settings."""

    def __init__(self, config: ResNetConfig):
        self.config = config

    def conv(self, filters: int, kernel: int, stride: int, name: str) -> keras.layers.Layer:
        return keras.layers.Conv2D(
            filters,
            kernel,
            strides=stride,
            padding="same",
            use_bias=False,
            # He et al. 2015 initialization, as in torchvision and the seed.
            kernel_initializer=keras.initializers.VarianceScaling(
                2.0, mode="fan_out", distribution="untruncated_normal"
            ),
            kernel_regularizer=_l2(self.config.weight_decay),
            name=name,
        )

    def batch_norm(self, name: str, zero_gamma: bool = False) -> keras.layers.Layer:
        return BatchNorm(
            momentum=self.config.bn_momentum,
            epsilon=self.config.bn_epsilon,
            synchronized=self.config.bn_synchronized,
            gamma_initializer="zeros" if zero_gamma else "ones",
            name=name,
        )


def _build_layer(layer: keras.layers.Layer | None, input_shape: Shape) -> Shape | None:
    """Creates `layer`'s variables for `input_shape`; returns its output shape."""
    if layer is None:
        return None
    layer.build(tuple(input_shape))
    return tuple(layer.compute_output_shape(tuple(input_shape)))


class ZeroPadShortcut(keras.layers.Layer):
    """Option A shortcut: subsample spatially, then zero-pad the new channels."""

    def __init__(self, stride: int, extra_channels: int, **kwargs):
        super().__init__(**kwargs)
        self.stride = stride
        self.extra_channels = extra_channels

    def call(self, inputs):
        outputs = inputs[:, :: self.stride, :: self.stride, :]
        before = self.extra_channels // 2
        return keras.ops.pad(
            outputs, [[0, 0], [0, 0], [0, 0], [before, self.extra_channels - before]]
        )

    def get_config(self):
        return {
            **super().get_config(),
            "stride": self.stride,
            "extra_channels": self.extra_channels,
        }


class ResidualUnit(keras.layers.Layer):
    """One residual unit: a basic or bottleneck branch plus a shortcut.

    v1: out = relu(branch(x) + shortcut(x)), each conv followed by BN (and ReLU
    except the last). v2: out = branch(bn_relu(x)) + shortcut(...), each conv
    preceded by BN-ReLU; the unit ends without an activation.
    """

    def __init__(
        self,
        config: ResNetConfig,
        in_channels: int,
        width: int,
        stride: int,
        first_in_network: bool,
        first_in_stage: bool,
        **kwargs,
    ):
        super().__init__(**kwargs)
        make = _Layers(config)
        name = self.name
        self.version = config.version
        self.stride = stride
        self.out_channels = out_channels = width * config.expansion
        v1 = config.version == "v1"

        if config.block == "basic":
            kernels, widths = (3, 3), (width, out_channels)
            strides = (stride, 1)
        else:
            kernels, widths = (1, 3, 1), (width, width, out_channels)
            strides = (stride, 1, 1) if config.stride_in_1x1 else (1, stride, 1)
        # Sublayers are attributes (conv1, bn1, ...), not lists: TensorFlow
        # checkpoints follow attributes only, so layers held in a list would
        # be missing from every checkpoint.
        convs = [
            make.conv(filters, kernel, conv_stride, f"{name}_conv{index}")
            for index, (filters, kernel, conv_stride) in enumerate(
                zip(widths, kernels, strides), start=1
            )
        ]
        last = len(convs)
        self.preact_norm = None
        if v1:
            # Post-activation: a BN after every conv.
            norms = [
                make.batch_norm(
                    f"{name}_bn{index}",
                    zero_gamma=config.zero_init_residual and index == last,
                )
                for index in range(1, last + 1)
            ]
        else:
            # Pre-activation: a BN before every conv. bn0 normalizes the unit's
            # input, except in the network's very first unit, whose input (the
            # stem output) is already normalized and activated.
            if not first_in_network:
                self.preact_norm = make.batch_norm(f"{name}_bn0")
            norms = [make.batch_norm(f"{name}_bn{index}") for index in range(1, last)]
        for index, conv in enumerate(convs, start=1):
            setattr(self, f"conv{index}", conv)
        for index, norm in enumerate(norms, start=1):
            setattr(self, f"bn{index}", norm)
        self.num_convs, self.num_norms = len(convs), len(norms)
        # Whether the shortcut takes the activated input (v2 "both_preact").
        self.shortcut_preactivated = not v1 and (
            first_in_network or (first_in_stage and config.activate_before_residual)
        )

        self.projection = self.projection_norm = self.pad = None
        if stride != 1 or in_channels != out_channels:
            if config.shortcut == "projection":
                self.projection = make.conv(out_channels, 1, stride, f"{name}_shortcut_conv")
                if v1:
                    self.projection_norm = make.batch_norm(f"{name}_shortcut_bn")
            else:
                if out_channels < in_channels:
                    raise ConfigError(
                        f"{name}: a 'pad' shortcut cannot shrink {in_channels} "
                        f"channels to {out_channels}; use shortcut=projection"
                    )
                self.pad = ZeroPadShortcut(
                    stride, out_channels - in_channels, name=f"{name}_shortcut_pad"
                )

    @property
    def convs(self) -> list[keras.layers.Layer]:
        """The branch's convolutions, in order."""
        return [getattr(self, f"conv{index}") for index in range(1, self.num_convs + 1)]

    @property
    def norms(self) -> list[keras.layers.Layer]:
        """The branch's BatchNorms after (v1) or before (v2) its convolutions."""
        return [getattr(self, f"bn{index}") for index in range(1, self.num_norms + 1)]

    def build(self, input_shape: Shape) -> None:
        shape = input_shape
        if self.preact_norm is not None:
            _build_layer(self.preact_norm, shape)
        if self.version == "v1":
            for conv, norm in zip(self.convs, self.norms):
                shape = _build_layer(conv, shape)
                _build_layer(norm, shape)
        else:
            shape = _build_layer(self.convs[0], shape)
            for conv, norm in zip(self.convs[1:], self.norms):
                _build_layer(norm, shape)
                shape = _build_layer(conv, shape)
        if self.projection is not None:
            _build_layer(self.projection_norm, _build_layer(self.projection, input_shape))

    def compute_output_shape(self, input_shape: Shape) -> Shape:
        # "same" padding: a stride-s conv gives ceil(size / s).
        batch, height, width, _ = input_shape
        spatial = [None if size is None else -(-size // self.stride) for size in (height, width)]
        return (batch, *spatial, self.out_channels)

    def _shortcut(self, inputs, training):
        if self.projection is not None:
            outputs = self.projection(inputs)
            if self.projection_norm is not None:
                outputs = self.projection_norm(outputs, training=training)
            return outputs
        if self.pad is not None:
            return self.pad(inputs)
        return inputs

    def call(self, inputs, training=None):
        relu = keras.ops.relu
        if self.version == "v1":
            outputs = inputs
            for index, (conv, norm) in enumerate(zip(self.convs, self.norms)):
                outputs = norm(conv(outputs), training=training)
                if index < len(self.convs) - 1:
                    outputs = relu(outputs)
            return relu(outputs + self._shortcut(inputs, training))

        activated = inputs
        if self.preact_norm is not None:
            activated = relu(self.preact_norm(inputs, training=training))
        outputs = self.convs[0](activated)
        for conv, norm in zip(self.convs[1:], self.norms):
            outputs = conv(relu(norm(outputs, training=training)))
        shortcut_input = activated if self.shortcut_preactivated else inputs
        return outputs + self._shortcut(shortcut_input, training)


@keras.saving.register_keras_serializable(package="resnet_app")
class ResNet(keras.Model):
    """A ResNet: stem, stages of residual units, global average pool, logits.

    Call as `model(images, training=...)` for logits (no softmax), or with
    `return_hidden=True` for `(logits, hidden)`. `hidden` holds the stem output,
    then the output of every stage; its last element is the feature map that
    is pooled (for v2, after the final BN-ReLU), so it has len(units) + 1
    entries.
    """

    def __init__(self, config: ResNetConfig, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        make = _Layers(config)
        self.stem_conv = make.conv(
            config.stem_filters, config.init_filter, config.init_stride, "stem_conv"
        )
        # Both versions normalize and activate the stem: v1 as every conv, v2
        # so that the first unit can skip its own pre-activation.
        self.stem_bn = make.batch_norm("stem_bn")
        self.stem_pool = (
            keras.layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool")
            if config.init_max_pool
            else None
        )

        # Units are attributes named stage2_unit0, ... (checkpoints follow
        # attributes, not lists); `stage_names` keeps the table's order.
        stage_names = []
        in_channels = config.stem_filters
        for stage, (units, width, stride) in enumerate(
            zip(config.units, config.widths, config.strides), start=1
        ):
            names = []
            for unit in range(units):
                name = f"stage{stage}_unit{unit}"
                layer = ResidualUnit(
                    config,
                    in_channels=in_channels,
                    width=width,
                    stride=stride if unit == 0 else 1,
                    first_in_network=stage == 1 and unit == 0,
                    first_in_stage=unit == 0,
                    name=name,
                )
                setattr(self, name, layer)
                names.append(name)
                in_channels = width * config.expansion
            stage_names.append(tuple(names))
        self.stage_names = tuple(stage_names)

        self.final_bn = make.batch_norm("final_bn") if config.version == "v2" else None
        self.pool = keras.layers.GlobalAveragePooling2D(name="pool")
        self.logits = keras.layers.Dense(
            config.num_classes,
            kernel_regularizer=_l2(config.weight_decay),
            # Logits stay float32 under a mixed-precision policy.
            dtype="float32",
            name="logits",
        )

    @property
    def stages(self) -> list[list[ResidualUnit]]:
        """The residual units, stage by stage."""
        return [[getattr(self, name) for name in names] for names in self.stage_names]

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "config": dataclasses.asdict(self.config)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ResNet:
        return cls(ResNetConfig(**config["config"]), name=config["name"])

    def build(self, input_shape: Shape) -> None:
        # Shapes are walked through the table instead of traced: a symbolic
        # call builds ResNet-1202 in about 27 s, this in about 10 s.
        shape = _build_layer(self.stem_conv, input_shape)
        _build_layer(self.stem_bn, shape)
        if self.stem_pool is not None:
            shape = self.stem_pool.compute_output_shape(shape)
        for stage_units in self.stages:
            for unit in stage_units:
                shape = _build_layer(unit, shape)
        if self.final_bn is not None:
            _build_layer(self.final_bn, shape)
        _build_layer(self.logits, self.pool.compute_output_shape(shape))

    def call(self, inputs, training=None, return_hidden=False):
        outputs = keras.ops.relu(self.stem_bn(self.stem_conv(inputs), training=training))
        if self.stem_pool is not None:
            outputs = self.stem_pool(outputs)
        hidden = [outputs]
        for stage_units in self.stages:
            for unit in stage_units:
                outputs = unit(outputs, training=training)
            hidden.append(outputs)
        if self.final_bn is not None:
            outputs = keras.ops.relu(self.final_bn(outputs, training=training))
            hidden[-1] = outputs
        logits = self.logits(self.pool(outputs))
        if return_hidden:
            return logits, hidden
        return logits

    def features(self, inputs, training=None):
        """The globally pooled activations that the logits layer reads: [batch, width]."""
        _, hidden = self(inputs, training=training, return_hidden=True)
        return self.pool(hidden[-1])
