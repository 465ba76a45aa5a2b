"""The residual-unit and attention kinds a config may name: the one registry (no TensorFlow).

`model.block` and `model.attention` name a kind. Everything that needs to
know the kinds reads this registry, never a list of its own:
`ResNetConfig` (`nets/spec.py`) checks the names and the combinations and
derives depth, expansion and inner width from a kind's facts;
`presets` refuses the fields an attention kind reads when another kind is
chosen; the help of `model.block` and `model.attention` (docs/config.md)
is the kinds' `help`; the builder (`nets/blocks.py`, `nets/attention.py`)
builds the Keras layer a kind names. So a new kind is its Keras class (in
any module) and one `register(...)` line below; the tests in
tests/test_toy_kinds.py check every registered kind's facts against the
network it builds.

Config checks run before TensorFlow loads (a mistake costs no import), so
this module is plain data: a kind names its layer as "module:Class" text,
imported only when a network is built (as `export/formats.py` names its
converters). A block layer takes `blocks.ResidualBlock`'s arguments and has
`out_channels`, `convs` and `source_names`; an attention layer is
`Layer(make, channels, name=...)`, keeps its input's shape, and is placed
on a residual branch after its last BatchNorm.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable
from typing import Any


@dataclasses.dataclass(frozen=True)
class BlockKind:
    """A kind of residual unit (`model.block`).

    Attributes:
      name: the `model.block` value.
      layer: its Keras layer class, or "module:Class" to import at build time.
      help: what it is, for the field's help (docs/config.md).
      expansion: the unit's output width over its stage width.
      convs: the convolutions on a unit's branch (`ResNetConfig.depth`).
      first_convs: those of a stage's first unit, where that differs (else None).
      grouped: its inner convolution takes `groups` and `base_width`: its
        inner width is width * base_width // 64 * groups, else the stage width.
      fixed: `ResNetConfig` fields it has no place for: refused unless at
        their defaults.
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
class AttentionKind:
    """A kind of channel attention on a residual branch (`model.attention`).

    Attributes:
      name: the `model.attention` value.
      layer: its Keras layer class, "module:Class" to import at build time,
        or None for no layer.
      help: what it is, for the field's help (docs/config.md); "" for none.
      fields: the `ResNetConfig` fields it reads, {field: what it sets};
        set with an attention that reads none of them, they are refused.
      blocks: the block kinds it works with; None for every kind that has
        a place for attention.
    """

    name: str
    layer: str | Callable | None
    help: str = ""
    fields: dict[str, str] = dataclasses.field(default_factory=dict)
    blocks: tuple[str, ...] | None = None


BLOCKS: dict[str, BlockKind] = {}
ATTENTIONS: dict[str, AttentionKind] = {}


def register(kind: BlockKind | AttentionKind) -> None:
    """Adds `kind` to its registry; a name is registered once."""
    registry: dict[str, Any] = BLOCKS if isinstance(kind, BlockKind) else ATTENTIONS
    if kind.name in registry:
        raise ValueError(f"{type(kind).__name__} {kind.name!r} is registered twice")
    registry[kind.name] = kind


def layer_class(kind: BlockKind | AttentionKind) -> Callable | None:
    """The kind's Keras layer class (imported now if named as text), or None."""
    if not isinstance(kind.layer, str):
        return kind.layer
    module, _, name = kind.layer.partition(":")
    return getattr(importlib.import_module(module), name)


def choices_help(registry: dict[str, BlockKind] | dict[str, AttentionKind]) -> str:
    """'"a" (its help), "b" or "c" (its help)': a field's help, from its kinds."""
    named = [f'"{k.name}" ({k.help})' if k.help else f'"{k.name}"' for k in registry.values()]
    return ", ".join(named[:-1]) + " or " + named[-1] if len(named) > 1 else "".join(named)


# The kinds. A new one is one line here; its class may live in any module.
register(BlockKind("basic", "resnet_app.nets.blocks:BasicBlock", "two 3x3 convs"))
register(
    BlockKind(
        "bottleneck",
        "resnet_app.nets.blocks:BottleneckBlock",
        "1x1, 3x3, 1x1 with the output width multiplied by 4",
        expansion=4,
        convs=3,
        grouped=True,
    )
)
register(
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
    )
)
register(AttentionKind("none", None))
register(
    AttentionKind(
        "se",
        "resnet_app.nets.attention:SqueezeExcite",
        "squeeze-excitation: global average, 1x1 reduce by `se_ratio`, ReLU, 1x1 expand, "
        "sigmoid gate",
        fields={"se_ratio": "squeeze-excitation's reduction"},
    )
)
register(
    AttentionKind(
        "eca",
        "resnet_app.nets.attention:EfficientChannelAttention",
        "efficient channel attention: a 1-D convolution across the channels of the global "
        "average, its kernel size from the channel count",
    )
)
