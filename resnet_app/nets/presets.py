"""The named ResNets: one `register` line each, over `ResNetConfig` (`nets/spec.py`).

Pure data, importable without TensorFlow, so that tools check a model name
before importing it. A preset sets only what differs from the defaults or its
family's dict.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable
from typing import Any

from resnet_app.common.errors import ConfigError
from resnet_app.nets import kinds
from resnet_app.nets.spec import ResNetConfig

__all__ = ["ResNetConfig", "PRESETS", "get_config", "model_names", "part_names"]

STEM, HEAD = "stem", "head"  # The parts around the stages (see `part_names`).

PRESETS: dict[str, dict[str, Any]] = {}


def register(name: str, *families: dict[str, Any], **fields: Any) -> None:
    """Adds preset `name`: its families' fields, then `fields`, over the defaults."""
    PRESETS[name] = {key: value for part in (*families, fields) for key, value in part.items()}


# The two input families. CIFAR's is ResNetConfig's default stem (3x3/1, 16).
_CIFAR = dict(widths=(16, 32, 64), strides=(1, 2, 2), num_classes=10)
_IMAGENET = dict(
    widths=(64, 128, 256, 512),
    strides=(1, 2, 2, 2),
    stem_filters=64,
    stem_kernel=7,
    init_stride=2,
    init_max_pool=True,
    shortcut="projection",
    num_classes=1000,
)
# ImageNet depths: (block, units per stage), He et al. 2015 table 1 (200: 2016).
_DEPTHS = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
    200: ("bottleneck", (3, 24, 36, 3)),
}
# Bello et al. 2021 table 7 (timm's resnetrs*): deeper, in 4 stages.
_RS_UNITS = {
    **{depth: _DEPTHS[depth][1] for depth in (50, 101, 152, 200)},
    270: (4, 29, 53, 4),
    350: (4, 36, 72, 4),
    420: (4, 44, 87, 4),
}
# The tweaks of He et al. 2019 ("Bag of Tricks"), as timm names them: C, a deep
# 3x3 stem (32, 32, 64); D, that and an average-pool shortcut; S, a deep stem
# twice as wide (64, 64, 128).
_C = dict(stem="deep")
_D = dict(stem="deep", shortcut="avg_projection")
_S = dict(stem="deep", stem_filters=128)
_SE = dict(attention="se")  # Hu et al. 2018: reduction 16.
_ECA = dict(attention="eca")  # Wang et al. 2020.
# ResNet-RS (Bello et al. 2021): the D stem and shortcut, the stem's max-pool
# replaced by a strided conv, squeeze-excitation at 1/4.
_RS = dict(_D, replace_stem_pool=True, attention="se", se_ratio=0.25)


def _depth(depth: int) -> dict[str, Any]:
    block, units = _DEPTHS[depth]
    return dict(_IMAGENET, block=block, units=units)


_CIFAR_V2 = dict(_CIFAR, version="v2", shortcut="projection")
# ResNeXt-29 on CIFAR (Xie et al. 2017, 5.3): a 64-wide stem, 3 stages of 3 bottlenecks.
_RESNEXT29 = dict(
    _CIFAR, block="bottleneck", shortcut="projection", stem_filters=64, units=(3, 3, 3)
)

# He et al. 2015, 4.2: depth 6n+2 in basic units (resnet14, n = 2, is the quickstart's).
for _n in (14, 20, 32, 44, 56, 110, 1202):
    register(f"resnet{_n}", _CIFAR, units=((_n - 2) // 6,) * 3)
for _n in (164, 1001):  # He et al. 2016: depth 9n+2 in pre-activation bottlenecks.
    register(f"preact_resnet{_n}", _CIFAR_V2, block="bottleneck", units=((_n - 2) // 9,) * 3)
# Zagoruyko & Komodakis 2016: WRN-d-k, (d - 4) / 6 pre-activation basic units per stage.
for _d, _k in ((16, 4), (16, 8), (22, 8), (28, 10), (40, 4)):
    register(
        f"wrn{_d}_{_k}", _CIFAR_V2, units=((_d - 4) // 6,) * 3, widths=(16 * _k, 32 * _k, 64 * _k)
    )
register("resnext29_8x64d", _RESNEXT29, widths=(64, 128, 256), groups=8, base_width=64)
register("resnext29_16x64d", _RESNEXT29, widths=(64, 128, 256), groups=16, base_width=64)
for _n in _DEPTHS:
    register(f"resnet{_n}", _depth(_n))
for _n in _DEPTHS:  # Every He et al. ImageNet ResNet also comes pre-activated (2016).
    register(f"resnet{_n}_v2", _depth(_n), version="v2")
# torchvision's ResNeXt and wide ResNets (Xie et al. 2017; Zagoruyko & Komodakis 2016).
register("resnext50_32x4d", _depth(50), groups=32, base_width=4)
register("resnext101_32x4d", _depth(101), groups=32, base_width=4)
register("resnext101_32x8d", _depth(101), groups=32, base_width=8)
register("resnext101_64x4d", _depth(101), groups=64, base_width=4)
register("wide_resnet50_2", _depth(50), base_width=128)
register("wide_resnet101_2", _depth(101), base_width=128)
# timm's ResNet-C/D/S, SE and ECA variants and ResNet-RS.
for _n in _DEPTHS:
    register(f"resnet{_n}d", _depth(_n), _D)
register("resnext50d_32x4d", _depth(50), _D, groups=32, base_width=4)
register("resnet50c", _depth(50), _C)
register("resnet50s", _depth(50), _S)
for _n in (50, 101, 152):
    register(f"seresnet{_n}", _depth(_n), _SE)
register("seresnext50_32x4d", _depth(50), _SE, groups=32, base_width=4)
register("seresnext101_32x8d", _depth(101), _SE, groups=32, base_width=8)
for _n in (50, 101):
    register(f"ecaresnet{_n}d", _depth(_n), _D, _ECA)
for _n, _units in _RS_UNITS.items():
    register(f"resnetrs{_n}", _depth(50), _RS, units=_units)
# Page 2018's ResNet-9, the DAWNBench CIFAR-10 network (`nets/conv_pool.py`):
# each stage's first unit a conv-pool, its later ones residuals; global
# max-pool and a bias-free linear head scaled by 1/8; weight decay 5e-4.
register(
    "resnet9",
    _CIFAR,
    block="conv_pool",
    units=(2, 1, 2),
    widths=(128, 256, 512),
    strides=(2, 2, 2),
    stem_filters=64,
    head_pool="max",
    head_bias=False,
    logit_scale=0.125,
    weight_decay=5e-4,
)
# A test-only network: one stage of one unit with a few filters, built in
# milliseconds. Not meant for real training, so not offered to users.
register("tiny", units=(1,), widths=(4,), strides=(1,), stem_filters=4)
TEST_ONLY = ("tiny",)

# Fields that only shape another kind of network: set on this one, they
# would do nothing, so a preset that does not have that kind refuses them.
# {field: (the field that picks the kind, the kinds that read it, what it sets)};
# the attention kinds' own fields join from their registry (`_only_with`).
_ONLY_WITH = {"activate_before_residual": ("version", ("v2",), "a pre-activation shortcut's input")}


def _only_with() -> dict[str, tuple[str, tuple[str, ...], str]]:
    """`_ONLY_WITH` and the fields each registered stem and attention kind reads
    (`nets/kinds.py`)."""
    rules = dict(_ONLY_WITH)
    for key, registry in (("stem", kinds.STEMS), ("attention", kinds.ATTENTIONS)):
        for kind in registry.values():
            for field, what in kind.fields.items():
                _, needed, what = rules.get(field, (key, (), what))
                rules[field] = (key, (*needed, kind.name), what)
    return rules


def _check_family(name: str, config: ResNetConfig, overrides: dict[str, Any]) -> None:
    """Refuses an override that the network `name` resolves to would ignore."""
    for field, (key, needed, what) in _only_with().items():
        if field in overrides and getattr(config, key) not in needed:
            raise ConfigError(
                f"model field '{field}' sets {what}, but {name} has {key}={getattr(config, key)}; "
                f"drop it, or also set model.{key}={' or '.join(needed)}"
            )


def model_names(include_test_only: bool = False) -> list[str]:
    """Preset names, in table order (with `include_test_only`, the tests' too)."""
    return [name for name in PRESETS if include_test_only or name not in TEST_ONLY]


def get_config(name: str, **overrides: Any) -> ResNetConfig:
    """The validated config of preset `name` with `ResNetConfig` fields `overrides`
    (ConfigError for an unknown preset, an unknown field or a bad value)."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, model_names(), n=3)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise ConfigError(f"unknown model '{name}'{hint}; valid models: {', '.join(model_names())}")
    fields = {field.name for field in dataclasses.fields(ResNetConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ConfigError(
            f"unknown model field(s) {', '.join(unknown)}; valid fields: "
            f"{', '.join(sorted(fields))}"
        )
    config = ResNetConfig(**{**PRESETS[name], **overrides})
    _check_family(name, config, overrides)
    return config


def part_names(num_stages: int) -> list[str]:
    """The parts of a network with `num_stages` stages, input to output (`nets/parts.py`)."""
    return [STEM, *(f"stage{stage}" for stage in range(1, num_stages + 1)), HEAD]


def check_parts(key: str, parts: Iterable[str], num_stages: int, model_name: str) -> None:
    """Refuses (ConfigError) the first part name the network does not have."""
    valid = part_names(num_stages)
    for part in parts:
        if part not in valid:
            raise ConfigError(
                f"{key} names part {part!r}, which {model_name} does not have; "
                f"its parts are {', '.join(valid)}"
            )
