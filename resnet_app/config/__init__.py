"""The training config: one typed tree of defaults, YAML recipes and `--set KEY=VALUE`.

A recipe in `configs/` overrides a few fields; `--set section.key=value`
overrides any one (the value is read as YAML: `0.1`, `true`, `[30, 60]`).
Unknown sections and keys, wrong types and impossible values raise a
`ConfigError` naming the key, before TensorFlow loads.

Modules:
- `sections`: `Config` and its sections (train, sync, model), every default.
- `optimizer_kinds`, `schedule_kinds`: the one-of `optimizer:` and `schedule:`
  sections, a dataclass per kind.
- `oneof`: typed sections that read as mappings; one-of kinds; alternative keys.
- (`common/fields.py`: a field's type from `typing.get_type_hints`, values checked.)
- `loading`: YAML text, recipe files and `--set` assignments.
- `layers`: defaults, file, `--set`s and flags merged into a `Config`.
- `run_config`: `config.yaml` in a run directory.
- `differences`: what differs between two configs; what a resume may change.
"""

from resnet_app.config.differences import RESUMABLE_CHANGES, changes
from resnet_app.config.layers import build, from_dict, merge, resolve, set_layer
from resnet_app.config.loading import dump_yaml, load_yaml, parse_set, read_yaml
from resnet_app.config.optimizer_kinds import OptimizerSection
from resnet_app.config.run_config import (
    CONFIG_FILE,
    from_yaml,
    read_run_config,
    to_yaml,
    write_yaml,
)
from resnet_app.config.schedule_kinds import ScheduleSection
from resnet_app.config.sections import (
    DERIVED_PRECISION,
    MAX_ROLLBACKS,
    ON_NAN,
    PRECISIONS,
    SECTIONS,
    SYNC_MODES,
    Config,
    ModelSection,
    SyncSettings,
    TrainSettings,
)

__all__ = [
    "CONFIG_FILE",
    "DERIVED_PRECISION",
    "MAX_ROLLBACKS",
    "ON_NAN",
    "PRECISIONS",
    "RESUMABLE_CHANGES",
    "SECTIONS",
    "SYNC_MODES",
    "Config",
    "ModelSection",
    "OptimizerSection",
    "ScheduleSection",
    "SyncSettings",
    "TrainSettings",
    "build",
    "changes",
    "dump_yaml",
    "from_dict",
    "from_yaml",
    "load_yaml",
    "merge",
    "parse_set",
    "read_run_config",
    "read_yaml",
    "resolve",
    "set_layer",
    "to_yaml",
    "write_yaml",
]
