"""Checks of a user's values that several commands and configs share.

Each raises `ConfigError` with the one-line message every entry point uses
for that mistake, so the same mistake reads the same everywhere.
"""

from __future__ import annotations

from resnet_app.common.fields import whole_at_least


def at_least(name: str, value: int | None, minimum: int = 1) -> None:
    """Refuses a flag's number below `minimum`, as a config field's `Rule` would:
    "NAME must be a whole number >= MINIMUM, got VALUE".

    Args:
      name: how the user wrote the setting, e.g. "--top_k" or "shuffle_buffer".
      value: its value; None (unset, a default applies) passes.
      minimum: the smallest value allowed.

    Raises:
      ConfigError: naming the setting, its value and the bound.
    """
    if value is not None:
        whole_at_least(minimum).check(name, value)
