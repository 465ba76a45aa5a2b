"""Files written whole: a reader sees the previous file or the new one, never half.

Also the reading of derived-data caches (`read_cache`): a damaged one is
reported in one line and rebuilt, never a traceback in every later run.

The content goes to a temporary file beside the destination (same directory,
so the rename cannot cross filesystems), which is then renamed over it. The
process id in the temporary name keeps concurrent writers apart; a plain
open() (not mkstemp, which makes files private) keeps the usual permissions.
"""

from __future__ import annotations

import contextlib
import os
import zipfile
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

from absl import logging

from resnet_app.common.errors import first_line

T = TypeVar("T")
# What a truncated or corrupted .npz raises while it is opened or read.
DAMAGED_NPZ = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error)


def write_atomically(path: str, write: Callable[[str], None]) -> None:
    """Calls `write(temporary_path)`, then renames the result to `path`.

    On any failure the temporary file is removed and `path` is left as it was.
    """
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        write(temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_text_atomically(path: str, text: str) -> None:
    """Writes `text` to `path` whole."""

    def write(temporary: str) -> None:
        with open(temporary, "w") as f:
            f.write(text)

    write_atomically(path, write)


def read_cache(path: str, read: Callable[[Any], T | None]) -> T | None:
    """`read(np.load(path))` for a cache of derived data; None when it must be rebuilt.

    None when the file is missing, when `read` says it is stale (returns
    None), or when it is damaged (truncated, a bad checksum, an array cut
    short, a key missing): then one warning line names the file, and the
    caller rebuilds it over the damaged one.
    """
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as cached:
            return read(cached)
    except FileNotFoundError:
        return None
    except DAMAGED_NPZ as error:
        reason = first_line(error, with_type=True)
        logging.warning("The cache file %s is damaged (%s); rebuilding it", path, reason)
        return None
