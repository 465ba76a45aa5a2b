"""The grouped-conv formulations that lost on CPUs, kept to be measured again.

`resnet_app/nets/grouped_conv.py` holds the formulations production picks
(`native`, `split`, `chunked_auto` and its one-chunk case `block_diagonal`);
here are the others `scripts/grouped_conv_benchmark.py` times beside them
(docs/performance.md, "Grouped convolutions on CPUs"): `native_xla` (what
Keras runs for `Conv2D(groups > 1)`), `chunked` with fixed chunk counts,
`depthwise` and `im2col`. Each is exact (tests/test_grouped_conv.py checks every
one against a NumPy grouped conv and the block-diagonal dense conv's gradients).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import tensorflow as tf

from resnet_app.nets import grouped_conv
from resnet_app.nets.grouped_conv import layout_dims


@functools.cache
def _xla_conv(strides: int, padding: str) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    return tf.function(
        lambda x, kernel: tf.nn.conv2d(x, kernel, strides, padding), jit_compile=True
    )


def native_xla(
    x: tf.Tensor, kernel: tf.Tensor, groups: int, strides: int, padding: str
) -> tf.Tensor:
    """`native` compiled by XLA: what `keras.layers.Conv2D(groups > 1)` runs on TF's CPU.

    Keras 3 compiles every grouped conv with XLA (`jit_compile=True`), because
    without oneDNN TF's CPU kernels have no gradient for grouped convs
    ("Gradients for grouped convolutions are not supported on CPU"). XLA's CPU
    gradients of a grouped conv are the very slow part: two orders of
    magnitude over a dense conv of the same width, oneDNN on or off.
    """
    layout_dims(x, kernel, groups)
    return _xla_conv(strides, padding)(x, kernel)


def depthwise(
    x: tf.Tensor, kernel: tf.Tensor, groups: int, strides: int, padding: str
) -> tf.Tensor:
    """A depthwise conv with channel multiplier out/groups, then a sum over each group's inputs.

    Input channel g * C/g + i gets the out/groups filters kernel[:, :, i, g-th
    block] (rearranged in-graph: a reshape and a transpose of the kernel); the
    depthwise output [N, H, W, C * out/groups] is reshaped to [..., groups,
    C/groups, out/groups] and summed over C/groups. The grouped conv's FLOPs,
    but an intermediate C/groups times the output (4-32x here), written,
    read and, in the gradient, broadcast back. Measured: 2.2x ResNet-50's 3x3
    convs over the network, oneDNN on or off; in emulated bfloat16 fast at
    stride 1 and 4-8 channels per group, but with the largest rounding error
    of the kernel gradient (8.9e-2 relative, against <= 6.3e-2).
    """
    kh, kw, channels, group_in, out, group_out = layout_dims(x, kernel, groups)
    filters = tf.reshape(kernel, [kh, kw, group_in, groups, group_out])
    filters = tf.reshape(tf.transpose(filters, [0, 1, 3, 2, 4]), [kh, kw, channels, group_out])
    y = tf.nn.depthwise_conv2d(x, filters, [1, strides, strides, 1], padding)
    shape = tf.shape(y)
    y = tf.reshape(y, [shape[0], shape[1], shape[2], groups, group_in, group_out])
    return tf.reshape(tf.reduce_sum(y, axis=4), [shape[0], shape[1], shape[2], out])


def _same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TF's "SAME" padding of one spatial dimension: (before, after), the extra one after."""
    total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def _shifted_slices(x: tf.Tensor, kh: int, kw: int, strides: int, padding: str) -> list[tf.Tensor]:
    """The kh * kw strided windows of x ([..., H, W, C]) that a VALID/SAME conv multiplies."""
    height, width = int(x.shape[-3]), int(x.shape[-2])
    if padding == "SAME":
        top, bottom = _same_padding(height, kh, strides)
        left, right = _same_padding(width, kw, strides)
        if top or bottom or left or right:
            pads = [[0, 0]] * (x.shape.rank - 3) + [[top, bottom], [left, right], [0, 0]]
            x = tf.pad(x, pads)
        height, width = height + top + bottom, width + left + right
    elif padding != "VALID":
        raise ValueError(f"padding must be SAME or VALID, not {padding!r}")
    out_h, out_w = (height - kh) // strides + 1, (width - kw) // strides + 1
    return [
        x[
            ...,
            a : a + (out_h - 1) * strides + 1 : strides,
            b : b + (out_w - 1) * strides + 1 : strides,
            :,
        ]
        for a in range(kh)
        for b in range(kw)
    ]


def im2col(x: tf.Tensor, kernel: tf.Tensor, groups: int, strides: int, padding: str) -> tf.Tensor:
    """Patches from kh * kw shifted slices, then one batched matmul over the groups.

    x is transposed once to [groups, N, H, W, C/groups]; its kh * kw shifted
    (strided) slices are stacked into patches [groups, N * Ho * Wo, kh * kw *
    C/groups] and multiplied by the kernel rearranged to [groups, kh * kw *
    C/groups, out/groups] (`tf.linalg.matmul`, batched over groups); the
    output [groups, N * Ho * Wo, out/groups] is transposed back. The grouped
    conv's FLOPs, as `groups` matmuls of depth 36-288; a patch tensor kh * kw
    times the input, and its gradient a sum of kh * kw padded slices.
    Measured: 3.9x ResNet-50's 3x3 convs over the network, oneDNN on or off.
    """
    kh, kw, channels, group_in, out, group_out = layout_dims(x, kernel, groups)
    shape = tf.shape(x)
    grouped = tf.reshape(x, [shape[0], shape[1], shape[2], groups, group_in])
    grouped = tf.ensure_shape(
        tf.transpose(grouped, [3, 0, 1, 2, 4]), [groups, None, x.shape[1], x.shape[2], group_in]
    )
    patches = tf.stack(_shifted_slices(grouped, kh, kw, strides, padding), axis=-2)
    out_shape = tf.shape(patches)  # [groups, N, Ho, Wo, kh * kw, C/groups]
    patches = tf.reshape(patches, [groups, -1, kh * kw * group_in])
    filters = tf.reshape(kernel, [kh * kw * group_in, groups, group_out])
    y = tf.linalg.matmul(patches, tf.transpose(filters, [1, 0, 2]))
    y = tf.reshape(y, [groups, out_shape[1], out_shape[2], out_shape[3], group_out])
    y = tf.transpose(y, [1, 2, 3, 0, 4])
    return tf.reshape(y, [out_shape[1], out_shape[2], out_shape[3], out])


# Every formulation: production's and these.
FORMULATIONS: dict[str, grouped_conv.GroupedConv] = {
    **grouped_conv.FORMULATIONS,
    "native_xla": native_xla,
    "chunked2": functools.partial(grouped_conv.chunked, chunks=2),
    "chunked4": functools.partial(grouped_conv.chunked, chunks=4),
    "chunked8": functools.partial(grouped_conv.chunked, chunks=8),
    "chunked16": functools.partial(grouped_conv.chunked, chunks=16),
    "depthwise": depthwise,
    "im2col": im2col,
}
