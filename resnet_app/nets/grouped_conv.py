"""Exact formulations of a grouped 2-D convolution, for CPUs where TF's own is slow.

MEASURED_TABLE_PLACEHOLDER
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import tensorflow as tf

GroupedConv = Callable[[tf.Tensor, tf.Tensor, int, int, str], tf.Tensor]


def _dims(x: tf.Tensor, kernel: tf.Tensor, groups: int) -> tuple[int, int, int, int, int, int]:
    """(kh, kw, C, C/groups, out, out/groups), checked against the grouped layout."""
    kh, kw, group_in, out = (int(d) for d in kernel.shape)
    channels = int(x.shape[-1])
    if groups < 1 or channels != group_in * groups or out % groups:
        raise ValueError(
            f"grouped conv: input channels {channels}, kernel {tuple(kernel.shape)} "
            f"and groups {groups} do not fit [kh, kw, C/groups, out] with out % groups == 0"
        )
    return kh, kw, channels, group_in, out, out // groups


def _same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TF's "SAME" padding of one spatial dimension: (before, after), the extra one after."""
    total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def native(x: tf.Tensor, kernel: tf.Tensor, groups: int, strides: int, padding: str) -> tf.Tensor:
    """`tf.nn.conv2d` on the grouped kernel: what `keras.layers.Conv2D(groups=...)` runs.

    TF infers the groups from C / kernel.shape[2]. One op; its forward pass is
    about 2x a dense conv of the same width, but on CPU (oneDNN or Eigen) its
    two gradients (Conv2DBackpropInput / Conv2DBackpropFilter with groups) take
    one to two orders of magnitude longer than the whole dense conv's step:
    this is the baseline the others are measured against.
    """
    _dims(x, kernel, groups)
    return tf.nn.conv2d(x, kernel, strides, padding)


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
    _dims(x, kernel, groups)
    return _xla_conv(strides, padding)(x, kernel)


def split(x: tf.Tensor, kernel: tf.Tensor, groups: int, strides: int, padding: str) -> tf.Tensor:
    """One dense conv per group: split input and kernel, `groups` convs, concat.

    The same FLOPs as the grouped conv, `groups` small convs (C/groups input,
    out/groups output channels each: 4-32 at ResNeXt-50 32x4d) whose kernels run
    far below a large conv's efficiency, plus a split and a concat of the
    activations (and their gradients: a concat and a split) per step.
    """
    _dims(x, kernel, groups)
    inputs = tf.split(x, groups, axis=-1)
    kernels = tf.split(kernel, groups, axis=-1)
    return tf.concat(
        [tf.nn.conv2d(xi, ki, strides, padding) for xi, ki in zip(inputs, kernels)], axis=-1
    )


def block_diagonal_kernel(kernel: tf.Tensor, groups: int) -> tf.Tensor:
    """The dense [kh, kw, C, out] kernel equal to the grouped one: zero off the diagonal blocks.

    dense[a, b, h * C/g + i, g' * out/g + j] = kernel[a, b, i, g' * out/g + j]
    if h == g' else 0. Built by a broadcast multiply with the identity, so it is
    differentiable: its gradient with respect to `kernel` is the diagonal blocks
    of the dense gradient, summed with exact zeros. kh * kw * C * out elements.
    """
    kh, kw, group_in, out = (int(d) for d in kernel.shape)
    blocks = tf.reshape(kernel, [kh, kw, 1, group_in, groups, out // groups])
    eye = tf.reshape(tf.eye(groups, dtype=kernel.dtype), [1, 1, groups, 1, groups, 1])
    return tf.reshape(blocks * eye, [kh, kw, groups * group_in, out])


def block_diagonal(
    x: tf.Tensor, kernel: tf.Tensor, groups: int, strides: int, padding: str
) -> tf.Tensor:
    """One dense conv with `block_diagonal_kernel(kernel, groups)`.

    Exact (the extra terms are products with exact zeros), one large conv whose
    forward and both gradients are the fast dense kernels, at `groups` times
    the grouped conv's FLOPs: for ResNeXt-50 32x4d, whose grouped convs are
    twice ResNet-50's 3x3 width, 4x the FLOPs of ResNet-50's 3x3 conv. Plus
    building the dense kernel and reducing its gradient (small next to the conv).
    """
    _dims(x, kernel, groups)
    return tf.nn.conv2d(x, block_diagonal_kernel(kernel, groups), strides, padding)


def chunked(
    x: tf.Tensor, kernel: tf.Tensor, groups: int, strides: int, padding: str, chunks: int = 4
) -> tf.Tensor:
    """`block_diagonal` on `chunks` channel slices: `chunks` dense convs of width C/chunks.

    Each chunk holds groups/chunks whole groups; its block-diagonal conv costs
    1/chunks of the full block-diagonal one, so the FLOPs are groups/chunks
    times the grouped conv's (chunks == groups is `split`, chunks == 1
    `block_diagonal`), for `chunks` convs plus a split and a concat.
    """
    _dims(x, kernel, groups)
    if groups % chunks:
        raise ValueError(f"chunked: {chunks} chunks do not divide {groups} groups")
    if chunks == 1:
        return block_diagonal(x, kernel, groups, strides, padding)
    inputs = tf.split(x, chunks, axis=-1)
    kernels = tf.split(kernel, chunks, axis=-1)
    per_chunk = groups // chunks
    return tf.concat(
        [
            tf.nn.conv2d(xi, block_diagonal_kernel(ki, per_chunk), strides, padding)
            for xi, ki in zip(inputs, kernels)
        ],
        axis=-1,
    )


def depthwise(
    x: tf.Tensor, kernel: tf.Tensor, groups: int, strides: int, padding: str
) -> tf.Tensor:
    """A depthwise conv with channel multiplier out/groups, then a sum over each group's inputs.

    Input channel g * C/g + i gets the out/groups filters kernel[:, :, i, g-th
    block] (rearranged in-graph: a reshape and a transpose of the kernel); the
    depthwise output [N, H, W, C * out/groups] is reshaped to [..., groups,
    C/groups, out/groups] and summed over C/groups. The grouped conv's FLOPs,
    but an intermediate C/groups times the output (4-32x here), written,
    read and, in the gradient, broadcast back.
    """
    kh, kw, channels, group_in, out, group_out = _dims(x, kernel, groups)
    filters = tf.reshape(kernel, [kh, kw, group_in, groups, group_out])
    filters = tf.reshape(tf.transpose(filters, [0, 1, 3, 2, 4]), [kh, kw, channels, group_out])
    y = tf.nn.depthwise_conv2d(x, filters, [1, strides, strides, 1], padding)
    shape = tf.shape(y)
    y = tf.reshape(y, [shape[0], shape[1], shape[2], groups, group_in, group_out])
    return tf.reshape(tf.reduce_sum(y, axis=4), [shape[0], shape[1], shape[2], out])


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
    """
    kh, kw, channels, group_in, out, group_out = _dims(x, kernel, groups)
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


FORMULATIONS: dict[str, GroupedConv] = {
    "native": native,
    "native_xla": native_xla,
    "split": split,
    "block_diagonal": block_diagonal,
    "chunked2": functools.partial(chunked, chunks=2),
    "chunked4": functools.partial(chunked, chunks=4),
    "chunked8": functools.partial(chunked, chunks=8),
    "chunked16": functools.partial(chunked, chunks=16),
    "depthwise": depthwise,
    "im2col": im2col,
}
