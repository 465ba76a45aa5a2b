"""The residual blocks of a ResNet: basic and bottleneck, post- and pre-activation.

    BasicBlock             v1  relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
    BottleneckBlock        v1  the same with 1x1, 3x3, 1x1 convs; output 4x wider
    PreActBasicBlock       v2  conv2(relu(bn1(conv1(a)))) + shortcut(a or x),
                               a = relu(bn0(x))
    PreActBottleneckBlock  v2  the same with 1x1, 3x3, 1x1 convs; output 4x wider

(He et al. 2015, "Deep Residual Learning"; He et al. 2016, "Identity Mappings".)
`block_class(config)` picks a class from the config's `block` and `version`.
Each class lists its layers explicitly and adds its residual in one visible
line of `call`, where variants (stochastic depth, ...) plug in. What every
class shares lives in `ResidualBlock`: the shortcut (identity, option A zero
padding, option B projection) and the output shape.

Checkpoints name variables by the attribute that holds each layer (`conv1`,
`bn1`, `preact_norm`, `projection`, `projection_norm`), and optimizer slots by
the position of the variable in `model.trainable_variables`, which is the
order in which the layers were assigned. So every block assigns its convs,
then its BatchNorms, then its shortcut, exactly as the single `ResidualUnit`
that preceded these classes did: do not reorder the assignments.
"""

from __future__ import annotations

from typing import ClassVar

import keras

from resnet_app.common.errors import ConfigError
from resnet_app.nets import drop_path
from resnet_app.nets.batch_norm import BatchNorm
from resnet_app.nets.presets import ResNetConfig

Shape = tuple[int | None, ...]


def _l2(weight_decay: float) -> keras.regularizers.Regularizer | None:
    # keras L2(c) is c * sum(w**2); TF1's tf.nn.l2_loss is sum(w**2) / 2.
    return keras.regularizers.L2(weight_decay / 2) if weight_decay else None


class LayerFactory:
    """Makes the layers of a network from one config, with consistent settings."""

    def __init__(self, config: ResNetConfig):
        self.config = config

    def conv(self, filters: int, kernel: int, stride: int, name: str) -> keras.layers.Layer:
        """A bias-free convolution with He initialization and the L2 penalty.

        Padded "same", or with `config.padding == "symmetric"` and a stride,
        `kernel // 2` on every side (at stride 1 the two are the same).
        """
        symmetric = self.config.padding == "symmetric" and stride > 1 and kernel > 1
        return (SymmetricConv2D if symmetric else keras.layers.Conv2D)(
            filters,
            kernel,
            strides=stride,
            padding="valid" if symmetric else "same",
            use_bias=False,
            # He et al. 2015 initialization, as in torchvision and the seed.
            kernel_initializer=keras.initializers.VarianceScaling(
                2.0, mode="fan_out", distribution="untruncated_normal"
            ),
            kernel_regularizer=_l2(self.config.weight_decay),
            name=name,
        )

    def max_pool(self, name: str) -> keras.layers.Layer:
        """The stem's 3x3, stride-2 max-pool, padded as `config.padding` says."""
        if self.config.padding == "symmetric":
            return SymmetricMaxPool(name=name)
        return keras.layers.MaxPooling2D(3, strides=2, padding="same", name=name)

    def batch_norm(self, name: str, zero_gamma: bool = False) -> keras.layers.Layer:
        """A BatchNorm with the config's momentum, epsilon and synchronization."""
        return BatchNorm(
            momentum=self.config.bn_momentum,
            epsilon=self.config.bn_epsilon,
            synchronized=self.config.bn_synchronized,
            gamma_initializer="zeros" if zero_gamma else "ones",
            name=name,
        )

    def dense(self, units: int, name: str) -> keras.layers.Layer:
        """The logits layer: float32 under any mixed-precision policy, L2-penalized."""
        return keras.layers.Dense(
            units,
            kernel_regularizer=_l2(self.config.weight_decay),
            dtype="float32",
            name=name,
        )


def _pad_symmetric(inputs, amount: int, value: float = 0.0):
    pad = [[0, 0], [amount, amount], [amount, amount], [0, 0]]
    return keras.ops.pad(inputs, pad, constant_values=value)


def _padded_shape(input_shape: Shape, amount: int) -> Shape:
    batch, height, width, channels = input_shape
    spatial = [None if size is None else size + 2 * amount for size in (height, width)]
    return (batch, *spatial, channels)


@keras.saving.register_keras_serializable(package="resnet_app")
class SymmetricConv2D(keras.layers.Conv2D):
    """A "valid" convolution of the input zero-padded by kernel // 2 on every side.

    The padding of torchvision's and Caffe's strided convolutions; its output
    size is that of "same" padding (for odd kernels), and its variables are a
    `Conv2D`'s, so checkpoints do not tell the two apart.
    """

    @property
    def amount(self) -> int:
        return self.kernel_size[0] // 2

    def call(self, inputs):
        return super().call(_pad_symmetric(inputs, self.amount))

    def compute_output_shape(self, input_shape: Shape) -> Shape:
        return super().compute_output_shape(_padded_shape(input_shape, self.amount))


@keras.saving.register_keras_serializable(package="resnet_app")
class SymmetricMaxPool(keras.layers.Layer):
    """A 3x3, stride-2 max-pool of the input padded by one -inf on every side."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.pool = keras.layers.MaxPooling2D(3, strides=2, padding="valid")

    def call(self, inputs):
        return self.pool(_pad_symmetric(inputs, 1, float("-inf")))

    def compute_output_shape(self, input_shape: Shape) -> Shape:
        return self.pool.compute_output_shape(_padded_shape(input_shape, 1))


def build_layer(layer: keras.layers.Layer | None, input_shape: Shape) -> Shape | None:
    """Creates `layer`'s variables for `input_shape`.

    Args:
      layer: a layer, or None (nothing to build).
      input_shape: its input shape.

    Returns:
      Its output shape (None for no layer).
    """
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


class ResidualBlock(keras.layers.Layer):
    """What every block shares: its shortcut and its output shape.

    Subclasses make their branch's layers, then call `_make_shortcut`; `call`
    adds `self.shortcut(...)` to the branch.

    Args:
      config: the network's config.
      in_channels: channels of the block's input.
      width: the stage width; the block outputs `width * expansion` channels.
      stride: the stride of the block (of its first unit's downsampling conv).
      first_in_network: the network's first block (its input is the stem's
        output, already normalized and activated).
      first_in_stage: the first block of its stage.
    """

    expansion: ClassVar[int] = 1

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
        del first_in_network, first_in_stage  # Used by the pre-activation blocks.
        self.drop_rate = drop_rate
        self.block_index = block_index
        self.in_channels = in_channels
        self.stride = stride
        self.out_channels = width * self.expansion
        self.projection = self.projection_norm = self.pad = None

    def _make_shortcut(self, make: LayerFactory, shortcut: str, normalized: bool) -> None:
        """Makes the layers of the shortcut, if the block changes the shape.

        Args:
          make: the network's layer factory.
          shortcut: "projection" (option B: a 1x1 conv) or "pad" (option A).
          normalized: a BatchNorm follows the projection (v1).

        Raises:
          ConfigError: a "pad" shortcut would have to drop channels.
        """
        name, in_channels, out_channels = self.name, self.in_channels, self.out_channels
        if self.stride == 1 and in_channels == out_channels:
            return
        if shortcut == "projection":
            self.projection = make.conv(out_channels, 1, self.stride, f"{name}_shortcut_conv")
            if normalized:
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

    def _build_shortcut(self, input_shape: Shape) -> None:
        build_layer(self.projection_norm, build_layer(self.projection, input_shape))

    def drop_path(self, branch, training=None, keys=None):
        """Stochastic depth: the branch, dropped per example in training (`nets/drop_path.py`).

        Only with a drop rate, in training and with the step's example keys;
        otherwise the branch itself (its expected value).
        """
        if not (training and self.drop_rate and keys is not None):
            return branch
        return drop_path.drop(branch, keys, self.block_index, self.drop_rate)

    def shortcut(self, inputs, training=None):
        """The shortcut's output: identity, zero-padded subsample or projection."""
        if self.projection is not None:
            outputs = self.projection(inputs)
            if self.projection_norm is not None:
                outputs = self.projection_norm(outputs, training=training)
            return outputs
        if self.pad is not None:
            return self.pad(inputs)
        return inputs

    def compute_output_shape(self, input_shape: Shape) -> Shape:
        # "same" padding: a stride-s conv gives ceil(size / s).
        batch, height, width, _ = input_shape
        spatial = [None if size is None else -(-size // self.stride) for size in (height, width)]
        return (batch, *spatial, self.out_channels)


class BasicBlock(ResidualBlock):
    """v1 basic block: two 3x3 convs, each followed by BN; ReLU after the add."""

    expansion = 1

    def __init__(self, config: ResNetConfig, in_channels: int, width: int, stride: int, **kwargs):
        super().__init__(config, in_channels, width, stride, **kwargs)
        make, name = LayerFactory(config), self.name
        self.conv1 = make.conv(width, 3, stride, f"{name}_conv1")
        self.conv2 = make.conv(self.out_channels, 3, 1, f"{name}_conv2")
        self.bn1 = make.batch_norm(f"{name}_bn1")
        self.bn2 = make.batch_norm(f"{name}_bn2", zero_gamma=config.zero_init_residual)
        self._make_shortcut(make, config.shortcut, normalized=True)

    @property
    def convs(self) -> list[keras.layers.Layer]:
        """The branch's convolutions, in order."""
        return [self.conv1, self.conv2]

    @property
    def norms(self) -> list[keras.layers.Layer]:
        """The BatchNorm after each convolution."""
        return [self.bn1, self.bn2]

    def build(self, input_shape: Shape) -> None:
        shape = build_layer(self.conv1, input_shape)
        build_layer(self.bn1, shape)
        build_layer(self.bn2, build_layer(self.conv2, shape))
        self._build_shortcut(input_shape)

    def call(self, inputs, training=None, keys=None):
        outputs = keras.ops.relu(self.bn1(self.conv1(inputs), training=training))
        outputs = self.bn2(self.conv2(outputs), training=training)
        outputs = self.drop_path(outputs, training, keys)
        return keras.ops.relu(outputs + self.shortcut(inputs, training))


class BottleneckBlock(ResidualBlock):
    """v1 bottleneck block: 1x1, 3x3, 1x1 convs, each followed by BN; ReLU after the add.

    The stride sits on the 3x3 conv (torchvision, TF Model Garden), or on the
    first 1x1 conv with `config.stride_in_1x1` (the original paper).
    """

    expansion = 4

    def __init__(self, config: ResNetConfig, in_channels: int, width: int, stride: int, **kwargs):
        super().__init__(config, in_channels, width, stride, **kwargs)
        make, name = LayerFactory(config), self.name
        stride_1x1, stride_3x3 = (stride, 1) if config.stride_in_1x1 else (1, stride)
        self.conv1 = make.conv(width, 1, stride_1x1, f"{name}_conv1")
        self.conv2 = make.conv(width, 3, stride_3x3, f"{name}_conv2")
        self.conv3 = make.conv(self.out_channels, 1, 1, f"{name}_conv3")
        self.bn1 = make.batch_norm(f"{name}_bn1")
        self.bn2 = make.batch_norm(f"{name}_bn2")
        self.bn3 = make.batch_norm(f"{name}_bn3", zero_gamma=config.zero_init_residual)
        self._make_shortcut(make, config.shortcut, normalized=True)

    @property
    def convs(self) -> list[keras.layers.Layer]:
        """The branch's convolutions, in order."""
        return [self.conv1, self.conv2, self.conv3]

    @property
    def norms(self) -> list[keras.layers.Layer]:
        """The BatchNorm after each convolution."""
        return [self.bn1, self.bn2, self.bn3]

    def build(self, input_shape: Shape) -> None:
        shape = build_layer(self.conv1, input_shape)
        build_layer(self.bn1, shape)
        shape = build_layer(self.conv2, shape)
        build_layer(self.bn2, shape)
        build_layer(self.bn3, build_layer(self.conv3, shape))
        self._build_shortcut(input_shape)

    def call(self, inputs, training=None, keys=None):
        relu = keras.ops.relu
        outputs = relu(self.bn1(self.conv1(inputs), training=training))
        outputs = relu(self.bn2(self.conv2(outputs), training=training))
        outputs = self.bn3(self.conv3(outputs), training=training)
        outputs = self.drop_path(outputs, training, keys)
        return relu(outputs + self.shortcut(inputs, training))


class _PreActBlock(ResidualBlock):
    """The pre-activation shared by the v2 blocks: bn0-ReLU of the input.

    bn0 (`preact_norm`) normalizes the block's input, except in the network's
    very first block, whose input (the stem output) is already normalized and
    activated. The shortcut takes the activated input in the first block, and
    in a stage's first block if `activate_before_residual` (He et al. 2016,
    "both_preact"); otherwise the raw input.
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
        super().__init__(
            config, in_channels, width, stride, first_in_network, first_in_stage, **kwargs
        )
        self.preact_norm = None
        if not first_in_network:
            self.preact_norm = LayerFactory(config).batch_norm(f"{self.name}_bn0")
        self.shortcut_preactivated = first_in_network or (
            first_in_stage and config.activate_before_residual
        )

    def preactivate(self, inputs, training=None):
        """relu(bn0(inputs)), or the inputs themselves in the network's first block."""
        if self.preact_norm is None:
            return inputs
        return keras.ops.relu(self.preact_norm(inputs, training=training))

    def shortcut_input(self, inputs, activated):
        """What the shortcut reads: the activated or the raw input."""
        return activated if self.shortcut_preactivated else inputs


class PreActBasicBlock(_PreActBlock):
    """v2 basic block: BN-ReLU before each of two 3x3 convs; nothing after the add."""

    expansion = 1

    def __init__(self, config: ResNetConfig, in_channels: int, width: int, stride: int, **kwargs):
        super().__init__(config, in_channels, width, stride, **kwargs)
        make, name = LayerFactory(config), self.name
        self.conv1 = make.conv(width, 3, stride, f"{name}_conv1")
        self.conv2 = make.conv(self.out_channels, 3, 1, f"{name}_conv2")
        self.bn1 = make.batch_norm(f"{name}_bn1")
        self._make_shortcut(make, config.shortcut, normalized=False)

    @property
    def convs(self) -> list[keras.layers.Layer]:
        """The branch's convolutions, in order."""
        return [self.conv1, self.conv2]

    @property
    def norms(self) -> list[keras.layers.Layer]:
        """The BatchNorm before each convolution but the first (see `preact_norm`)."""
        return [self.bn1]

    def build(self, input_shape: Shape) -> None:
        build_layer(self.preact_norm, input_shape)
        shape = build_layer(self.conv1, input_shape)
        build_layer(self.bn1, shape)
        build_layer(self.conv2, shape)
        self._build_shortcut(input_shape)

    def call(self, inputs, training=None, keys=None):
        activated = self.preactivate(inputs, training)
        outputs = self.conv1(activated)
        outputs = self.conv2(keras.ops.relu(self.bn1(outputs, training=training)))
        outputs = self.drop_path(outputs, training, keys)
        return outputs + self.shortcut(self.shortcut_input(inputs, activated), training)


class PreActBottleneckBlock(_PreActBlock):
    """v2 bottleneck block: BN-ReLU before each of 1x1, 3x3, 1x1 convs; nothing after the add."""

    expansion = 4

    def __init__(self, config: ResNetConfig, in_channels: int, width: int, stride: int, **kwargs):
        super().__init__(config, in_channels, width, stride, **kwargs)
        make, name = LayerFactory(config), self.name
        stride_1x1, stride_3x3 = (stride, 1) if config.stride_in_1x1 else (1, stride)
        self.conv1 = make.conv(width, 1, stride_1x1, f"{name}_conv1")
        self.conv2 = make.conv(width, 3, stride_3x3, f"{name}_conv2")
        self.conv3 = make.conv(self.out_channels, 1, 1, f"{name}_conv3")
        self.bn1 = make.batch_norm(f"{name}_bn1")
        self.bn2 = make.batch_norm(f"{name}_bn2")
        self._make_shortcut(make, config.shortcut, normalized=False)

    @property
    def convs(self) -> list[keras.layers.Layer]:
        """The branch's convolutions, in order."""
        return [self.conv1, self.conv2, self.conv3]

    @property
    def norms(self) -> list[keras.layers.Layer]:
        """The BatchNorm before each convolution but the first (see `preact_norm`)."""
        return [self.bn1, self.bn2]

    def build(self, input_shape: Shape) -> None:
        build_layer(self.preact_norm, input_shape)
        shape = build_layer(self.conv1, input_shape)
        build_layer(self.bn1, shape)
        shape = build_layer(self.conv2, shape)
        build_layer(self.bn2, shape)
        build_layer(self.conv3, shape)
        self._build_shortcut(input_shape)

    def call(self, inputs, training=None, keys=None):
        relu = keras.ops.relu
        activated = self.preactivate(inputs, training)
        outputs = self.conv1(activated)
        outputs = self.conv2(relu(self.bn1(outputs, training=training)))
        outputs = self.conv3(relu(self.bn2(outputs, training=training)))
        outputs = self.drop_path(outputs, training, keys)
        return outputs + self.shortcut(self.shortcut_input(inputs, activated), training)


BLOCK_CLASSES: dict[tuple[str, str], type[ResidualBlock]] = {
    ("basic", "v1"): BasicBlock,
    ("bottleneck", "v1"): BottleneckBlock,
    ("basic", "v2"): PreActBasicBlock,
    ("bottleneck", "v2"): PreActBottleneckBlock,
}


def block_class(config: ResNetConfig) -> type[ResidualBlock]:
    """The block class of a config's `block` ("basic", "bottleneck") and `version` ("v1", "v2").

    Args:
      config: a validated config.

    Returns:
      One of the four `ResidualBlock` subclasses.
    """
    return BLOCK_CLASSES[(config.block, config.version)]
