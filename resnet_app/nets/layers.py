"""The layers a ResNet is made of, made from one config.

`LayerFactory` makes every convolution, BatchNorm and dense layer of a
network, so that a setting is read in one place. `SymmetricConv2D` and
`SymmetricMaxPool` pad as torchvision does; `GroupedConv2D` computes a
grouped convolution as is fast on its device (`nets/grouped_conv.py`).
"""

from __future__ import annotations

import keras

from resnet_app.nets import grouped_conv
from resnet_app.nets.batch_norm import BatchNorm
from resnet_app.nets.spec import ResNetConfig

Shape = tuple[int | None, ...]


def l2_penalty(weight_decay: float) -> keras.regularizers.Regularizer | None:
    # keras L2(c) is c * sum(w**2); TF1's tf.nn.l2_loss is sum(w**2) / 2.
    return keras.regularizers.L2(weight_decay / 2) if weight_decay else None


class LayerFactory:
    """Makes the layers of a network from one config, with consistent settings."""

    def __init__(self, config: ResNetConfig):
        self.config = config

    def conv(
        self, filters: int, kernel: int, stride: int, name: str, groups: int = 1
    ) -> keras.layers.Layer:
        """A bias-free convolution with He initialization and the L2 penalty.

        Padded "same", or with `config.padding == "symmetric"` and a stride,
        `kernel // 2` on every side (at stride 1 the two are the same).
        """
        symmetric = self.config.padding == "symmetric" and stride > 1 and kernel > 1
        classes = {
            (False, False): keras.layers.Conv2D,
            (True, False): SymmetricConv2D,
            (False, True): GroupedConv2D,
            (True, True): SymmetricGroupedConv2D,
        }
        return classes[(symmetric, groups > 1)](
            filters,
            kernel,
            strides=stride,
            padding="valid" if symmetric else "same",
            groups=groups,
            use_bias=False,
            # He et al. 2015 initialization, as in torchvision and the seed.
            kernel_initializer=keras.initializers.VarianceScaling(
                2.0, mode="fan_out", distribution="untruncated_normal"
            ),
            kernel_regularizer=l2_penalty(self.config.weight_decay),
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

    def dense(
        self, units: int, name: str, logits: bool = True, bias: bool = True
    ) -> keras.layers.Layer:
        """An L2-penalized dense layer; the logits (the default) stay float32 under
        mixed precision, other dense layers (attention's) compute in the policy's dtype."""
        return keras.layers.Dense(
            units,
            use_bias=bias,
            kernel_regularizer=l2_penalty(self.config.weight_decay),
            dtype="float32" if logits else None,
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

    torchvision's and Caffe's strided convolutions; the output size and the
    variables are those of a "same" `Conv2D`.
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
    """Creates `layer`'s variables for `input_shape`; its output shape (None for no layer)."""
    if layer is None:
        return None
    layer.build(tuple(input_shape))
    return tuple(layer.compute_output_shape(tuple(input_shape)))


@keras.saving.register_keras_serializable(package="resnet_app")
class GroupedConv2D(keras.layers.Conv2D):
    """A grouped convolution, computed as is fastest on its device (`grouped_conv.convolve`).

    The kernel keeps Keras's grouped layout, so checkpoints do not depend on the formulation.
    """

    def convolution_op(self, inputs, kernel):
        return grouped_conv.convolve(
            inputs, kernel, self.groups, self.strides[0], self.padding.upper()
        )


@keras.saving.register_keras_serializable(package="resnet_app")
class SymmetricGroupedConv2D(SymmetricConv2D, GroupedConv2D):
    """A `GroupedConv2D` of the input zero-padded by kernel // 2 on every side."""
