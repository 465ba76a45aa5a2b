"""Channel attention on a residual branch: squeeze-excitation and ECA.

    se   x * sigmoid(fc2(relu(fc1(mean_hw(x)))))      Hu et al. 2018
    eca  x * sigmoid(conv1d_k(mean_hw(x)))             Wang et al. 2020

SE's 1x1 convolutions are dense layers on the pooled vector. Every block names
its attention layer `<unit>_se` whatever the kind, as timm does, so timm's
weight names map one to one.
"""

from __future__ import annotations

import math

import keras

from resnet_app.nets import kinds
from resnet_app.nets.layers import LayerFactory, l2_penalty
from resnet_app.nets.spec import SE_DIVISOR


def se_width(channels: int, ratio: float, divisor: int = SE_DIVISOR) -> int:
    """Squeeze-excitation's reduced width: channels * ratio to the nearest multiple of divisor."""
    return max(divisor, int(channels * ratio + divisor / 2) // divisor * divisor)


def eca_kernel_size(channels: int) -> int:
    """ECA's 1-D kernel size for `channels` (Wang et al. 2020, gamma 2, b 1)."""
    t = int(abs(math.log2(channels) + 1) / 2)
    return max(t if t % 2 else t + 1, 3)


class _ChannelGate(keras.layers.Layer):
    """Each channel scaled by sigmoid(`gate` of every channel's mean)."""

    def call(self, inputs):
        gate = keras.ops.sigmoid(self.gate(keras.ops.mean(inputs, axis=(1, 2))))
        return inputs * gate[:, None, None, :]

    def compute_output_shape(self, input_shape):
        return input_shape


class SqueezeExcite(_ChannelGate):
    """Squeeze-excitation: each channel gated by a function of every channel's mean."""

    def __init__(self, make: LayerFactory, channels: int, **kwargs):
        super().__init__(**kwargs)
        self.reduced = se_width(channels, make.config.se_ratio)
        self.fc1 = make.dense(self.reduced, f"{self.name}_fc1", logits=False)
        self.fc2 = make.dense(channels, f"{self.name}_fc2", logits=False)

    def build(self, input_shape) -> None:
        self.fc1.build((None, input_shape[-1]))
        self.fc2.build((None, self.reduced))

    def gate(self, squeezed):
        return self.fc2(keras.ops.relu(self.fc1(squeezed)))


class EfficientChannelAttention(_ChannelGate):
    """ECA: each channel gated by a 1-D convolution over its neighbours' means."""

    def __init__(self, make: LayerFactory, channels: int, **kwargs):
        super().__init__(**kwargs)
        self.conv = keras.layers.Conv1D(
            1,
            eca_kernel_size(channels),
            padding="same",  # Odd kernel: (k - 1) / 2 on each side.
            use_bias=False,
            kernel_regularizer=l2_penalty(make.config.weight_decay),
            name=f"{self.name}_conv",
        )

    def build(self, input_shape) -> None:
        self.conv.build((None, input_shape[-1], 1))

    def gate(self, squeezed):
        return self.conv(squeezed[:, :, None])[:, :, 0]  # Channels as the 1-D axis.


def make_attention(make: LayerFactory, channels: int, name: str) -> keras.layers.Layer | None:
    """The config's attention layer for a branch of `channels`, or None ("none")."""
    layer = kinds.layer_class(kinds.ATTENTIONS[make.config.attention])
    return None if layer is None else layer(make, channels, name=name)
