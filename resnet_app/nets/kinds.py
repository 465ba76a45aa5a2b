"""The stem, residual-unit and attention kinds a config may name: the one registry (no TF).

`model.stem`, `model.block` and `model.attention` name a kind; the config's
checks, its field help (docs/config.md) and the builders all read this
registry. A new block or attention kind is its Keras class (in any module,
named here as "module:Class" text so that configs are checked before
TensorFlow loads) and one `register` line; a new stem is one line (its
convolutions). A block layer takes `blocks.Unit`'s arguments and has
`out_channels`, `convs` and `source_names`; an attention layer is
`Layer(make, channels, name=...)` and keeps its input's shape.
tests/test_toy_kinds.py checks every kind's facts against what it builds.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable
from typing import Any

from resnet_app.common.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class BlockKind:
    """A kind of residual unit (`model.block`).

    Attributes:
      layer: its Keras layer class, or "module:Class" to import at build time.
      help: what it is, for the field's help.
      expansion: the unit's output width over its stage width.
      convs: the convolutions on a unit's branch (`ResNetConfig.depth`).
      first_convs: those of a stage's first unit, where that differs.
      grouped: its inner convolution takes `groups` and `base_width`.
      fixed: `ResNetConfig` fields it has no place for (refused unless default).
      about: what it is, in that refusal.
    """

    name: str
    layer: str | Callable
    help: str
    expansion: int = 1
    convs: int = 2
    first_convs: int | None = None
    grouped: bool = False
    fixed: tuple[str, ...] = ()
    about: str = ""

    def inner_width(self, width: int, groups: int, base_width: int) -> int:
        """The width of the unit's inner (3x3) convolution at stage width `width`."""
        return width * base_width // 64 * groups if self.grouped else width

    def depth(self, units: Iterable[int]) -> int:
        """The weighted convolutions of stages of `units` units each."""
        units = tuple(units)
        first = self.convs if self.first_convs is None else self.first_convs
        return sum(units) * self.convs - len(units) * (self.convs - first)


@dataclasses.dataclass(frozen=True)
class StemKind:
    """A kind of stem (`model.stem`): conv-BN-ReLU layers before the first stage.

    Attributes:
      convs: `convs(config)` -> ((kernel, output width), ...), input to output;
        the first at stride `init_stride`, the last to `stem_filters`.
      fields: the `ResNetConfig` fields it reads, {field: what it sets}
        (refused with a stem that reads none of them).
      check: `check(config)` raises ConfigError for settings it cannot take.
      torch_names: `torch_names(count)` -> {our layer: its torchvision/timm
        name}, for `count` convolutions; None: no such file holds it.
      keras_applications: Keras applications' ResNet files hold this stem.
    """

    name: str
    help: str
    convs: Callable
    fields: dict[str, str] = dataclasses.field(default_factory=dict)
    check: Callable | None = None
    torch_names: Callable | None = None
    keras_applications: bool = False


@dataclasses.dataclass(frozen=True)
class AttentionKind:
    """A kind of channel attention on a residual branch (`model.attention`).

    Attributes:
      layer: as `BlockKind.layer`, or None for no layer.
      fields: as `StemKind.fields`.
      blocks: the block kinds it works with; None for every kind.
    """

    name: str
    layer: str | Callable | None
    help: str = ""
    fields: dict[str, str] = dataclasses.field(default_factory=dict)
    blocks: tuple[str, ...] | None = None


STEMS: dict[str, StemKind] = {}
BLOCKS: dict[str, BlockKind] = {}
ATTENTIONS: dict[str, AttentionKind] = {}


def register(kind: StemKind | BlockKind | AttentionKind) -> None:
    """Adds `kind` to its registry; a name is registered once."""
    registries = {StemKind: STEMS, BlockKind: BLOCKS, AttentionKind: ATTENTIONS}
    registry: dict[str, Any] = registries[type(kind)]
    if kind.name in registry:
        raise ValueError(f"{type(kind).__name__} {kind.name!r} is registered twice")
    registry[kind.name] = kind


def layer_class(kind: BlockKind | AttentionKind) -> Callable | None:
    """The kind's Keras layer class (imported now if named as text), or None."""
    if not isinstance(kind.layer, str):
        return kind.layer
    module, _, name = kind.layer.partition(":")
    return getattr(importlib.import_module(module), name)


def choices_help(registry: dict[str, Any]) -> str:
    """'"a" (its help), "b" or "c" (its help)': a field's help, from its kinds."""
    named = [f'"{k.name}" ({k.help})' if k.help else f'"{k.name}"' for k in registry.values()]
    return ", ".join(named[:-1]) + " or " + named[-1] if len(named) > 1 else "".join(named)


def _deep_convs(config) -> tuple[tuple[int, int], ...]:
    widths = config.stem_widths or (config.stem_filters // 2,) * 2
    return tuple((3, width) for width in (*widths, config.stem_filters))


def _check_deep(config) -> None:
    if config.stem_widths and len(config.stem_widths) != 2:
        raise ConfigError(
            f"model field 'stem_widths' needs the deep stem's first two widths, got "
            f"{list(config.stem_widths)}"
        )
    if config.stem_filters < 2:
        raise ConfigError("model field 'stem_filters' must be at least 2 for stem=deep")


def _torch_deep(count: int) -> dict[str, str]:
    """timm's deep stem: a Sequential of conv, BN, ReLU, ..., its last BN outside it."""
    names = {}
    for index in range(1, count):
        names[f"stem_conv{index}"] = f"conv1.{3 * (index - 1)}"
        names[f"stem_bn{index}"] = f"conv1.{3 * (index - 1) + 1}"
    return {**names, "stem_conv": f"conv1.{3 * (count - 1)}", "stem_bn": "bn1"}


# The kinds. A new one is one entry here; its class may live in any module.
for _kind in (
    StemKind(
        "plain",
        "one convolution of `stem_kernel`",
        lambda config: ((config.stem_kernel, config.stem_filters),),
        fields={"stem_kernel": "a plain stem's kernel"},
        torch_names=lambda count: {"stem_conv": "conv1", "stem_bn": "bn1"},
        keras_applications=True,
    ),
    StemKind(
        "deep",
        "three 3x3 convolutions, the first at `init_stride`: ResNet-C",
        _deep_convs,
        fields={"stem_widths": "a deep stem's widths"},
        check=_check_deep,
        torch_names=_torch_deep,
    ),
    BlockKind("basic", "resnet_app.nets.blocks:BasicBlock", "two 3x3 convs"),
    BlockKind(
        "bottleneck",
        "resnet_app.nets.blocks:BottleneckBlock",
        "1x1, 3x3, 1x1 with the output width multiplied by 4",
        expansion=4,
        convs=3,
        grouped=True,
    ),
    BlockKind(
        "conv_pool",
        "resnet_app.nets.conv_pool:ConvPoolUnit",
        "Page 2018: a stage's first unit is a 3x3 conv, BatchNorm, ReLU and a max-pool of "
        "the stage's stride; each later one a residual of two 3x3 conv-BN-ReLU added to its "
        "input; v1 only, no attention, shortcut or dropout",
        first_convs=1,
        fixed=(
            "version",
            "attention",
            "dropout",
            "drop_path_rate",
            "groups",
            "base_width",
            "zero_init_residual",
        ),
        about="ResNet-9's plain conv-BN-ReLU units",
    ),
    AttentionKind("none", None),
    AttentionKind(
        "se",
        "resnet_app.nets.attention:SqueezeExcite",
        "squeeze-excitation: global average, 1x1 reduce by `se_ratio`, ReLU, 1x1 expand, "
        "sigmoid gate",
        fields={"se_ratio": "squeeze-excitation's reduction"},
    ),
    AttentionKind(
        "eca",
        "resnet_app.nets.attention:EfficientChannelAttention",
        "efficient channel attention: a 1-D convolution across the channels of the global "
        "average, its kernel size from the channel count",
    ),
):
    register(_kind)
