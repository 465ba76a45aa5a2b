"""Exact formulations of a grouped 2-D convolution, for CPUs where TF's own is slow.

Every formulation here is `fn(x, kernel, groups, strides, padding) -> y`: x NHWC
(float32 or bfloat16), kernel in Keras's grouped layout [kh, kw, C/groups,
out], strides an int, padding "SAME" or "VALID". All compute the same function
of the same kernel (they differ by float rounding only), so a checkpoint does
not depend on the formulation. `convolve` picks the fastest for the running process: call that.

Why: `keras.layers.Conv2D(groups > 1)` compiles its conv with XLA on TF (Keras
3 does so for every grouped conv, because TF's Eigen kernels have no grouped
gradient), and XLA's CPU gradients of a grouped conv are two orders of
magnitude slower than a dense conv of the same width (`native_xla`). With
oneDNN on, plain `tf.nn.conv2d` (`native`) is not slow at all; without oneDNN
(AVX2 CPUs: TF turns oneDNN on only with AVX512_VNNI, AVX512_BF16, AVX_VNNI or
AMX) its gradient raises, in float32 and bfloat16 alike.

Measured by scripts/grouped_conv_benchmark.py (docs/performance.md, "Grouped
convolutions on CPUs", has the table; scripts/grouped_conv_alternatives.py the
formulations that lost: `native_xla`, fixed chunk counts, `depthwise`, `im2col`).
So: oneDNN on and float32: `native` (0.41x ResNet-50's 3x3 convs; split next
at 0.52x). oneDNN off, or a step compiled by XLA: `chunked_auto` (0.71x;
`split` alone 1.02x). bfloat16 on a CPU that emulates it: `split`.
`block_diagonal` alone loses everywhere (groups times the FLOPs); it is
`chunked_auto`'s one-chunk case.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import tensorflow as tf

from resnet_app.common import compat, hardware

GroupedConv = Callable[[tf.Tensor, tf.Tensor, int, int, str], tf.Tensor]


def layout_dims(
    x: tf.Tensor, kernel: tf.Tensor, groups: int
) -> tuple[int, int, int, int, int, int]:
    """(kh, kw, C, C/groups, out, out/groups), checked against the grouped layout."""
    kh, kw, group_in, out = (int(d) for d in kernel.shape)
    channels = int(x.shape[-1])
    if groups < 1 or channels != group_in * groups or out % groups:
        raise ValueError(
            f"grouped conv: input channels {channels}, kernel {tuple(kernel.shape)} "
            f"and groups {groups} do not fit [kh, kw, C/groups, out] with out % groups == 0"
        )
    return kh, kw, channels, group_in, out, out // groups


def native(x: tf.Tensor, kernel: tf.Tensor, groups: int, strides: int, padding: str) -> tf.Tensor:
    """`tf.nn.conv2d` on the grouped kernel, as one op (TF infers groups from C / kernel.shape[2]).

    With oneDNN on (float32) the fastest here: forward and both gradients are
    oneDNN's grouped kernels, 0.41x ResNet-50's 3x3 convs over the network.
    Without oneDNN, and in bfloat16 where oneDNN has no bfloat16 (AVX2 CPUs),
    the forward pass runs but the gradient raises InvalidArgumentError
    ("Gradients for grouped convolutions are not supported on CPU"). Inside an
    XLA-compiled function it is `native_xla`, the slow one.
    """
    layout_dims(x, kernel, groups)
    return tf.nn.conv2d(x, kernel, strides, padding)


def split(x: tf.Tensor, kernel: tf.Tensor, groups: int, strides: int, padding: str) -> tf.Tensor:
    """One dense conv per group: split input and kernel, `groups` convs, concat.

    The same FLOPs as the grouped conv, `groups` small convs (C/groups input,
    out/groups output channels each: 4-32 at ResNeXt-50 32x4d) whose kernels run
    far below a large conv's efficiency, plus a split and a concat of the
    activations (and their gradients: a concat and a split) per step.
    Measured over the network: 0.52x ResNet-50's 3x3 convs with oneDNN, 1.02x
    without (the best of all from 16 channels per group on), and the best in
    emulated bfloat16 (0.17x of bfloat16 ResNet-50's, itself ~12x float32's).
    """
    layout_dims(x, kernel, groups)
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
    building the dense kernel and reducing its gradient (kernel-sized tensors).
    Measured: 4.1x (oneDNN) and 4.5x (Eigen) ResNet-50's 3x3 convs over the
    network, the slowest here but for `native_xla`.
    """
    layout_dims(x, kernel, groups)
    return tf.nn.conv2d(x, block_diagonal_kernel(kernel, groups), strides, padding)


def chunked(
    x: tf.Tensor, kernel: tf.Tensor, groups: int, strides: int, padding: str, chunks: int = 4
) -> tf.Tensor:
    """`block_diagonal` on `chunks` channel slices: `chunks` dense convs of width C/chunks.

    Each chunk holds groups/chunks whole groups; its block-diagonal conv costs
    1/chunks of the full block-diagonal one, so the FLOPs are groups/chunks
    times the grouped conv's (chunks == groups is `split`, chunks == 1
    `block_diagonal`), for `chunks` convs plus a split and a concat.
    Measured over the network, x ResNet-50's 3x3 convs: chunks 2, 4, 8, 16:
    2.0, 1.0, 0.62, - with oneDNN; 2.4, 1.4, 1.0, 0.88 without.
    """
    layout_dims(x, kernel, groups)
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


def auto_chunks(channels: int, groups: int, chunk_channels: int = 16) -> int:
    """Chunks of about `chunk_channels` input channels (whole groups), one group each at least.

    The number of groups per chunk is the largest divisor of `groups` not above
    chunk_channels / (C/groups). For ResNeXt-50 32x4d (32 groups): 8 chunks at
    4 channels per group, 16 at 8, 32 (one conv per group: `split`) at 16 and
    32, the fastest or within the noise of it at every stage without oneDNN,
    whole step XLA-compiled or not.
    """
    wanted = max(1, chunk_channels // max(1, channels // groups))
    per_chunk = max(d for d in range(1, min(wanted, groups) + 1) if groups % d == 0)
    return groups // per_chunk


def chunked_auto(
    x: tf.Tensor, kernel: tf.Tensor, groups: int, strides: int, padding: str
) -> tf.Tensor:
    """`chunked` with `auto_chunks`: dense convs of 16 input channels (`split` for wider groups).

    Without oneDNN (Eigen kernels) the fastest here: 0.71x ResNet-50's 3x3
    convs over the network (`split` 1.02x, `native` fails), and under XLA.
    At 4 channels per group: 4 groups a chunk, 4x the grouped conv's FLOPs in
    groups / 4 convs; from 16 channels per group on it is `split`.
    """
    return chunked(x, kernel, groups, strides, padding, auto_chunks(int(x.shape[-1]), groups))


_FORCED: list[str] = []  # A formulation `forced` picks for the graphs built meanwhile.


@contextlib.contextmanager
def forced(name: str) -> Iterator[None]:
    """Graphs built inside use formulation `name` (e.g. "native", to count a graph's MACs)."""
    if name not in FORMULATIONS:
        raise ValueError(f"unknown formulation {name!r}; one of {', '.join(FORMULATIONS)}")
    _FORCED.append(name)
    try:
        yield
    finally:
        _FORCED.pop()


@functools.cache
def _cpu_onednn() -> bool:
    return hardware.read_cpu_info().onednn


@functools.cache
def _has_gpu() -> bool:
    return bool(tf.config.list_physical_devices("GPU"))


def choose(dtype: tf.DType) -> str:
    """The formulation `convolve` uses for `dtype` in the graph being built.

    On GPUs, `native` (cuDNN's grouped kernels). On CPUs: float32 with oneDNN
    on, outside XLA, `native`; bfloat16, `split` (measured on a CPU that
    emulates bfloat16; unmeasured where oneDNN has native bfloat16);
    otherwise (Eigen kernels, or a jit_compile=True function) `chunked_auto`.
    """
    if _FORCED:
        return _FORCED[-1]
    if _has_gpu():
        return "native"
    if dtype == tf.bfloat16:
        return "split"
    if dtype == tf.float32 and _cpu_onednn() and not compat.in_xla_context():
        return "native"
    return "chunked_auto"


def convolve(x: tf.Tensor, kernel: tf.Tensor, groups: int, strides: int, padding: str) -> tf.Tensor:
    """The fastest exact formulation measured for this process (`choose`), picked at trace time.

    groups == 1 is a plain `tf.nn.conv2d`.
    """
    if groups == 1:
        return tf.nn.conv2d(x, kernel, strides, padding)
    return FORMULATIONS[choose(x.dtype)](x, kernel, groups, strides, padding)


FORMULATIONS: dict[str, GroupedConv] = {
    "native": native,
    "split": split,
    "block_diagonal": block_diagonal,
    "chunked_auto": chunked_auto,
    "convolve": convolve,
}
