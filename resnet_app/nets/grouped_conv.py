"""Exact formulations of a grouped 2-D convolution, for CPUs where TF's own is slow.

Each is `fn(x, kernel, groups, strides, padding) -> y`: x NHWC, the kernel in
Keras's grouped layout [kh, kw, C/groups, out], strides an int, padding "SAME"
or "VALID". All compute the same function of the same kernel, so checkpoints
do not depend on the formulation; `convolve` picks one for the process.

Why: Keras compiles a grouped `Conv2D` with XLA on TF, whose CPU gradients are
two orders of magnitude slower than a dense conv's; plain `tf.nn.conv2d` is
fast with oneDNN, and without it (AVX2 CPUs) its gradient raises. So: oneDNN
and float32 take `native`; no oneDNN, or an XLA-compiled step, `chunked_auto`;
bfloat16 on a CPU that emulates it, `split` (scripts/grouped_conv_benchmark.py at commit d94b0ee,
docs/performance.md).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import tensorflow as tf

from resnet_app.common import compat, hardware

GroupedConv = Callable[[tf.Tensor, tf.Tensor, int, int, str], tf.Tensor]


def _check_layout(x: tf.Tensor, kernel: tf.Tensor, groups: int) -> None:
    """Refuses (ValueError) a kernel that is not [kh, kw, C/groups, out] with out % groups == 0."""
    group_in, out = int(kernel.shape[2]), int(kernel.shape[3])
    channels = int(x.shape[-1])
    if groups < 1 or channels != group_in * groups or out % groups:
        raise ValueError(
            f"grouped conv: input channels {channels}, kernel {tuple(kernel.shape)} "
            f"and groups {groups} do not fit [kh, kw, C/groups, out] with out % groups == 0"
        )


def native(x: tf.Tensor, kernel: tf.Tensor, groups: int, strides: int, padding: str) -> tf.Tensor:
    """`tf.nn.conv2d` on the grouped kernel: oneDNN's grouped kernels; without oneDNN
    its gradient raises ("Gradients for grouped convolutions are not supported on CPU")."""
    _check_layout(x, kernel, groups)
    return tf.nn.conv2d(x, kernel, strides, padding)


def split(x: tf.Tensor, kernel: tf.Tensor, groups: int, strides: int, padding: str) -> tf.Tensor:
    """One dense conv per group: split input and kernel, `groups` convs, concat."""
    _check_layout(x, kernel, groups)
    inputs = tf.split(x, groups, axis=-1)
    kernels = tf.split(kernel, groups, axis=-1)
    return tf.concat(
        [tf.nn.conv2d(xi, ki, strides, padding) for xi, ki in zip(inputs, kernels)], axis=-1
    )


def _block_diagonal_kernel(kernel: tf.Tensor, groups: int) -> tf.Tensor:
    """The dense [kh, kw, C, out] kernel equal to the grouped one: zero off the diagonal blocks.

    A broadcast multiply with the identity, so its gradient is the diagonal
    blocks of the dense gradient.
    """
    kh, kw, group_in, out = (int(d) for d in kernel.shape)
    blocks = tf.reshape(kernel, [kh, kw, 1, group_in, groups, out // groups])
    eye = tf.reshape(tf.eye(groups, dtype=kernel.dtype), [1, 1, groups, 1, groups, 1])
    return tf.reshape(blocks * eye, [kh, kw, groups * group_in, out])


def chunked_auto(
    x: tf.Tensor, kernel: tf.Tensor, groups: int, strides: int, padding: str
) -> tf.Tensor:
    """On channel chunks of about 16 inputs (whole groups), one dense conv each with the
    block-diagonal kernel: exact, at the chunk's groups times the FLOPs."""
    _check_layout(x, kernel, groups)
    wanted = max(1, 16 // max(1, int(x.shape[-1]) // groups))  # Groups per chunk, at most.
    per_chunk = max(d for d in range(1, min(wanted, groups) + 1) if groups % d == 0)
    chunks = groups // per_chunk
    inputs = tf.split(x, chunks, axis=-1)
    kernels = tf.split(kernel, chunks, axis=-1)
    return tf.concat(
        [
            tf.nn.conv2d(xi, _block_diagonal_kernel(ki, per_chunk), strides, padding)
            for xi, ki in zip(inputs, kernels)
        ],
        axis=-1,
    )


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

    GPUs: `native` (cuDNN). CPUs: float32 with oneDNN, outside XLA, `native`;
    bfloat16 `split`; otherwise `chunked_auto`.
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
    """The formulation `choose` picks, at trace time; groups == 1 is a plain `tf.nn.conv2d`."""
    if groups == 1:
        return tf.nn.conv2d(x, kernel, strides, padding)
    return FORMULATIONS[choose(x.dtype)](x, kernel, groups, strides, padding)


FORMULATIONS: dict[str, GroupedConv] = {
    "native": native,
    "split": split,
    "chunked_auto": chunked_auto,
    "convolve": convolve,
}
