"""The recipes that ship inside the package, found by name from any directory.

`--config=cifar10_resnet56` (or `cifar10_resnet56.yaml`) names the packaged
recipe `resnet_app/recipes/cifar10_resnet56.yaml`; a path to a file, such as
`configs/cifar10_resnet56.yaml` or `my_recipe.yaml`, is read as it is. A file
that exists wins over a packaged name. (`configs/` at the repository's root is a
link to `resnet_app/recipes/`.)
"""

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
    """The file that `--config=CONFIG` names: a path to a file, or a packaged recipe.

    Args:
      config: a path, or a packaged recipe's name with or without `.yaml`.

    Returns:
      The path of the file to read.

    Raises:
      ConfigError: when `config` is neither an existing file nor a packaged
        recipe; the line lists the packaged recipes.
    """
    if os.path.isfile(config):
        return config
    name = config[: -len(SUFFIX)] if config.endswith(SUFFIX) else config
    if os.sep not in name and "/" not in name and name in names():
        return os.path.join(RECIPE_DIR, name + SUFFIX)
    raise ConfigError(
        f"config file {config} not found; give a path to a YAML file or a packaged recipe: "
        f"{', '.join(names())}"
    )
