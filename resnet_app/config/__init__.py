"""The training config: one typed tree of defaults, YAML recipes and `--set KEY=VALUE`."""

from resnet_app.config.differences import RESUMABLE_CHANGES, changes
from resnet_app.config.layers import from_dict, resolve
from resnet_app.config.loading import read_yaml
from resnet_app.config.run_config import (
    CONFIG_FILE,
    from_yaml,
    read_run_config,
    to_yaml,
    write_yaml,
)
from resnet_app.config.schedule_kinds import ScheduleSection
from resnet_app.config.sections import (
    MAX_ROLLBACKS,
    PRECISIONS,
    Config,
    ModelSection,
    SyncSettings,
    TrainSettings,
)

__all__ = [
    "CONFIG_FILE",
    "MAX_ROLLBACKS",
    "PRECISIONS",
    "RESUMABLE_CHANGES",
    "Config",
    "ModelSection",
    "ScheduleSection",
    "SyncSettings",
    "TrainSettings",
    "changes",
    "from_dict",
    "from_yaml",
    "read_run_config",
    "read_yaml",
    "resolve",
    "to_yaml",
    "write_yaml",
]
