"""A run's averaged checkpoint (`resnet-app average`): `averaged/`, replaced whole.

It holds `avg-<step>` (only its `model`) and `averaged.json`; `--checkpoint=averaged`
picks it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

from resnet_app.common import files, run_dir
from resnet_app.common.errors import ConfigError

DIR = "averaged"
FILE = "averaged.json"
CHOICE = "averaged"  # --checkpoint=averaged


def checkpoint_name(step: int) -> str:
    return f"avg-{step}"


def write(model_dir: str, step: int, save: Callable[[str], None], record: dict[str, Any]) -> str:
    """Replaces the run's averaged checkpoint, which `save(prefix)` writes, with `record`
    in `averaged.json`; returns its prefix."""
    final = os.path.join(model_dir, DIR)
    for leftover in files.swap_leftovers(final)[0]:
        shutil.rmtree(leftover, ignore_errors=True)  # Killed writers' halves.
    return run_dir.write_kept(final, FILE, checkpoint_name(step), step, record, save)


def read(model_dir: str) -> tuple[str, dict[str, Any]] | None:
    """(its directory, `averaged.json`): `averaged/` once complete, else one a crash left
    aside mid-swap; None without one."""
    return run_dir.read_kept(os.path.join(model_dir, DIR), FILE, "run resnet-app average again")


def find(model_dir: str) -> tuple[int, str]:
    """(step, prefix) of the run's averaged checkpoint; ConfigError without one."""
    found = read(model_dir)
    if found is None:
        raise ConfigError(
            f"the run {model_dir} has no averaged checkpoint ({DIR}/{FILE}): make one with "
            f"resnet-app average --model_dir={model_dir}"
        )
    directory, record = found
    return record["step"], os.path.join(directory, record["checkpoint"])
