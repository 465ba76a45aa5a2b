"""Checks of a user's values that several commands share, worded as a config field's `Rule`."""

from __future__ import annotations

from resnet_app.common.fields import whole_at_least


def at_least(name: str, value: int | None, minimum: int = 1) -> None:
    """Refuses a value below `minimum` as a field's `Rule` would; None (unset) passes."""
    if value is not None:
        whole_at_least(minimum).check(name, value)
