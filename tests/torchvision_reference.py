"""A NumPy reference for torchvision's ResNet forward pass, for importer tests.

Written from the published definition of `torchvision.models.resnet`, not from
this project's model code, so that a test of the importer of torchvision
`.safetensors` weights compares against code no one here wrote the importer
against. torch is not needed.

The architecture, as torchvision defines it:

* stem: `conv1` 7x7 stride 2 padding 3 (no bias), `bn1`, ReLU, max pool 3x3
  stride 2 padding 1;
* `layer1`..`layer4`, of 64, 128, 256 and 512 planes, strides 1, 2, 2, 2 (on the
  first block of the stage);
* `BasicBlock` (expansion 1): `conv1` 3x3 (stride), `bn1`, ReLU, `conv2` 3x3,
  `bn2`, add the shortcut, ReLU;
* `Bottleneck` (expansion 4), ResNet v1.5: `conv1` 1x1, `bn1`, ReLU, `conv2` 3x3
  carrying the stride, `bn2`, ReLU, `conv3` 1x1, `bn3`, add the shortcut, ReLU;
* the shortcut is the identity, or `downsample` = 1x1 conv (stride, no bias) and
  BatchNorm when the stride is not 1 or the channel count changes;
* adaptive average pooling to 1x1, then `fc` (x @ W.T + b).

Padding is explicit and symmetric (k // 2 on every side, as PyTorch's
`padding=`), unlike TF's "same", which puts the extra row and column of a
strided convolution at the bottom and right: the importer has to reproduce the
former. BatchNorm runs in eval mode, on the running statistics. Tensors are in
PyTorch's layouts: images NCHW, conv weights OIHW, `fc.weight` [out, in].

`random_state_dict` makes a state dict with torchvision's names, shapes and
dtypes and random, non-trivial values (a swapped or transposed tensor changes
the output), scaled so that the activations of the deepest nets stay O(1).
`forward` computes the logits in float64.
"""

import numpy as np

# arch -> (block, blocks per stage), as torchvision's resnet18 ... resnet152.
ARCHS = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
    "resnet101": ("bottleneck", (3, 4, 23, 3)),
    "resnet152": ("bottleneck", (3, 8, 36, 3)),
}

_EXPANSION = {"basic": 1, "bottleneck": 4}
_STAGE_PLANES = (64, 128, 256, 512)
_STAGE_STRIDES = (1, 2, 2, 2)
_BN_TENSORS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _blocks(arch: str):
    """Yields (prefix, block, in_channels, planes, stride, has_downsample) per block."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {sorted(ARCHS)}")
    block, counts = ARCHS[arch]
    expansion = _EXPANSION[block]
    channels = 64  # After the stem.
    for stage, (count, planes, stride) in enumerate(
        zip(counts, _STAGE_PLANES, _STAGE_STRIDES), start=1
    ):
        for index in range(count):
            block_stride = stride if index == 0 else 1
            out = planes * expansion
            has_downsample = block_stride != 1 or channels != out
            yield f"layer{stage}.{index}", block, channels, planes, block_stride, has_downsample
            channels = out


def _convs(block: str, in_channels: int, planes: int) -> list[tuple[int, int, int]]:
    """(kernel, in_channels, out_channels) of a block's conv1, conv2[, conv3]."""
    if block == "basic":
        return [(3, in_channels, planes), (3, planes, planes)]
    return [(1, in_channels, planes), (3, planes, planes), (1, planes, planes * 4)]


def state_dict_shapes(arch: str, num_classes: int = 1000) -> dict[str, tuple[int, ...]]:
    """Names and shapes of torchvision's `model.state_dict()`, in its order.

    Args:
      arch: a key of `ARCHS`.
      num_classes: rows of `fc.weight`.

    Returns:
      name -> shape; `num_batches_tracked` entries have shape ().
    """

    def batch_norm(prefix: str, channels: int) -> dict[str, tuple[int, ...]]:
        return {
            f"{prefix}.{name}": (() if name == "num_batches_tracked" else (channels,))
            for name in _BN_TENSORS
        }

    shapes: dict[str, tuple[int, ...]] = {"conv1.weight": (64, 3, 7, 7)}
    shapes.update(batch_norm("bn1", 64))
    channels = 64
    for prefix, block, in_channels, planes, _, has_downsample in _blocks(arch):
        convs = _convs(block, in_channels, planes)
        for number, (kernel, cin, cout) in enumerate(convs, start=1):
            shapes[f"{prefix}.conv{number}.weight"] = (cout, cin, kernel, kernel)
            shapes.update(batch_norm(f"{prefix}.bn{number}", cout))
        channels = convs[-1][2]
        if has_downsample:
            shapes[f"{prefix}.downsample.0.weight"] = (channels, in_channels, 1, 1)
            shapes.update(batch_norm(f"{prefix}.downsample.1", channels))
    shapes["fc.weight"] = (num_classes, channels)
    shapes["fc.bias"] = (num_classes,)
    return shapes


def random_state_dict(
    arch: str, num_classes: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """A torchvision-style state dict of random weights.

    Every tensor of torchvision's `model.state_dict()`, with its names and
    shapes: float32, but `num_batches_tracked`, an int64 scalar. Conv weights
    are He-normal (std sqrt(2 / fan_in)), BatchNorm weights uniform(0.5, 1.5),
    those of the last BatchNorm of each block's residual branch multiplied by
    0.35 * sqrt(16 / blocks) (0.49 for resnet18, 0.35 for resnet34 and resnet50,
    0.2 for resnet152), so that the sum of up to 50 branches stays O(1); biases
    and running means normal(0, 0.1), running variances uniform(0.5, 2);
    `fc.weight` normal with std sqrt(1 / fan_in), `fc.bias` normal(0, 0.1).

    Args:
      arch: a key of `ARCHS`.
      num_classes: rows of `fc.weight`.
      rng: the source of the values.

    Returns:
      name -> array, in torchvision's order.
    """
    shapes = state_dict_shapes(arch, num_classes)  # Checks arch.
    block, counts = ARCHS[arch]
    last_bn = "bn2" if block == "basic" else "bn3"
    # Each block adds its branch to the shortcut: with the branches' last gammas
    # scaled by 1 / sqrt(blocks), the activations grow by a bounded factor.
    last_scale = 0.35 * np.sqrt(16 / sum(counts))
    state: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        module, _, tensor = name.rpartition(".")
        if tensor == "num_batches_tracked":
            value = np.array(rng.integers(1, 1_000_000), dtype=np.int64)
        elif module == "fc":
            if tensor == "weight":
                value = rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[1])
            else:
                value = 0.1 * rng.standard_normal(shape, dtype=np.float32)
        elif len(shape) == 4:  # A conv weight, OIHW.
            fan_in = shape[1] * shape[2] * shape[3]
            value = rng.standard_normal(shape, dtype=np.float32) * np.sqrt(2.0 / fan_in)
        elif tensor == "weight":  # BatchNorm gamma.
            value = rng.uniform(0.5, 1.5, shape)
            if module.endswith(last_bn):
                value *= last_scale
        elif tensor == "running_var":
            value = rng.uniform(0.5, 2.0, shape)
        else:  # BatchNorm beta and running mean.
            value = 0.1 * rng.standard_normal(shape)
        state[name] = value if tensor == "num_batches_tracked" else value.astype(np.float32)
    return state


def conv2d(
    x: np.ndarray, weight: np.ndarray, stride: int = 1, padding: int = 0, groups: int = 1
) -> np.ndarray:
    """A 2-D convolution (cross-correlation, as PyTorch's), without bias.

    Args:
      x: [N, C, H, W].
      weight: [O, C // groups, KH, KW].
      stride: the same along H and W.
      padding: rows and columns of zeros added on every side.
      groups: as PyTorch's: the channels split into `groups` consecutive groups,
        output channels [g * O / groups, (g + 1) * O / groups) reading only the
        input channels of group g.

    Returns:
      [N, O, (H + 2p - KH) // stride + 1, (W + 2p - KW) // stride + 1], in the
      result type of x and weight.
    """
    out_channels, group_channels, kernel_h, kernel_w = weight.shape
    if groups < 1 or x.shape[1] % groups or out_channels % groups:
        raise ValueError(
            f"groups={groups} must divide the {x.shape[1]} input and {out_channels} output channels"
        )
    if x.shape[1] != group_channels * groups:
        raise ValueError(
            f"input has {x.shape[1]} channels, weight expects {group_channels * groups}"
        )
    if padding:
        x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    # [N, C, H', W', KH, KW]: every window position, then only the strided ones.
    windows = np.lib.stride_tricks.sliding_window_view(x, (kernel_h, kernel_w), axis=(2, 3))
    windows = windows[:, :, ::stride, ::stride]
    if groups == 1:
        out = np.tensordot(windows, weight, axes=([1, 4, 5], [1, 2, 3]))  # [N, H', W', O]
        return np.ascontiguousarray(out.transpose(0, 3, 1, 2))
    batch, _, out_h, out_w = windows.shape[:4]
    # One matrix product per group: [G, N*H'*W', C/G*KH*KW] @ [G, C/G*KH*KW, O/G].
    patches = windows.reshape(batch, groups, group_channels, out_h, out_w, kernel_h, kernel_w)
    patches = patches.transpose(1, 0, 3, 4, 2, 5, 6).reshape(groups, batch * out_h * out_w, -1)
    kernels = weight.reshape(groups, out_channels // groups, -1).transpose(0, 2, 1)
    out = np.matmul(patches, kernels)  # [G, N*H'*W', O/G]
    out = out.reshape(groups, batch, out_h, out_w, out_channels // groups)
    return np.ascontiguousarray(
        out.transpose(1, 0, 4, 2, 3).reshape(batch, out_channels, out_h, out_w)
    )


def max_pool_3x3_s2(x: np.ndarray) -> np.ndarray:
    """torchvision's stem max pool: kernel 3, stride 2, padding 1 (of -inf), on NCHW."""
    x = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))
    return windows[:, :, ::2, ::2].max(axis=(4, 5))


def batch_norm(x: np.ndarray, state: dict[str, np.ndarray], prefix: str, eps: float) -> np.ndarray:
    """Eval-mode BatchNorm2d `prefix` on NCHW: running statistics, then gamma and beta."""
    scale = np.asarray(state[f"{prefix}.weight"], np.float64) / np.sqrt(
        np.asarray(state[f"{prefix}.running_var"], np.float64) + eps
    )
    shift = np.asarray(state[f"{prefix}.bias"], np.float64) - scale * np.asarray(
        state[f"{prefix}.running_mean"], np.float64
    )
    return x * scale[:, None, None] + shift[:, None, None]


def check_state(state: dict, expected: dict[str, tuple[int, ...]], arch: str) -> None:
    """Raises ValueError for a state dict without exactly the `expected` names and shapes."""
    if set(state) != set(expected):
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        raise ValueError(f"{arch} state dict: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, shape in expected.items():
        if tuple(np.shape(state[name])) != shape:
            raise ValueError(f"{name}: shape {np.shape(state[name])}, expected {shape}")


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


def forward(
    state: dict[str, np.ndarray], arch: str, images_nchw: np.ndarray, eps: float = 1e-5
) -> np.ndarray:
    """torchvision's ResNet in eval mode, in float64.

    Args:
      state: a torchvision state dict (names as `state_dict_shapes`), as NumPy
        arrays; extra entries are an error, so are missing ones and wrong shapes.
      arch: a key of `ARCHS`.
      images_nchw: [N, 3, H, W], already normalized as the model expects.
      eps: BatchNorm's epsilon (PyTorch's default).

    Returns:
      float64 logits [N, num_classes], num_classes the rows of `fc.weight`.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {sorted(ARCHS)}")
    num_classes = np.shape(state["fc.weight"])[0]
    check_state(state, state_dict_shapes(arch, num_classes), arch)
    images = np.asarray(images_nchw, np.float64)
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be [N, 3, H, W], got {images.shape}")

    def conv(x: np.ndarray, name: str, stride: int) -> np.ndarray:
        weight = np.asarray(state[f"{name}.weight"], np.float64)
        return conv2d(x, weight, stride=stride, padding=weight.shape[2] // 2)

    x = _relu(batch_norm(conv(images, "conv1", 2), state, "bn1", eps))
    x = max_pool_3x3_s2(x)
    for prefix, block, _, _, stride, has_downsample in _blocks(arch):
        if has_downsample:
            shortcut = conv(x, f"{prefix}.downsample.0", stride)
            shortcut = batch_norm(shortcut, state, f"{prefix}.downsample.1", eps)
        else:
            shortcut = x
        # The stride: on conv1 (3x3) of a BasicBlock, on conv2 (3x3) of a Bottleneck.
        strides = (stride, 1) if block == "basic" else (1, stride, 1)
        branch = x
        for number, conv_stride in enumerate(strides, start=1):
            branch = conv(branch, f"{prefix}.conv{number}", conv_stride)
            branch = batch_norm(branch, state, f"{prefix}.bn{number}", eps)
            if number < len(strides):
                branch = _relu(branch)
        x = _relu(branch + shortcut)
    pooled = x.mean(axis=(2, 3))  # Adaptive average pooling to 1x1, flattened.
    weight = np.asarray(state["fc.weight"], np.float64)
    bias = np.asarray(state["fc.bias"], np.float64)
    return pooled @ weight.T + bias
