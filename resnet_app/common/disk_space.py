"""A full disk, told apart from a full memory (both `ResourceExhaustedError`), in one line."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil

from resnet_app.common.errors import ConfigError

# What the OS says (strerror) for a full disk or quota, as TensorFlow quotes it.
_DISK_FULL_TEXTS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))
# The ops that write a checkpoint's files.
SAVE_OPS = ("SaveV2", "MergeV2Checkpoints", "SaveSlices", "WriteFile")
# A save warns when less than this many checkpoints' worth of space is free.
LOW_SPACE_CHECKPOINTS = 2


class DiskFullError(ConfigError):
    """A save (or write) found no space left: the run stops, nothing already saved is lost."""


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` is a full disk or quota (not a full memory)."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(error)
    if "OOM when allocating" in text or not any(op in text for op in SAVE_OPS):
        return False  # A kernel's allocation, not a file's write.
    return any(t in text for t in _DISK_FULL_TEXTS)


def free_bytes(directory: str) -> int | None:
    """The space free to this user under `directory` (None when it cannot be read)."""
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def files_size(paths: list[str]) -> int:
    """The summed size of `paths` (files that vanished count 0)."""
    total = 0
    for path in paths:
        with contextlib.suppress(OSError):
            total += os.path.getsize(path)
    return total


def format_bytes(size: int | None) -> str:
    """1536 -> "1.5 KiB"; None -> "unknown"."""
    if size is None:
        return "unknown"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
