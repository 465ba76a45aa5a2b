"""Checks of a user's values that several commands and configs share.

Each raises `ConfigError` with the one-line message every entry point uses
for that mistake, so the same mistake reads the same everywhere.
"""

from __future__ import annotations

from resnet_app.common.errors import ConfigError


def at_least(name: str, value: int | float | None, minimum: int = 1) -> None:
    """Refuses a number below `minimum`: "NAME=VALUE; use MINIMUM or more".

    Args:
      name: how the user wrote the setting, e.g. "--top_k" or "shuffle_buffer".
      value: its value; None (unset, a default applies) passes.
      minimum: the smallest value allowed.

    Raises:
      ConfigError: naming the setting, its value and the bound.
    """
    if value is not None and value < minimum:
        raise ConfigError(f"{name}={value}; use {minimum} or more")
