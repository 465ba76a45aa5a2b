"""The named ResNets: `ResNetConfig` and the stage table of every preset.

Pure data, importable without TensorFlow, so that command-line tools can check
a model name before paying for the TensorFlow import. `nets/resnet.py` builds
the network a config describes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from resnet_app.common.errors import ConfigError

BLOCKS = ("basic", "bottleneck")
VERSIONS = ("v1", "v2")
SHORTCUTS = ("pad", "projection")
PADDINGS = ("same", "symmetric")
BOTTLENECK_EXPANSION = 4
STEM, HEAD = "stem", "head"  # The parts around the stages (see `part_names`).


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
    """Everything that defines a ResNet.

    Attributes:
      block: "basic" (two 3x3 convs) or "bottleneck" (1x1, 3x3, 1x1 with the
        output width multiplied by 4).
      version: "v1" (post-activation, He et al. 2015) or "v2" (pre-activation,
        He et al. 2016).
      units: residual units per stage.
      widths: stage widths; a bottleneck stage outputs 4x this many channels.
      strides: the stride of each stage's first unit.
      stem_filters: output channels of the stem convolution.
      init_filter: kernel size of the stem convolution.
      init_stride: stride of the stem convolution.
      init_max_pool: a 3x3, stride-2 max-pool after the stem (ImageNet).
      shortcut: how a unit's shortcut changes shape: "pad" (option A: subsample,
        then zero-pad the new channels) or "projection" (option B: a 1x1 conv,
        followed by BatchNorm in v1; in v2 its input is already normalized).
      num_classes: width of the logits.
      activate_before_residual: v2 only. The BN-ReLU that starts a stage's first
        unit also feeds its shortcut (He et al. 2016, "both_preact").
      stride_in_1x1: bottleneck only. Put the stride on the first 1x1 conv, as
        the original paper did (ResNet-50: 3.86 G MACs), instead of on the 3x3
        conv, as torchvision, TF Model Garden and NVIDIA do (4.09 G MACs).
      padding: how a strided convolution and the stem's max-pool pad: "same"
        (TensorFlow's: an even input gets its extra row and column at the
        bottom and right only) or "symmetric" (k // 2 on every side, as
        torchvision, Caffe and Keras applications do). Both give the same
        output size; weights trained with one see a one-pixel shift under the
        other, so imported weights bring theirs.
      weight_decay: L2 coefficient; the penalty is weight_decay * sum(w**2) / 2.
      bn_momentum: BatchNorm moving-average momentum (Keras convention).
      bn_epsilon: BatchNorm epsilon.
      bn_synchronized: compute BatchNorm batch statistics across all towers.
      drop_path_rate: stochastic depth (Huang et al. 2016): in training, each
        residual branch is dropped per example, block b of B at rate
        drop_path_rate * (b + 1) / B, and scaled by 1 / (1 - rate) when kept;
        evaluation uses every branch. 0 for none.
      zero_init_residual: start the last BatchNorm gamma of each residual branch
        at zero (Goyal et al. 2017), so every unit starts as the identity. v1
        only; v2 branches end in a convolution.
    """

    block: str = "basic"
    version: str = "v1"
    units: tuple[int, ...] = (3, 3, 3)
    widths: tuple[int, ...] = (16, 32, 64)
    strides: tuple[int, ...] = (1, 2, 2)
    stem_filters: int = 16
    init_filter: int = 3
    init_stride: int = 1
    init_max_pool: bool = False
    shortcut: str = "pad"
    num_classes: int = 10
    activate_before_residual: bool = True
    stride_in_1x1: bool = False
    padding: str = "same"
    weight_decay: float = 1e-4
    bn_momentum: float = 0.9
    bn_epsilon: float = 1e-5
    bn_synchronized: bool = False
    zero_init_residual: bool = False
    drop_path_rate: float = 0.0

    def __post_init__(self):
        for name in ("units", "widths", "strides"):
            value = getattr(self, name)
            if not isinstance(value, (list, tuple)):
                raise ConfigError(
                    f"model field '{name}' needs a list with one entry per stage, got {value!r}"
                )
            object.__setattr__(self, name, tuple(value))
        _check_choice("block", self.block, BLOCKS)
        _check_choice("version", self.version, VERSIONS)
        _check_choice("shortcut", self.shortcut, SHORTCUTS)
        _check_choice("padding", self.padding, PADDINGS)
        if not self.units:
            raise ConfigError("model field 'units' is empty; give at least one stage")
        if not len(self.units) == len(self.widths) == len(self.strides):
            raise ConfigError(
                f"model fields 'units' ({len(self.units)}), 'widths' "
                f"({len(self.widths)}) and 'strides' ({len(self.strides)}) must "
                "have one entry per stage"
            )
        for name in ("units", "widths", "strides"):
            for value in getattr(self, name):
                _check_positive_int(name, value)
        for name in ("stem_filters", "init_filter", "init_stride", "num_classes"):
            _check_positive_int(name, getattr(self, name))
        for name in (
            "init_max_pool",
            "activate_before_residual",
            "stride_in_1x1",
            "bn_synchronized",
            "zero_init_residual",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"model field '{name}' must be true or false, got {getattr(self, name)!r}"
                )
        for name in ("weight_decay", "bn_epsilon"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"model field '{name}' must be a number >= 0, got {value!r}")
        rate = self.drop_path_rate
        if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 <= rate < 1:
            raise ConfigError(f"model field 'drop_path_rate' must be in [0, 1), got {rate!r}")
        if not isinstance(self.bn_momentum, (int, float)) or not 0 <= self.bn_momentum < 1:
            raise ConfigError(
                f"model field 'bn_momentum' must be in [0, 1), got {self.bn_momentum!r}"
            )
        if self.zero_init_residual and self.version != "v1":
            raise ConfigError(
                "model field 'zero_init_residual' needs version v1: a v2 residual "
                "branch ends in a convolution, not a BatchNorm"
            )

    @property
    def expansion(self) -> int:
        """How much wider a unit's output is than its stage width."""
        return BOTTLENECK_EXPANSION if self.block == "bottleneck" else 1

    @property
    def depth(self) -> int:
        """Weighted layers as the papers count them: stem, unit convs, logits."""
        return 1 + sum(self.units) * (3 if self.block == "bottleneck" else 2) + 1

    @property
    def default_image_size(self) -> int:
        """The input size the family was designed for: 224 (ImageNet) or 32."""
        return 224 if self.init_max_pool else 32

    def stage_channels(self) -> tuple[int, ...]:
        """The number of channels each stage outputs."""
        return tuple(width * self.expansion for width in self.widths)


def _check_choice(name: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(
            f"model field '{name}' must be one of {', '.join(choices)}; got {value!r}"
        )


def _check_positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"model field '{name}' needs positive integers, got {value!r}")


# The two families. A preset overrides only what differs from ResNetConfig.
_CIFAR = dict(widths=(16, 32, 64), strides=(1, 2, 2), num_classes=10)
_IMAGENET = dict(
    widths=(64, 128, 256, 512),
    strides=(1, 2, 2, 2),
    stem_filters=64,
    init_filter=7,
    init_stride=2,
    init_max_pool=True,
    shortcut="projection",
    num_classes=1000,
)


def _cifar_v1(depth: int) -> dict[str, Any]:
    """He et al. 2015, section 4.2: depth 6n+2, three stages of n basic units."""
    return dict(_CIFAR, units=((depth - 2) // 6,) * 3)


def _cifar_v2_bottleneck(depth: int) -> dict[str, Any]:
    """He et al. 2016: depth 9n+2, three stages of n bottleneck units."""
    return dict(
        _CIFAR,
        block="bottleneck",
        version="v2",
        shortcut="projection",
        units=((depth - 2) // 9,) * 3,
    )


PRESETS: dict[str, dict[str, Any]] = {
    # Not in the paper's table: the family's n = 2, small enough for the
    # quickstart (configs/shapes_quickstart.yaml) on slow CPUs.
    "resnet14": _cifar_v1(14),
    "resnet20": _cifar_v1(20),
    "resnet32": _cifar_v1(32),
    "resnet44": _cifar_v1(44),
    "resnet56": _cifar_v1(56),
    "resnet110": _cifar_v1(110),
    "resnet1202": _cifar_v1(1202),
    "preact_resnet164": _cifar_v2_bottleneck(164),
    "preact_resnet1001": _cifar_v2_bottleneck(1001),
    "resnet18": dict(_IMAGENET, block="basic", units=(2, 2, 2, 2)),
    "resnet34": dict(_IMAGENET, block="basic", units=(3, 4, 6, 3)),
    "resnet50": dict(_IMAGENET, block="bottleneck", units=(3, 4, 6, 3)),
    "resnet101": dict(_IMAGENET, block="bottleneck", units=(3, 4, 23, 3)),
    "resnet152": dict(_IMAGENET, block="bottleneck", units=(3, 8, 36, 3)),
    "resnet200": dict(_IMAGENET, block="bottleneck", units=(3, 24, 36, 3)),
}
# Every ImageNet preset also comes pre-activated (He et al. 2016).
PRESETS.update(
    {
        f"{name}_v2": dict(preset, version="v2")
        for name, preset in list(PRESETS.items())
        if preset.get("init_max_pool")
    }
)
# A test-only network: one stage of one unit with a few filters, built in
# milliseconds. Not meant for real training, so not offered to users.
PRESETS["tiny"] = dict(units=(1,), widths=(4,), strides=(1,), stem_filters=4)
TEST_ONLY = ("tiny",)


def model_names(include_test_only: bool = False) -> list[str]:
    """Preset names, in table order.

    Args:
      include_test_only: also return the presets that exist for tests.

    Returns:
      The names `get_config` and `create_model` accept.
    """
    return [name for name in PRESETS if include_test_only or name not in TEST_ONLY]


def get_config(name: str, **overrides: Any) -> ResNetConfig:
    """Returns the config of preset `name` with `overrides` applied.

    Args:
      name: a preset from `model_names()`.
      **overrides: `ResNetConfig` fields to change, e.g. `num_classes=100`.

    Returns:
      The validated config.

    Raises:
      ConfigError: for an unknown preset, an unknown field or a bad value.
    """
    if name not in PRESETS:
        raise ConfigError(f"unknown model '{name}'; valid models: {', '.join(model_names())}")
    fields = {field.name for field in dataclasses.fields(ResNetConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ConfigError(
            f"unknown model field(s) {', '.join(unknown)}; valid fields: "
            f"{', '.join(sorted(fields))}"
        )
    return ResNetConfig(**{**PRESETS[name], **overrides})


def part_names(num_stages: int) -> list[str]:
    """The parts of a network with `num_stages` stages, input to output.

    `stem` (the stem convolution and its BatchNorm), `stage1` ... `stageN` (for
    v2, the last stage also holds the final BatchNorm), `head` (the logits).
    Fine-tuning freezes, and scales the learning rate of, parts by these names.
    """
    return [STEM, *(f"stage{stage}" for stage in range(1, num_stages + 1)), HEAD]


def check_parts(key: str, parts: Iterable[str], num_stages: int, model_name: str) -> None:
    """Refuses a part name the network does not have.

    Raises:
      ConfigError: naming the first unknown part and the valid ones.
    """
    valid = part_names(num_stages)
    for part in parts:
        if part not in valid:
            raise ConfigError(
                f"{key} names part {part!r}, which {model_name} does not have; "
                f"its parts are {', '.join(valid)}"
            )
