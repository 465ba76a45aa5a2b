"""Old configs and run files read in today's shapes: the one migration step.

Applied where a file or a layer of settings is read; nothing after loading knows
an old name. So far: the data section's augmentation and mixing keys moved
under `data.augment` and `data.mix` (data_info.json's "preprocessing" alike),
and the model's `init_filter` is `stem_kernel`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_AUGMENT_KEYS = (
    "crop_padding",
    "flip",
    "area_range",
    "aspect_ratio_range",
    "randaugment_ops",
    "randaugment_magnitude",
    "randaugment_prob",
    "randaugment_magnitude_std",
    "erase_probability",
    "erase_area_range",
    "erase_aspect_range",
)

DATA_KEYS: dict[str, tuple[str, str]] = {
    **{name: ("augment", name) for name in _AUGMENT_KEYS},
    "mixup_alpha": ("mix", "mixup_alpha"),
    "cutmix_alpha": ("mix", "cutmix_alpha"),
    "mix_switch_prob": ("mix", "switch_prob"),
    "mix_mode": ("mix", "mode"),
}
MODEL_KEYS: dict[str, str] = {"init_filter": "stem_kernel"}


def model_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """A model section or `ResNetConfig` mapping with today's names; a key given
    by today's name wins over its old name."""
    renamed = {MODEL_KEYS.get(key, key): value for key, value in values.items()}
    renamed.update({key: value for key, value in values.items() if key not in MODEL_KEYS})
    return renamed


def _moved(values: Mapping[str, Any], keys: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    """`values` with each old key moved into its group; a key given in its group wins."""
    nested: dict[str, Any] = {}
    for key, value in values.items():
        if key in keys:
            group, name = keys[key]
            nested.setdefault(group, {}).setdefault(name, value)
    for key, value in values.items():
        if key in keys:
            continue
        if isinstance(value, Mapping) and isinstance(nested.get(key), Mapping):
            nested[key] = {**nested[key], **value}
        else:
            nested[key] = value
    return nested


def config_section(section: str, values: Mapping[str, Any]) -> Mapping[str, Any]:
    """A config section's keys in today's shape: ("data", {"flip": False}) ->
    {"augment": {"flip": False}}."""
    if section == "data":
        return _moved(values, DATA_KEYS)
    return model_fields(values) if section == "model" else values


def preprocessing(values: Mapping[str, Any]) -> dict[str, Any]:
    """data_info.json's "preprocessing" record in today's shape (the augmentation nested)."""
    return _moved(values, {name: ("augment", name) for name in _AUGMENT_KEYS})
