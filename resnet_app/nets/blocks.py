"""The residual units of a ResNet: the basic and bottleneck blocks, every variant an option.

    basic       two 3x3 convs
    bottleneck  1x1, 3x3 (grouped with `groups`), 1x1 to 4x the stage width

v1 post-activation, v2 pre-activation; with channel attention, dropout before
the last conv, stochastic depth, and an identity, zero-pad (option A),
projection (B) or ResNet-D average-pool shortcut. A block kind declares its
convolutions (`conv_specs`) and one `register` line in `nets/kinds.py`.
Checkpoints name variables by attribute and optimizer slots by the order of
assignment (preact norm, convs, norms, attention, shortcut): do not reorder.
"""

from __future__ import annotations

from typing import NamedTuple

import keras

from resnet_app.common.errors import ConfigError
from resnet_app.nets import drop_path, kinds
from resnet_app.nets.attention import make_attention
from resnet_app.nets.layers import LayerFactory, Shape, build_layer
from resnet_app.nets.spec import ResNetConfig

TORCH, KERAS = "torch", "keras"  # The layouts of `source_names`.


class ConvSpec(NamedTuple):
    """One convolution of a residual branch."""

    filters: int
    kernel: int
    stride: int
    groups: int = 1


class ZeroPadShortcut(keras.layers.Layer):
    """Option A shortcut: subsample spatially, then zero-pad the new channels.

    The subsample is a 1x1 average pool, equal to `x[:, ::s, ::s]` bit for bit with
    its gradient, and about 3x faster forward and backward than a strided slice.
    """

    def __init__(self, stride: int, extra_channels: int, **kwargs):
        super().__init__(**kwargs)
        self.stride, self.extra_channels = stride, extra_channels

    def call(self, inputs):
        outputs = keras.ops.average_pool(inputs, 1, strides=self.stride, padding="valid")
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


class Unit(keras.layers.Layer):
    """A unit of a stage, as the network makes every kind; `make_layers` makes its layers.

    `first_in_network`: its input is the stem's, already activated;
    `block_index` (its position in the network) keys its random draws.
    """

    preact = False

    def __init__(
        self,
        config: ResNetConfig,
        in_channels: int,
        width: int,
        stride: int,
        first_in_network: bool,
        first_in_stage: bool,
        drop_rate: float = 0.0,
        block_index: int = 0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.in_channels, self.stride = in_channels, stride
        self.drop_rate, self.block_index = drop_rate, block_index
        self.make_layers(config, width, first_in_network, first_in_stage)

    def make_layers(self, config, width, first_in_network, first_in_stage) -> None:
        raise NotImplementedError

    @property
    def convs(self) -> list[keras.layers.Layer]:
        """The branch's convolutions, in order."""
        return [getattr(self, f"conv{number}") for number in range(1, self.num_convs + 1)]

    @property
    def norms(self) -> list[keras.layers.Layer]:
        """v1: the BatchNorm after each convolution; v2: before each but the first."""
        return [
            getattr(self, f"bn{number}") for number in range(1, self.num_convs + 1 - self.preact)
        ]


class ResidualBlock(Unit):
    """A residual unit: its branch (convs, norms, attention, dropout) and its shortcut."""

    def make_layers(self, config, width, first_in_network, first_in_stage) -> None:
        self.dropout_rate = config.dropout
        self.out_channels = width * config.expansion
        self.preact = config.version == "v2"
        self.projection = self.projection_norm = self.pad = self.pool = None
        self.shortcut_kind = config.shortcut
        make, name = LayerFactory(config), self.name
        # v2: bn0 normalizes the input, except in the network's first unit
        # (the stem's output is already activated). The shortcut takes the
        # activated input there, and in a stage's first unit with
        # `activate_before_residual` (He et al. 2016's "both_preact").
        self.preact_norm = None
        if self.preact and not first_in_network:
            self.preact_norm = make.batch_norm(f"{name}_bn0")
        self.shortcut_preactivated = self.preact and (
            first_in_network or (first_in_stage and config.activate_before_residual)
        )
        specs = self.conv_specs(config, self.in_channels, width, self.stride)
        self.num_convs = len(specs)
        for number, spec in enumerate(specs, start=1):
            conv = make.conv(
                spec.filters, spec.kernel, spec.stride, f"{name}_conv{number}", spec.groups
            )
            setattr(self, f"conv{number}", conv)
        for number in range(1, self.num_convs + 1 - self.preact):
            zero = number == self.num_convs and config.zero_init_residual
            setattr(self, f"bn{number}", make.batch_norm(f"{name}_bn{number}", zero_gamma=zero))
        self.attention = make_attention(make, self.out_channels, f"{name}_se")
        self._make_shortcut(make, config.shortcut)

    @classmethod
    def conv_specs(
        cls, config: ResNetConfig, in_channels: int, width: int, stride: int
    ) -> list[ConvSpec]:
        """The branch's convolutions, input to output (a block kind's one definition)."""
        raise NotImplementedError

    def _make_shortcut(self, make: LayerFactory, shortcut: str) -> None:
        """The shortcut's layers, when the unit changes the shape."""
        name, in_channels, out_channels = self.name, self.in_channels, self.out_channels
        if self.stride == 1 and in_channels == out_channels:
            return
        if shortcut in ("projection", "avg_projection"):
            # ResNet-D averages windows of the stride, then projects at stride 1
            # (an odd edge's partial window averages its valid pixels, as
            # torchvision's ceil mode does).
            average = shortcut == "avg_projection" and self.stride > 1
            if average:
                self.pool = keras.layers.AveragePooling2D(
                    self.stride, self.stride, padding="same", name=f"{name}_shortcut_pool"
                )
            stride = 1 if average else self.stride
            self.projection = make.conv(out_channels, 1, stride, f"{name}_shortcut_conv")
            if not self.preact:  # In v2 the input is already normalized.
                self.projection_norm = make.batch_norm(f"{name}_shortcut_bn")
            return
        if out_channels < in_channels:
            raise ConfigError(
                f"{name}: a 'pad' shortcut cannot shrink {in_channels} "
                f"channels to {out_channels}; use shortcut=projection"
            )
        self.pad = ZeroPadShortcut(
            self.stride, out_channels - in_channels, name=f"{name}_shortcut_pad"
        )

    def build(self, input_shape: Shape) -> None:
        build_layer(self.preact_norm, input_shape)
        shape = input_shape
        # Each BatchNorm reads the output of the conv before it (v2's last conv has none).
        for conv, norm in zip(self.convs, [*self.norms, None]):
            shape = build_layer(conv, shape)
            build_layer(norm, shape)
        build_layer(self.attention, shape)
        pooled = input_shape if self.pool is None else self.pool.compute_output_shape(input_shape)
        build_layer(self.projection_norm, build_layer(self.projection, pooled))

    def call(self, inputs, training=None, keys=None):
        relu = keras.ops.relu
        activated = inputs
        if self.preact_norm is not None:
            activated = relu(self.preact_norm(inputs, training=training))
        outputs = activated
        for number, (conv, norm) in enumerate(zip(self.convs, [*self.norms, None]), start=1):
            last = number == self.num_convs
            if last and training and self.dropout_rate and keys is not None:
                # Per element, keyed like stochastic depth (`nets/drop_path.py`).
                outputs = drop_path.dropout(outputs, keys, self.block_index, self.dropout_rate)
            outputs = conv(outputs)
            if norm is not None:
                outputs = norm(outputs, training=training)
            outputs = outputs if last else relu(outputs)
        if self.attention is not None:
            outputs = self.attention(outputs)
        if training and self.drop_rate and keys is not None:  # Stochastic depth.
            outputs = drop_path.drop(outputs, keys, self.block_index, self.drop_rate)
        outputs = outputs + self.shortcut(
            activated if self.shortcut_preactivated else inputs, training
        )
        return outputs if self.preact else relu(outputs)

    def shortcut(self, inputs, training=None):
        """The shortcut's output: identity, zero-padded subsample or (pooled) projection."""
        if self.projection is not None:
            outputs = self.projection(inputs if self.pool is None else self.pool(inputs))
            if self.projection_norm is not None:
                outputs = self.projection_norm(outputs, training=training)
            return outputs
        return inputs if self.pad is None else self.pad(inputs)

    def compute_output_shape(self, input_shape: Shape) -> Shape:
        # "same" padding: a stride-s conv gives ceil(size / s).
        batch, height, width, _ = input_shape
        spatial = [None if size is None else -(-size // self.stride) for size in (height, width)]
        return (batch, *spatial, self.out_channels)

    def source_names(self, layout: str, stage: int, unit: int) -> dict[str, str]:
        """{our layer name: its name in `layout`} for this unit's layers with weights.

        `layout` is TORCH (state-dict modules, e.g. "layer2.0.downsample.1") or
        KERAS (e.g. "conv3_block1_0_conv"); `stage` counts from 1, `unit` from 0.

        Raises:
          ConfigError: for a unit that layout has no names for.
        """
        if self.preact:
            raise ConfigError(
                f"{self.name} is a pre-activation (v2) unit, which no torchvision, timm or "
                "Keras applications ResNet file holds; use a v1 model"
            )
        name, numbers = self.name, range(1, self.num_convs + 1)
        if layout == KERAS:
            if self.attention is not None or self.pool is not None:
                raise ConfigError(
                    f"{name}: Keras applications' ResNets have no attention or average-pool "
                    "shortcut; use a torchvision or timm file"
                )
            base = f"conv{stage + 1}_block{unit + 1}"
            conv, norm = f"{base}_{{}}_conv", f"{base}_{{}}_bn"
            shortcut = (f"{base}_0_conv", f"{base}_0_bn")
        else:
            base = f"layer{stage}.{unit}"
            conv, norm = f"{base}.conv{{}}", f"{base}.bn{{}}"
            # timm's average-pool shortcut keeps the pool at index 0, even as
            # an identity at stride 1, so its conv and norm are 1 and 2.
            first = 1 if self.shortcut_kind == "avg_projection" else 0
            shortcut = (f"{base}.downsample.{first}", f"{base}.downsample.{first + 1}")
        names = {f"{name}_conv{n}": conv.format(n) for n in numbers}
        names.update({f"{name}_bn{n}": norm.format(n) for n in numbers})
        if self.projection is not None:
            names[self.projection.name], names[self.projection_norm.name] = shortcut
        for leaf in ("fc1", "fc2", "conv"):
            layer = getattr(self.attention, leaf, None)
            if layer is not None:
                names[layer.name] = f"{base}.se.{leaf}"
        return names


class BasicBlock(ResidualBlock):
    """Two 3x3 convs, the first carrying the stride."""

    @classmethod
    def conv_specs(cls, config, in_channels, width, stride):
        return [ConvSpec(width, 3, stride), ConvSpec(width * config.expansion, 3, 1)]


class BottleneckBlock(ResidualBlock):
    """1x1 to the inner width, 3x3 (grouped with `groups`), 1x1 to 4x the stage width.

    The stride is on the 3x3 conv (torchvision, Model Garden), or with
    `config.stride_in_1x1` on the first 1x1 (the paper). The inner width is
    `config.inner_width(width)` (ResNeXt's groups; the wide ResNets' double).
    """

    @classmethod
    def conv_specs(cls, config, in_channels, width, stride):
        inner = config.inner_width(width)
        stride_1x1, stride_3x3 = (stride, 1) if config.stride_in_1x1 else (1, stride)
        return [
            ConvSpec(inner, 1, stride_1x1),
            ConvSpec(inner, 3, stride_3x3, config.groups),
            ConvSpec(width * config.expansion, 1, 1),
        ]


def block_class(config: ResNetConfig) -> type[keras.layers.Layer]:
    """The layer class of a config's `block`, as registered in `nets/kinds.py`."""
    return kinds.layer_class(config.block_kind)
