"""The training config: one typed tree of defaults, YAML recipes and `--set KEY=VALUE`."""

# ruff: noqa: F401 - the names below are the package's interface.

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
