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

Measured by scripts/grouped_conv_benchmark.py (AMD EPYC, AVX2 only, 2 shared
cores, TF 2.21; batch 16, forward + gradients of input and kernel, ms/step;
ResNeXt-50 32x4d's grouped 3x3 convs, "/2" the stride-2 first conv of a stage;
R50 = ResNet-50's dense 3x3 conv of that stage, half the width; whole network
= the 16 convs of each, 3-4-6-3 blocks; ~ = timed at batch 2, scaled; noise
between runs up to ~1.5x on this shared machine):

                 s1 56px  s2/2    s2 28px  s3/2    s3 14px  s4/2    s4 7px  network
                 w 128    w 256   w 256    w 512   w 512    w 1024  w 1024  (16 convs)
    oneDNN on, float32
    R50 dense       225      308     140      246     225      441     255     3725
    native          218      151      50       98      62       82      40     1526
    native_xla   ~53796   ~27542  ~14573   ~12851  ~11265    ~6582   ~6401  ~321209
    split           259      250      55      148      74       96      67     1937
    chunked8        186      305      81      191     127      151     122     2325
    chunked4        318      363     129      309     212      336     186     3784
    depthwise       631      580     275      817     438      653     602     8160
    im2col         2287     1809     531      955     486      484     270    14669
    block_diag     1062     1618     432     1259     813     1604    1082    15191
    oneDNN off (Eigen kernels), float32
    R50 dense       231      261     226      256     147      369     183     3358
    native        fails: "Gradients for grouped convolutions are not supported on CPU"
    native_xla   ~42316   ~25356  ~26374   ~13087   ~6658    ~6723   ~3351  ~291228
    split           631      254     223      170      55       97      35     3431
    chunked16       382      253     193      152     121      130      45     2953
    chunked8        318      259     216      220     168      220     125     3393
    chunked_auto    318      253     193      170      55       97      35    ~2400
    chunked4        381      372     297      318     287      336     146     4790
    depthwise       362      756     357      925     469      752     282     7497
    im2col         1199     1982    1117      510     585      536     145    13193
    block_diag      909      881     881     1043     678     2094    1208    15193
    bfloat16, oneDNN on but emulated (no AVX512_BF16 or AMX here: ~10x float32)
    R50 dense      2397     3901    3854     2054    2007     3003    4265    46276
    native        fails (no grouped gradient in bfloat16 either)
    split           695      614     540      355     317      558     534     7883
    depthwise       482     1237     389      883     427     1875    1101    10946
    chunked16       804      892     618      638     605     1037    1038    11933
    whole step compiled by XLA (jit_compile=True), oneDNN off, float32
    R50 dense       267                                113
    native       ~52910                              ~6829
    split           627                                 82
    chunked8        254                                170
    chunked16       300                                 94

(chunked_auto: the chunked8, chunked16, split times of its chunk counts 8, 16,
16, 32, 32, 32, 32 from the same run.)

Exactness (max abs difference relative to the reference's max, output / input
gradient / kernel gradient, on a batch of 2): float32, against native (or
native_xla without oneDNN), every formulation <= 7.6e-7 / 5.1e-7 / 2.7e-6,
the same size as native's own error against a float64 reference (<= 6.7e-7 /
6.0e-7 / 2.1e-6). bfloat16 against float32: <= 4.0e-3 / 1.3e-2 / 6.3e-2 (split,
chunked16), depthwise 7.5e-3 / 8.7e-3 / 8.9e-2.

So: oneDNN on and float32: `native` (0.41x ResNet-50's 3x3 convs; split next
at 0.52x). oneDNN off, or a step compiled by XLA: `chunked_auto` (0.71x;
`split` alone 1.02x). bfloat16 on a CPU that emulates it: `split`.
`block_diagonal` loses everywhere (32x the FLOPs), and so does `im2col` (a
patch tensor 9x the input, and transposes).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import tensorflow as tf

from resnet_app.common import compat, hardware

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
    """`tf.nn.conv2d` on the grouped kernel, as one op (TF infers groups from C / kernel.shape[2]).

    With oneDNN on (float32) the fastest here: forward and both gradients are
    oneDNN's grouped kernels, 0.41x ResNet-50's 3x3 convs over the network.
    Without oneDNN, and in bfloat16 where oneDNN has no bfloat16 (AVX2 CPUs),
    the forward pass runs but the gradient raises InvalidArgumentError
    ("Gradients for grouped convolutions are not supported on CPU"). Inside an
    XLA-compiled function it is `native_xla`, the slow one.
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
    Measured over the network: 0.52x ResNet-50's 3x3 convs with oneDNN, 1.02x
    without (the best of all from 16 channels per group on), and the best in
    emulated bfloat16 (0.17x of bfloat16 ResNet-50's, itself ~12x float32's).
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
    building the dense kernel and reducing its gradient (kernel-sized tensors).
    Measured: 4.1x (oneDNN) and 4.5x (Eigen) ResNet-50's 3x3 convs over the
    network, the slowest here but for `native_xla`.
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
    Measured over the network, x ResNet-50's 3x3 convs: chunks 2, 4, 8, 16:
    2.0, 1.0, 0.62, - with oneDNN; 2.4, 1.4, 1.0, 0.88 without.
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
    Measured: 3.9x ResNet-50's 3x3 convs over the network, oneDNN on or off.
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
    "chunked_auto": chunked_auto,
    "convolve": convolve,
    "depthwise": depthwise,
    "im2col": im2col,
}
