"""What differs between two configs, and what a resumed run may change."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from resnet_app.common.fields import field_types, resumable_keys
from resnet_app.config.oneof import plain
from resnet_app.config.sections import Config, SyncSettings, TrainSettings
from resnet_app.data.settings import DataConfig
from resnet_app.nets import presets

# Settings a resumed run may change: the fields marked `resumable`, which do not
# change what the run computes (the run's length only where it ends: the trainer
# checks the learning rate of the steps left).
RESUMABLE_CHANGES = frozenset(
    resumable_keys(DataConfig, "data")
    | resumable_keys(TrainSettings, "train")
    | resumable_keys(SyncSettings, "sync")
)


DATA_GROUPS = frozenset(name for name, kind in field_types(DataConfig).items() if kind.nested)


def changes(old: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """{"section.key": (old, new)} for the settings that differ, as the run uses them: model
    keys as the preset resolves them, a derived value (`data.dtype`) as derived."""

    def flat(config: Config, model_keys: Iterable[str]) -> dict[str, Any]:
        tree = config.to_dict(with_derived=True)
        preset = presets.get_config(config.model_name, **config.model_overrides)
        tree["model"] = {"name": config.model_name}
        tree["model"].update({key: plain(getattr(preset, key)) for key in model_keys})
        found = {}
        for section, values in tree.items():
            for key, value in values.items():
                if section == "data" and key in DATA_GROUPS:  # data.augment.flip, ...
                    found.update({f"data.{key}.{k}": v for k, v in (value or {}).items()})
                else:
                    found[f"{section}.{key}"] = value
        return found

    model_keys = set(old.model_overrides) | set(new.model_overrides)
    before, after = flat(old, model_keys), flat(new, model_keys)
    return {
        key: (before.get(key), after.get(key))
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    }
