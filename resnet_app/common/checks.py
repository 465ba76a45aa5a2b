"""Checks of a user's values that several commands share, worded as a config field's `Rule`."""

from __future__ import annotations

from resnet_app.common.fields import whole_at_least


def at_least(name: str, value: int | None, minimum: int = 1) -> None:
    """Refuses a number below `minimum`: "NAME must be a whole number >= MINIMUM, got VALUE".

    None (unset: a default applies) passes.
    """
    if value is not None:
        whole_at_least(minimum).check(name, value)
