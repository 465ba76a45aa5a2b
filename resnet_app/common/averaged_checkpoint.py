"""A run's averaged checkpoint (`resnet-app average`): `averaged/`, replaced whole.

It holds `avg-<step>` (only its `model`) and `averaged.json`; `--checkpoint=averaged`
picks it.
"""

from __future__ import annotations

import json
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
    name = checkpoint_name(step)

    def fill(staged: str) -> None:
        save(os.path.join(staged, name))
        content = json.dumps({**record, "step": step, "checkpoint": name}, indent=1)
        files.write_text_atomically(os.path.join(staged, FILE), content)

    files.replace_directory(final, *files.swap_directories(final), fill)
    return os.path.join(final, name)


def read(model_dir: str) -> tuple[str, dict[str, Any]] | None:
    """(its directory, `averaged.json`): `averaged/` once complete, else one a crash left
    aside mid-swap; None without one."""
    directory = files.find_complete(os.path.join(model_dir, DIR), FILE)
    if directory is None:
        return None
    return directory, run_dir.read_kept_record(
        os.path.join(directory, FILE), "run resnet-app average again"
    )


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
