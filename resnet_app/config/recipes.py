"""The recipes in `resnet_app/recipes/` (`configs/` links there), found by name anywhere."""

from __future__ import annotations

import os

from resnet_app.common.errors import ConfigError

RECIPE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes")
SUFFIX = ".yaml"


def names() -> list[str]:
    """The packaged recipes' names (their file names without `.yaml`), sorted."""
    if not os.path.isdir(RECIPE_DIR):
        return []
    return sorted(f[: -len(SUFFIX)] for f in os.listdir(RECIPE_DIR) if f.endswith(SUFFIX))


def find(config: str) -> str:
    """The file `--config=CONFIG` names: a path, or a packaged recipe (ConfigError lists them)."""
    if os.path.isfile(config):
        return config
    name = config[: -len(SUFFIX)] if config.endswith(SUFFIX) else config
    if os.sep not in name and "/" not in name and name in names():
        return os.path.join(RECIPE_DIR, name + SUFFIX)
    raise ConfigError(
        f"config file {config} not found; give a path to a YAML file or a packaged recipe: "
        f"{', '.join(names())}"
    )
