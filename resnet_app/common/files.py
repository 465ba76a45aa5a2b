"""Files written whole: a reader sees the previous file or the new one, never half.

The content goes to a temporary file beside the destination (same directory,
so the rename cannot cross filesystems), which is then renamed over it. The
process id in the temporary name keeps concurrent writers apart; a plain
open() (not mkstemp, which makes files private) keeps the usual permissions.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable


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
