"""`ResNetConfig`: every choice that defines a ResNet, as data, validated (no TensorFlow).

A ResNet is a stem (`nets/stem.py`), stages of residual units
(`nets/blocks.py`) and a head; each field is read in one place of the
builder. The stem, block and attention kinds are registered in
`nets/kinds.py`, which this reads for the names it accepts, the fields a kind
refuses, depth, expansion, inner width and the fields' help.
"""

from __future__ import annotations

import dataclasses

from resnet_app.common.errors import ConfigError
from resnet_app.common.fields import (
    AT_LEAST_0,
    AT_LEAST_1,
    FLAG,
    FRACTION,
    MORE_THAN_0,
    SHARE,
    changed_from_defaults,
    check_declared,
    one_of,
    setting,
)
from resnet_app.nets import kinds

VERSIONS = ("v1", "v2")
SHORTCUTS = ("pad", "projection", "avg_projection")
PADDINGS = ("same", "symmetric")
HEAD_POOLS = ("avg", "max")
SE_DIVISOR = 8  # Squeeze-excitation's width is a multiple of this (timm's make_divisible).


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
    """Everything that defines a ResNet.

    Attributes:
      block: {block_kinds}.
      version: "v1" (post-activation, He et al. 2015) or "v2" (pre-activation,
        He et al. 2016).
      units: residual units per stage.
      widths: stage widths; a bottleneck stage outputs 4x this many channels.
      strides: the stride of each stage's first unit.
      stem_filters: output channels of the stem (of its last convolution).
      stem_kernel: kernel size of a "plain" stem's convolution.
      init_stride: stride of the stem's first convolution.
      init_max_pool: the stem downsamples by 2 after its convolutions (a 3x3,
        stride-2 max-pool; ImageNet).
      shortcut: how a unit's shortcut changes shape: "pad" (option A: subsample,
        then zero-pad the new channels), "projection" (option B: a strided 1x1
        conv, followed by BatchNorm in v1; in v2 its input is already
        normalized) or "avg_projection" (ResNet-D: a 2x2 average pool of the
        stride, then the 1x1 conv at stride 1, so no input pixel is skipped).
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
      zero_init_residual: start the last BatchNorm gamma of each residual branch
        at zero (Goyal et al. 2017), so every unit starts as the identity. v1
        only; v2 branches end in a convolution.
      drop_path_rate: stochastic depth (Huang et al. 2016): in training, each
        residual branch is dropped per example, block b of B at rate
        drop_path_rate * (b + 1) / B, and scaled by 1 / (1 - rate) when kept;
        evaluation uses every branch. 0 for none.
      stem: {stem_kinds}.
      stem_widths: a deep stem's first two widths (its last is
        `stem_filters`); empty: half of `stem_filters` each, as timm's
        ResNet-C/D (32, 32, 64).
      replace_stem_pool: the stem downsamples with a 3x3, stride-2 conv,
        BatchNorm and ReLU instead of the max-pool (ResNet-RS). Needs
        `init_max_pool`.
      groups: bottleneck only. The 3x3 convolution's groups (ResNeXt's
        cardinality).
      base_width: bottleneck only. Channels per group of the 3x3 convolution
        at stage width 64: the inner width is
        int(width * base_width / 64) * groups (torchvision's and timm's
        rule): 64 with groups 1 is ResNet, 128 the wide ResNet-50-2, 4 with
        groups 32 ResNeXt-50 32x4d.
      attention: on each residual branch, after its last BatchNorm and before
        the addition: {attention_kinds}.
      se_ratio: squeeze-excitation's reduced width over its channels (1/16
        in Hu et al.; 1/4 in ResNet-RS), rounded to a multiple of 8.
      dropout: the rate of dropout before each unit's last convolution (wide
        ResNets: 0.3 between the two convs), drawn per element from the
        step's example keys like stochastic depth, so resumes and towers draw
        the same; 0 for none.
      head_pool: the global pooling before the logits: "avg" (He et al.) or
        "max" (ResNet-9).
      head_bias: the logits layer has a bias (ResNet-9's has none).
      logit_scale: the logits are multiplied by this (ResNet-9: 0.125).
    """

    block: str = setting("basic", one_of(kinds.BLOCKS))
    version: str = setting("v1", one_of(VERSIONS))
    units: tuple[int, ...] = setting((3, 3, 3), AT_LEAST_1)
    widths: tuple[int, ...] = setting((16, 32, 64), AT_LEAST_1)
    strides: tuple[int, ...] = setting((1, 2, 2), AT_LEAST_1)
    stem_filters: int = setting(16, AT_LEAST_1)
    stem_kernel: int = setting(3, AT_LEAST_1)
    init_stride: int = setting(1, AT_LEAST_1)
    init_max_pool: bool = setting(False, FLAG)
    shortcut: str = setting("pad", one_of(SHORTCUTS))
    num_classes: int = setting(10, AT_LEAST_1)
    activate_before_residual: bool = setting(True, FLAG)
    stride_in_1x1: bool = setting(False, FLAG)
    padding: str = setting("same", one_of(PADDINGS))
    weight_decay: float = setting(1e-4, AT_LEAST_0)
    bn_momentum: float = setting(0.9, FRACTION)
    bn_epsilon: float = setting(1e-5, AT_LEAST_0)
    bn_synchronized: bool = setting(False, FLAG)
    zero_init_residual: bool = setting(False, FLAG)
    drop_path_rate: float = setting(0.0, FRACTION)
    stem: str = setting("plain", one_of(kinds.STEMS))
    stem_widths: tuple[int, ...] = setting((), AT_LEAST_1)
    replace_stem_pool: bool = setting(False, FLAG)
    groups: int = setting(1, AT_LEAST_1)
    base_width: int = setting(64, AT_LEAST_1)
    attention: str = setting("none", one_of(kinds.ATTENTIONS))
    se_ratio: float = setting(0.0625, SHARE)
    dropout: float = setting(0.0, FRACTION)
    head_pool: str = setting("avg", one_of(HEAD_POOLS))
    head_bias: bool = setting(True, FLAG)
    logit_scale: float = setting(1.0, MORE_THAN_0)

    def __post_init__(self):
        for name in ("units", "widths", "strides", "stem_widths"):
            value = getattr(self, name)
            if not isinstance(value, (list, tuple)):
                raise ConfigError(
                    f"model field '{name}' needs a list with one entry per stage, got {value!r}"
                )
        check_declared(self, "model field '{}'")
        if not self.units:
            raise ConfigError("model field 'units' is empty; give at least one stage")
        if not len(self.units) == len(self.widths) == len(self.strides):
            raise ConfigError(
                f"model fields 'units' ({len(self.units)}), 'widths' "
                f"({len(self.widths)}) and 'strides' ({len(self.strides)}) must "
                "have one entry per stage"
            )
        self._check_family()

    def _check_family(self) -> None:
        """Refuses fields that contradict each other (the block, stem or version they need)."""
        if self.zero_init_residual and self.version != "v1":
            raise ConfigError(
                "model field 'zero_init_residual' needs version v1: a v2 residual "
                "branch ends in a convolution, not a BatchNorm"
            )
        self._check_kinds()
        if self.stem_kind.check is not None:
            self.stem_kind.check(self)
        if self.stem_widths and "stem_widths" not in self.stem_kind.fields:
            readers = " or ".join(k.name for k in kinds.STEMS.values() if "stem_widths" in k.fields)
            raise ConfigError(
                f"model field 'stem_widths' belongs to stem={readers}; this model's stem is "
                f"{self.stem}"
            )
        if self.replace_stem_pool and not self.init_max_pool:
            raise ConfigError(
                "model field 'replace_stem_pool' replaces the stem's max-pool, and this "
                "model has none (init_max_pool is false)"
            )
        for stage, width in enumerate(self.widths, start=1):
            if self.block_kind.grouped and width * self.base_width % 64:
                raise ConfigError(
                    f"model.groups={self.groups}, base_width={self.base_width}: stage{stage}'s "
                    f"width {width} gives {width * self.base_width / 64:g} channels per group "
                    "(width * base_width / 64), not a whole number; pick widths or a "
                    "base_width whose product is a multiple of 64"
                )

    def _check_kinds(self) -> None:
        """Refuses fields the block kind has no place for, and attention it does not take."""
        unit = self.block_kind
        changed = changed_from_defaults(self, unit.fixed)
        if changed:
            raise ConfigError(
                f"model field '{changed[0]}' does not apply to block={unit.name} "
                f"({unit.about}); drop it"
            )
        if not unit.grouped and (self.groups != 1 or self.base_width != 64):
            grouped = " or ".join(name for name, kind in kinds.BLOCKS.items() if kind.grouped)
            raise ConfigError(
                f"model fields 'groups' and 'base_width' shape a {grouped}'s 3x3 conv; this "
                f"model has {unit.name} blocks: widen a {unit.name} block with 'widths', or "
                f"use block={grouped}"
            )
        attention = kinds.ATTENTIONS[self.attention]
        if attention.blocks is not None and unit.name not in attention.blocks:
            taking = [
                name
                for name, kind in kinds.ATTENTIONS.items()
                if kind.blocks is None or unit.name in kind.blocks
            ]
            raise ConfigError(
                f"model field 'attention' {attention.name} works with block "
                f"{', '.join(attention.blocks)}; this model has block={unit.name}: use one of "
                f"those, or another attention ({', '.join(taking)})"
            )

    @property
    def stem_kind(self) -> kinds.StemKind:
        """The registered facts of `stem` (`nets/kinds.py`)."""
        return kinds.STEMS[self.stem]

    @property
    def block_kind(self) -> kinds.BlockKind:
        """The registered facts of `block` (`nets/kinds.py`)."""
        return kinds.BLOCKS[self.block]

    @property
    def expansion(self) -> int:
        """How much wider a unit's output is than its stage width."""
        return self.block_kind.expansion

    @property
    def depth(self) -> int:
        """Weighted layers as the papers count them: the stem once (ResNet-50-D is a ResNet-50)."""
        return 1 + self.block_kind.depth(self.units) + 1

    @property
    def default_image_size(self) -> int:
        """The input size the family was designed for: 224 (ImageNet) or 32."""
        return 224 if self.init_max_pool else 32

    def stem_channels(self) -> tuple[int, ...]:
        """The output widths of the stem's convolutions, in order."""
        return tuple(width for _, width in self.stem_kind.convs(self))

    def inner_width(self, width: int) -> int:
        """A unit's inner width (its 3x3 conv's) at stage width `width`."""
        return self.block_kind.inner_width(width, self.groups, self.base_width)

    def stage_channels(self) -> tuple[int, ...]:
        """The number of channels each stage outputs."""
        return tuple(width * self.expansion for width in self.widths)


# The help of `block` and `attention` lists the registered kinds (docs/config.md
# is generated from this docstring). Python -OO drops docstrings.
if ResNetConfig.__doc__:
    ResNetConfig.__doc__ = (
        ResNetConfig.__doc__.replace("{block_kinds}", kinds.choices_help(kinds.BLOCKS))
        .replace("{attention_kinds}", kinds.choices_help(kinds.ATTENTIONS))
        .replace("{stem_kinds}", kinds.choices_help(kinds.STEMS))
    )
