"""A NumPy reference for the ResNet family of torchvision and timm, for importer tests.

Written from the published definitions (torchvision's `torchvision/models/resnet.py`;
timm 1.0's `timm/models/resnet.py`, `timm/layers/squeeze_excite.py`, `eca.py`,
`create_attn.py` and `helpers.py`), not from this project's model code, so that
tests of the importers of torchvision and timm weights compare against code no
one here wrote the importers against. torch is not needed. The conventions are
those of `tests.torchvision_reference` (which covers torchvision's resnet18 ...
resnet152): NCHW images, OIHW conv weights, symmetric padding, eval-mode
BatchNorm on the running statistics, float64 forward.

What the variants change, on top of torchvision's ResNet:

* ResNeXt and wide ResNet (torchvision's layout, and timm's, which is the same):
  the Bottleneck's inner width is int(planes * base_width / 64) * groups, and
  its 3x3 `conv2` (which carries the stride) is a grouped convolution;
  resnext50_32x4d has groups 32 and base_width 4, wide_resnet50_2 groups 1 and
  base_width 128. The output stays planes * 4.
* timm's deep stem ("c", "d" and "s" variants, ResNet-RS): `conv1` is a
  Sequential of 3x3 convs, stride 2 3 -> stem_width, BN, ReLU, 3x3
  stem_width -> stem_width, BN, ReLU, 3x3 stem_width -> 2 * stem_width, so
  `conv1.0`, `conv1.1` (BN), `conv1.3`, `conv1.4` (BN), `conv1.6`; then `bn1`
  and ReLU on 2 * stem_width channels, the input of `layer1`.
* `replace_stem_pool` (ResNet-RS): the stem max pool becomes `maxpool` =
  Sequential(3x3 conv stride 2, BN, ReLU), `maxpool.0` and `maxpool.1`.
* `avg_down` ("d" variants, ResNet-RS): the projection shortcut is
  `downsample` = Sequential(AvgPool2d(2, stride, ceil_mode=True,
  count_include_pad=False), or Identity for stride 1; 1x1 conv stride 1; BN),
  so `downsample.1` and `downsample.2`. On an odd size, the last window of the
  pool overhangs the input and averages its valid elements only.
* attention, timm's `se` attribute of a block, on the residual branch after its
  last BN, before the shortcut is added: SEModule, `x * sigmoid(fc2(relu(fc1(
  mean_hw(x)))))` with `fc1`, `fc2` 1x1 convs with bias, reduced to
  make_divisible(C * rd_ratio, 8, round_limit=0) channels (rd_ratio 1/16, 0.25 in
  ResNet-RS); or EcaModule, a bias-free Conv1d `se.conv` of 1 -> 1 channels and
  odd kernel k (from C) along the channel axis of the HW-mean, padding (k-1)//2,
  then a sigmoid gate.

`random_state_dict` makes a state dict with the source's names, shapes, order
and dtypes and random, non-trivial values, scaled so that the activations of
the deepest nets stay O(1). `forward` computes the logits in float64.
"""

import math
from dataclasses import dataclass

import numpy as np

from tests.torchvision_reference import batch_norm, check_state, conv2d, max_pool_3x3_s2

# Exact published parameter counts (num_classes=1000), as supplied with this
# reference's brief: torchvision publishes `num_params` in its weights' metadata,
# timm the parameter counts of its models on their model cards. Each also agrees
# with the 2-decimal `param_count` of timm's results/results-imagenet.csv.
PUBLISHED_PARAMS = {
    "resnext50_32x4d": 25_028_904,
    "resnext101_32x8d": 88_791_336,
    "resnext101_64x4d": 83_455_272,
    "wide_resnet50_2": 68_883_240,
    "wide_resnet101_2": 126_886_696,
    "resnet18d": 11_708_744,
    "resnet34d": 21_816_904,
    "resnet50d": 25_576_264,
    "resnet50c": 25_576_264,
    "resnet50s": 25_680_808,
    "seresnet50": 28_088_024,
    "seresnext50_32x4d": 27_559_896,
    "ecaresnet50d": 25_576_350,
    "resnetrs50": 35_691_912,
    "resnetrs101": 63_618_696,
}


@dataclass(frozen=True)
class Arch:
    """One ResNet variant, in the terms of timm's `ResNet(...)` arguments.

    Attributes:
      source: "torchvision" or "timm", whose state dict layout and names apply.
      block: "basic" (expansion 1) or "bottleneck" (expansion 4).
      layers: blocks per stage.
      groups: the cardinality of the Bottleneck's 3x3 conv.
      base_width: the Bottleneck's inner width is int(planes * base_width / 64) * groups.
      stem: "plain" (a 7x7 conv of 64 channels) or "deep" (three 3x3 convs).
      stem_width: the width of the deep stem's first two convs (the stem ends on
        2 * stem_width channels); 64, unused, for the plain stem.
      avg_down: the projection shortcut average-pools, then a stride-1 1x1 conv.
      replace_stem_pool: a 3x3 stride-2 conv, BN, ReLU instead of the max pool.
      attn: None, "se" (SEModule) or "eca" (EcaModule), in every block.
      se_ratio: SEModule's rd_ratio.
    """

    source: str
    block: str
    layers: tuple[int, int, int, int]
    groups: int = 1
    base_width: int = 64
    stem: str = "plain"
    stem_width: int = 64
    avg_down: bool = False
    replace_stem_pool: bool = False
    attn: str | None = None
    se_ratio: float = 1.0 / 16


def _tv(layers, groups, base_width) -> Arch:
    return Arch("torchvision", "bottleneck", layers, groups=groups, base_width=base_width)


def _timm_d(block, layers, **kwargs) -> Arch:
    """timm's "d" recipe: deep stem of width 32, average-pool shortcuts."""
    return Arch("timm", block, layers, stem="deep", stem_width=32, avg_down=True, **kwargs)


def _timm_rs(layers) -> Arch:
    """timm's resnetrs*: "d" plus a conv stem pool and SE with rd_ratio=0.25."""
    return _timm_d("bottleneck", layers, replace_stem_pool=True, attn="se", se_ratio=0.25)


_R50, _R101, _R152, _R200 = (3, 4, 6, 3), (3, 4, 23, 3), (3, 8, 36, 3), (3, 24, 36, 3)

# The names users type, as torchvision and timm register them.
ARCHS: dict[str, Arch] = {
    # torchvision/models/resnet.py: groups, width_per_group.
    "resnext50_32x4d": _tv(_R50, 32, 4),
    "resnext101_32x8d": _tv(_R101, 32, 8),
    "resnext101_64x4d": _tv(_R101, 64, 4),
    "wide_resnet50_2": _tv(_R50, 1, 128),
    "wide_resnet101_2": _tv(_R101, 1, 128),
    # timm/models/resnet.py.
    "resnet18d": _timm_d("basic", (2, 2, 2, 2)),
    "resnet34d": _timm_d("basic", (3, 4, 6, 3)),
    "resnet50d": _timm_d("bottleneck", _R50),
    "resnet101d": _timm_d("bottleneck", _R101),
    "resnet152d": _timm_d("bottleneck", _R152),
    "resnet200d": _timm_d("bottleneck", _R200),
    "resnet50c": Arch("timm", "bottleneck", _R50, stem="deep", stem_width=32),
    "resnet50s": Arch("timm", "bottleneck", _R50, stem="deep", stem_width=64),
    "seresnet50": Arch("timm", "bottleneck", _R50, attn="se"),
    "seresnet101": Arch("timm", "bottleneck", _R101, attn="se"),
    "seresnet152": Arch("timm", "bottleneck", _R152, attn="se"),
    "seresnext50_32x4d": Arch("timm", "bottleneck", _R50, groups=32, base_width=4, attn="se"),
    "seresnext101_32x8d": Arch("timm", "bottleneck", _R101, groups=32, base_width=8, attn="se"),
    "ecaresnet50d": _timm_d("bottleneck", _R50, attn="eca"),
    "ecaresnet101d": _timm_d("bottleneck", _R101, attn="eca"),
    "resnetrs50": _timm_rs(_R50),
    "resnetrs101": _timm_rs(_R101),
    "resnetrs152": _timm_rs(_R152),
    "resnetrs200": _timm_rs(_R200),
    "resnetrs270": _timm_rs((4, 29, 53, 4)),
    "resnetrs350": _timm_rs((4, 36, 72, 4)),
    "resnetrs420": _timm_rs((4, 44, 87, 4)),
}

_EXPANSION = {"basic": 1, "bottleneck": 4}
_STAGE_PLANES = (64, 128, 256, 512)
_STAGE_STRIDES = (1, 2, 2, 2)
_BN_TENSORS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def make_divisible(value: float, divisor: int = 8, min_value=None, round_limit: float = 0.9) -> int:
    """timm's `make_divisible`: the nearest multiple of divisor, at least min_value
    (divisor if None), one divisor more if that rounded down by more than
    (1 - round_limit) of the value."""
    min_value = min_value or divisor
    rounded = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if rounded < round_limit * value:
        rounded += divisor
    return rounded


def se_channels(channels: int, rd_ratio: float = 1.0 / 16) -> int:
    """SEModule's reduced width: make_divisible(C * rd_ratio, 8, round_limit=0)."""
    return make_divisible(channels * rd_ratio, 8, round_limit=0.0)


def eca_kernel_size(channels: int, gamma: float = 2, beta: float = 1) -> int:
    """EcaModule's kernel: t = int(|log2(C) + beta| / gamma), made odd upwards, at least 3."""
    t = int(abs(math.log(channels, 2) + beta) / gamma)  # math.log(C, 2), as timm.
    return max(t if t % 2 else t + 1, 3)


def _arch(arch: str) -> Arch:
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {sorted(ARCHS)}")
    return ARCHS[arch]


@dataclass(frozen=True)
class _Block:
    prefix: str  # "layer2.0"
    in_channels: int
    planes: int
    width: int  # The Bottleneck's inner width; planes for a BasicBlock.
    out_channels: int
    stride: int
    downsample: bool


def _stem_channels(spec: Arch) -> int:
    return 2 * spec.stem_width if spec.stem == "deep" else 64


def _blocks(spec: Arch):
    """Yields a `_Block` per residual block, in order."""
    expansion = _EXPANSION[spec.block]
    channels = _stem_channels(spec)
    for stage, (count, planes, stride) in enumerate(
        zip(spec.layers, _STAGE_PLANES, _STAGE_STRIDES), start=1
    ):
        if spec.block == "basic":
            width = planes
        else:
            width = int(planes * spec.base_width / 64) * spec.groups
        out = planes * expansion
        for index in range(count):
            block_stride = stride if index == 0 else 1
            has_downsample = block_stride != 1 or channels != out
            yield _Block(
                f"layer{stage}.{index}", channels, planes, width, out, block_stride, has_downsample
            )
            channels = out


def _convs(spec: Arch, block: _Block) -> list[tuple[int, int, int, int, int]]:
    """(kernel, in_channels, out_channels, groups, stride) of a block's conv1, conv2[, conv3]."""
    if spec.block == "basic":
        return [
            (3, block.in_channels, block.planes, 1, block.stride),
            (3, block.planes, block.out_channels, 1, 1),
        ]
    return [
        (1, block.in_channels, block.width, 1, 1),
        (3, block.width, block.width, spec.groups, block.stride),
        (1, block.width, block.out_channels, 1, 1),
    ]


def _batch_norm_shapes(prefix: str, channels: int) -> dict[str, tuple[int, ...]]:
    return {
        f"{prefix}.{name}": (() if name == "num_batches_tracked" else (channels,))
        for name in _BN_TENSORS
    }


def _conv_shape(kernel: int, cin: int, cout: int, groups: int = 1) -> tuple[int, ...]:
    return (cout, cin // groups, kernel, kernel)


def state_dict_shapes(arch: str, num_classes: int = 1000) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the source's `model.state_dict()`, in its order.

    PyTorch orders a state dict by module registration: a module's own
    parameters, then its buffers, then its children. In a block: conv1, bn1,
    conv2, bn2[, conv3, bn3], then timm's `se`, then `downsample`.

    Args:
      arch: a key of `ARCHS`.
      num_classes: rows of `fc.weight`.

    Returns:
      name -> shape; `num_batches_tracked` entries have shape ().
    """
    spec = _arch(arch)
    shapes: dict[str, tuple[int, ...]] = {}
    stem = _stem_channels(spec)
    if spec.stem == "deep":
        width = spec.stem_width
        shapes["conv1.0.weight"] = _conv_shape(3, 3, width)
        shapes.update(_batch_norm_shapes("conv1.1", width))
        shapes["conv1.3.weight"] = _conv_shape(3, width, width)
        shapes.update(_batch_norm_shapes("conv1.4", width))
        shapes["conv1.6.weight"] = _conv_shape(3, width, stem)
    else:
        shapes["conv1.weight"] = _conv_shape(7, 3, stem)
    shapes.update(_batch_norm_shapes("bn1", stem))
    if spec.replace_stem_pool:
        shapes["maxpool.0.weight"] = _conv_shape(3, stem, stem)
        shapes.update(_batch_norm_shapes("maxpool.1", stem))
    channels = stem
    for block in _blocks(spec):
        prefix = block.prefix
        for number, (kernel, cin, cout, groups, _) in enumerate(_convs(spec, block), start=1):
            shapes[f"{prefix}.conv{number}.weight"] = _conv_shape(kernel, cin, cout, groups)
            shapes.update(_batch_norm_shapes(f"{prefix}.bn{number}", cout))
        channels = block.out_channels
        if spec.attn == "se":
            reduced = se_channels(channels, spec.se_ratio)
            shapes[f"{prefix}.se.fc1.weight"] = (reduced, channels, 1, 1)
            shapes[f"{prefix}.se.fc1.bias"] = (reduced,)
            shapes[f"{prefix}.se.fc2.weight"] = (channels, reduced, 1, 1)
            shapes[f"{prefix}.se.fc2.bias"] = (channels,)
        elif spec.attn == "eca":
            shapes[f"{prefix}.se.conv.weight"] = (1, 1, eca_kernel_size(channels))
        if block.downsample:
            # avg_down: [0] is the pool (or Identity), without tensors.
            conv_index = 1 if spec.avg_down else 0
            shapes[f"{prefix}.downsample.{conv_index}.weight"] = (channels, block.in_channels, 1, 1)
            shapes.update(_batch_norm_shapes(f"{prefix}.downsample.{conv_index + 1}", channels))
    shapes["fc.weight"] = (num_classes, channels)
    shapes["fc.bias"] = (num_classes,)
    return shapes


def _is_buffer(name: str) -> bool:
    return name.rpartition(".")[2] in _BUFFERS


def trainable_params(arch: str, num_classes: int = 1000) -> int:
    """The number of trainable parameters: every tensor but BatchNorm's buffers."""
    shapes = state_dict_shapes(arch, num_classes)
    return sum(math.prod(shape) for name, shape in shapes.items() if not _is_buffer(name))


def _last_batch_norms(spec: Arch) -> set[str]:
    last = "bn2" if spec.block == "basic" else "bn3"
    return {f"{block.prefix}.{last}" for block in _blocks(spec)}


def random_state_dict(
    arch: str, num_classes: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """A state dict of random weights, with the source's names, shapes and order.

    float32, but `num_batches_tracked`, an int64 scalar. As
    `tests.torchvision_reference.random_state_dict`: conv weights He-normal (std
    sqrt(2 / fan_in)), SE's 1x1 convs included; BatchNorm weights uniform(0.5,
    1.5), those of the last BatchNorm of each block's residual branch
    multiplied by 0.35 * sqrt(16 / blocks), so that the sum of up to 139
    branches (resnetrs420) stays O(1); biases (SE's too) and running means
    normal(0, 0.1), running variances uniform(0.5, 2); ECA's Conv1d weight
    normal with std sqrt(1 / k); `fc.weight` normal with std sqrt(1 / fan_in),
    `fc.bias` normal(0, 0.1).

    Args:
      arch: a key of `ARCHS`.
      num_classes: rows of `fc.weight`.
      rng: the source of the values.

    Returns:
      name -> array, in the source's order.
    """
    shapes = state_dict_shapes(arch, num_classes)  # Checks arch.
    spec = ARCHS[arch]
    last_bns = _last_batch_norms(spec)
    last_scale = 0.35 * np.sqrt(16 / sum(spec.layers))
    state: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        module, _, tensor = name.rpartition(".")
        if tensor == "num_batches_tracked":
            state[name] = np.array(rng.integers(1, 1_000_000), dtype=np.int64)
            continue
        if module == "fc":
            if tensor == "weight":
                value = rng.standard_normal(shape) / np.sqrt(shape[1])
            else:
                value = 0.1 * rng.standard_normal(shape)
        elif len(shape) == 4:  # A conv weight, OIHW.
            fan_in = shape[1] * shape[2] * shape[3]
            value = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        elif len(shape) == 3:  # ECA's Conv1d weight, [1, 1, k].
            value = rng.standard_normal(shape) / np.sqrt(shape[2])
        elif tensor == "weight":  # BatchNorm gamma.
            value = rng.uniform(0.5, 1.5, shape)
            if module in last_bns:
                value *= last_scale
        elif tensor == "running_var":
            value = rng.uniform(0.5, 2.0, shape)
        else:  # BatchNorm beta, running mean, SE's conv biases.
            value = 0.1 * rng.standard_normal(shape)
        state[name] = value.astype(np.float32)
    return state


def avg_pool_ceil(x: np.ndarray, kernel: int = 2, stride: int = 2) -> np.ndarray:
    """PyTorch's AvgPool2d(kernel, stride, padding=0, ceil_mode=True,
    count_include_pad=False) on NCHW.

    The output has ceil((size - kernel) / stride) + 1 positions along H and W,
    less one if the last window would start past the input; a window that
    overhangs the bottom or right edge averages the elements inside only.
    """

    def out_size(size: int) -> int:
        out = -(-(size - kernel) // stride) + 1
        if (out - 1) * stride >= size:
            out -= 1
        return out

    height, width = x.shape[2:]
    out_h, out_w = out_size(height), out_size(width)
    # Zeros at the bottom and right, as far as the last window reaches.
    pad_h = max((out_h - 1) * stride + kernel - height, 0)
    pad_w = max((out_w - 1) * stride + kernel - width, 0)

    def window_sums(a: np.ndarray) -> np.ndarray:
        a = np.pad(a, ((0, 0), (0, 0), (0, pad_h), (0, pad_w)))
        windows = np.lib.stride_tricks.sliding_window_view(a, (kernel, kernel), axis=(2, 3))
        return windows[:, :, ::stride, ::stride][:, :, :out_h, :out_w].sum(axis=(4, 5))

    sums = window_sums(x)
    counts = window_sums(np.ones((1, 1, height, width)))  # Elements inside the input.
    return sums / counts


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


def squeeze_excite(
    x: np.ndarray,
    fc1_weight: np.ndarray,
    fc1_bias: np.ndarray,
    fc2_weight: np.ndarray,
    fc2_bias: np.ndarray,
) -> np.ndarray:
    """timm's SEModule: x * sigmoid(fc2(relu(fc1(mean over H, W)))), fc 1x1 convs [O, I, 1, 1]."""
    squeezed = x.mean(axis=(2, 3))  # [N, C]
    hidden = _relu(squeezed @ fc1_weight[:, :, 0, 0].T + fc1_bias)
    gate = _sigmoid(hidden @ fc2_weight[:, :, 0, 0].T + fc2_bias)
    return x * gate[:, :, None, None]


def efficient_channel_attention(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """timm's EcaModule: x * sigmoid(conv1d over channels of the HW-mean), weight [1, 1, k]."""
    kernel = weight.shape[-1]
    pad = (kernel - 1) // 2
    squeezed = np.pad(x.mean(axis=(2, 3)), ((0, 0), (pad, pad)))  # [N, C + 2 pad]
    windows = np.lib.stride_tricks.sliding_window_view(squeezed, kernel, axis=1)  # [N, C, k]
    gate = _sigmoid(windows @ weight[0, 0])
    return x * gate[:, :, None, None]


def _check_state(state: dict[str, np.ndarray], arch: str) -> dict[str, tuple[int, ...]]:
    _arch(arch)
    if "fc.weight" not in state:
        raise ValueError(f"{arch} state dict: missing ['fc.weight']")
    num_classes = np.shape(state["fc.weight"])[0]
    expected = state_dict_shapes(arch, num_classes)
    check_state(state, expected, arch)
    return expected


def forward(
    state: dict[str, np.ndarray],
    arch: str,
    images_nchw: np.ndarray,
    eps: float = 1e-5,
    return_features: bool = False,
):
    """The torchvision or timm network `arch` in eval mode, in float64.

    Args:
      state: a state dict (names as `state_dict_shapes`), as NumPy arrays;
        extra entries are an error, so are missing ones and wrong shapes.
      arch: a key of `ARCHS`.
      images_nchw: [N, 3, H, W], already normalized as the model expects.
      eps: BatchNorm's epsilon (PyTorch's default).
      return_features: also return the globally pooled features.

    Returns:
      float64 logits [N, num_classes], num_classes the rows of `fc.weight`; with
      return_features, (logits, pooled features [N, C]).
    """
    _check_state(state, arch)
    spec = ARCHS[arch]
    images = np.asarray(images_nchw, np.float64)
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be [N, 3, H, W], got {images.shape}")

    def tensor(name: str) -> np.ndarray:
        return np.asarray(state[name], np.float64)

    def conv(x: np.ndarray, name: str, stride: int = 1, groups: int = 1) -> np.ndarray:
        weight = tensor(f"{name}.weight")
        return conv2d(x, weight, stride=stride, padding=weight.shape[2] // 2, groups=groups)

    def bn(x: np.ndarray, name: str) -> np.ndarray:
        return batch_norm(x, state, name, eps)

    if spec.stem == "deep":
        x = _relu(bn(conv(images, "conv1.0", 2), "conv1.1"))
        x = _relu(bn(conv(x, "conv1.3"), "conv1.4"))
        x = conv(x, "conv1.6")
    else:
        x = conv(images, "conv1", 2)
    x = _relu(bn(x, "bn1"))
    if spec.replace_stem_pool:
        x = _relu(bn(conv(x, "maxpool.0", 2), "maxpool.1"))
    else:
        x = max_pool_3x3_s2(x)

    for block in _blocks(spec):
        prefix = block.prefix
        if not block.downsample:
            shortcut = x
        elif spec.avg_down:
            pooled = avg_pool_ceil(x, 2, block.stride) if block.stride != 1 else x
            shortcut = bn(conv(pooled, f"{prefix}.downsample.1"), f"{prefix}.downsample.2")
        else:
            shortcut = conv(x, f"{prefix}.downsample.0", block.stride)
            shortcut = bn(shortcut, f"{prefix}.downsample.1")
        convs = _convs(spec, block)
        branch = x
        for number, (_, _, _, groups, stride) in enumerate(convs, start=1):
            branch = conv(branch, f"{prefix}.conv{number}", stride, groups)
            branch = bn(branch, f"{prefix}.bn{number}")
            if number < len(convs):
                branch = _relu(branch)
        if spec.attn == "se":
            branch = squeeze_excite(
                branch,
                tensor(f"{prefix}.se.fc1.weight"),
                tensor(f"{prefix}.se.fc1.bias"),
                tensor(f"{prefix}.se.fc2.weight"),
                tensor(f"{prefix}.se.fc2.bias"),
            )
        elif spec.attn == "eca":
            branch = efficient_channel_attention(branch, tensor(f"{prefix}.se.conv.weight"))
        x = _relu(branch + shortcut)

    features = x.mean(axis=(2, 3))  # Global average pooling, flattened.
    logits = features @ tensor("fc.weight").T + tensor("fc.bias")
    return (logits, features) if return_features else logits
