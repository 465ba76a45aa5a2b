"""Channel attention on a residual branch: squeeze-excitation and ECA.

    se   x * sigmoid(fc2(relu(fc1(mean_hw(x)))))      Hu et al. 2018
    eca  x * sigmoid(conv1d_k(mean_hw(x)))             Wang et al. 2020

squeeze-excitation's reduced width is `channels * se_ratio` rounded to a
multiple of `spec.SE_DIVISOR` (timm's `make_divisible`, which every preset's
widths meet exactly); its two 1x1 convolutions are dense layers on the pooled
vector (the same function, the same weights transposed). ECA's kernel size
follows from the channel count: t = int(|log2(C) + 1| / 2), made odd, at
least 3 (5 for 256 to 1024 channels, 7 for 2048). Model code only.

The kinds a config may name are registered in `nets/kinds.py` (no
TensorFlow, so configs are checked before it loads), each naming its layer
class here or in any other module: a new attention is its class and one
`register(AttentionKind(...))` line there. Every block names its attention
layer `<unit>_se`, whatever the kind: timm does the same (a block's `se`
attribute holds SE, ECA or any other), so timm's weight names map one to one
(`pretrained/torch_files.py`), and the runs and weight files saved so far
keep their variable paths (fine-tuning's per-part rates select by path).
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


class SqueezeExcite(keras.layers.Layer):
    """Squeeze-excitation: each channel gated by a function of every channel's mean."""

    def __init__(self, make: LayerFactory, channels: int, **kwargs):
        super().__init__(**kwargs)
        self.reduced = se_width(channels, make.config.se_ratio)
        self.fc1 = make.dense(self.reduced, f"{self.name}_fc1", logits=False)
        self.fc2 = make.dense(channels, f"{self.name}_fc2", logits=False)

    def build(self, input_shape) -> None:
        self.fc1.build((None, input_shape[-1]))
        self.fc2.build((None, self.reduced))

    def call(self, inputs):
        squeezed = keras.ops.mean(inputs, axis=(1, 2))
        gate = keras.ops.sigmoid(self.fc2(keras.ops.relu(self.fc1(squeezed))))
        return inputs * gate[:, None, None, :]

    def compute_output_shape(self, input_shape):
        return input_shape


class EfficientChannelAttention(keras.layers.Layer):
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

    def call(self, inputs):
        squeezed = keras.ops.mean(inputs, axis=(1, 2))[:, :, None]  # [batch, channels, 1]
        gate = keras.ops.sigmoid(self.conv(squeezed))[:, :, 0]
        return inputs * gate[:, None, None, :]

    def compute_output_shape(self, input_shape):
        return input_shape


def make_attention(make: LayerFactory, channels: int, name: str) -> keras.layers.Layer | None:
    """The config's attention layer for a branch of `channels`, or None ("none")."""
    layer = kinds.layer_class(kinds.ATTENTIONS[make.config.attention])
    return None if layer is None else layer(make, channels, name=name)
