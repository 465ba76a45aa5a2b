"""Files written whole and durably, and derived-data caches read safely.

A write goes to a temporary file beside the destination (its name holds the
writer's pid), fsynced, renamed over it, then the directory is fsynced: a reader
sees the old or the new file, and after a power cut the new one is there.
`sync_*` give the same guarantee to files TensorFlow writes.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import shutil
import zipfile
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

from absl import logging

from resnet_app.common.errors import first_line

T = TypeVar("T")
# What a truncated or corrupted .npz raises while it is opened or read.
DAMAGED_NPZ = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error)
TEMPORARY = ".{pid}.tmp"  # A writer's temporary file: `path + TEMPORARY.format(pid=...)`.


def write_atomically(path: str, write: Callable[[str], None]) -> None:
    """Calls `write(temporary_path)`, syncs it and renames it to `path`; on a failure
    `path` is as it was."""
    remove_leftovers(path)
    temporary = path + TEMPORARY.format(pid=os.getpid())
    try:
        write(temporary)
        sync_file(temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    sync_directory(os.path.dirname(path) or ".")


def remove_leftovers(path: str) -> list[str]:
    """Removes the temporary files of `path` that dead writers left (a live one's stays)."""
    removed = []
    for leftover in left_by_dead_writers(path, TEMPORARY):
        with contextlib.suppress(OSError):
            os.unlink(leftover)
            removed.append(leftover)
    return removed


def left_by_dead_writers(path: str, suffix: str) -> list[str]:
    """The siblings `path + suffix.format(pid=N)` whose process N is gone, sorted."""
    before, _, after = suffix.partition("{pid}")
    name = re.compile(re.escape(os.path.basename(path) + before) + r"(\d+)" + re.escape(after))
    found = []
    for candidate in sorted(glob.glob(glob.escape(path + before) + "*" + glob.escape(after))):
        match = name.fullmatch(os.path.basename(candidate))
        if match and not process_alive(int(match.group(1))):
            found.append(candidate)
    return found


def process_alive(pid: int) -> bool:
    """Whether a process `pid` runs on this machine (ours or another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def sync_file(path: str) -> None:
    """Makes the content of the file at `path` durable (fsync)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_directory(path: str) -> None:
    """Makes the names in directory `path` durable (EINVAL etc.: the filesystem's guarantees)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def sync_tree(path: str) -> None:
    """Syncs every file under the directory `path`, then each directory, deepest first."""
    for root, _, names in os.walk(path, topdown=False):
        for name in names:
            sync_file(os.path.join(root, name))
        sync_directory(root)


def replace_directory(final: str, staged: str, aside: str, fill: Callable[[str], None]) -> None:
    """Replaces the directory `final` whole, durably: a crash leaves the old or the new.

    `fill(staged)` fills the empty `staged`, which is synced; `final` is renamed to
    `aside`, `staged` to `final`, and `aside` removed (readers look there too).
    """
    parent = os.path.dirname(final) or "."
    shutil.rmtree(staged, ignore_errors=True)
    try:
        os.makedirs(staged)
        fill(staged)
        sync_tree(staged)
        if os.path.isdir(final):
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(final, aside)
        os.replace(staged, final)
        sync_directory(parent)
        shutil.rmtree(aside, ignore_errors=True)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
        if not os.path.isdir(final) and os.path.isdir(aside):
            with contextlib.suppress(OSError):
                os.replace(aside, final)  # A failed swap: the old one back in its place.


def swap_directories(final: str) -> tuple[str, str]:
    """This process's (staged, aside) directories for replacing `final` whole."""
    return f"{final}.partial-{os.getpid()}", f"{final}.old-{os.getpid()}"


def swap_leftovers(final: str) -> tuple[list[str], list[str]]:
    """(staged, aside) directories interrupted replacements of `final` left, oldest first."""

    def oldest_first(suffix: str) -> list[str]:
        found = []
        for path in glob.glob(glob.escape(final + suffix) + "*"):
            with contextlib.suppress(OSError):  # Gone since the listing: not left over.
                found.append((os.stat(path).st_mtime, path))
        return [path for _, path in sorted(found)]

    return oldest_first(".partial-"), oldest_first(".old-")


def find_complete(final: str, record: str) -> str | None:
    """`final` once complete (it holds the file `record`), else the newest copy a crash
    left aside mid-swap (`<final>.old-<pid>/`), else None."""
    for directory in [final, *reversed(swap_leftovers(final)[1])]:
        if os.path.isfile(os.path.join(directory, record)):
            return directory
    return None


def recover_directory(final: str, record: str) -> str | None:
    """Puts back the copy of `final` a crash left aside (returned; None if none), and
    removes unfinished copies."""
    found = find_complete(final, record)
    if found is not None and found != final:
        shutil.rmtree(final, ignore_errors=True)  # Incomplete: it has no record.
        os.replace(found, final)
    staged, aside = swap_leftovers(final)
    for path in staged + aside:
        shutil.rmtree(path, ignore_errors=True)
    return found if found != final else None


def save_figure(figure: Any, path: str, dpi: int = 100) -> None:
    """Writes a matplotlib `figure` to `path` whole, in the format of its extension (PNG
    if none)."""
    file_format = os.path.splitext(path)[1][1:].lower() or "png"
    write_atomically(path, lambda temporary: figure.savefig(temporary, format=file_format, dpi=dpi))


def write_text_atomically(path: str, text: str) -> None:
    """Writes `text` to `path` whole."""

    def write(temporary: str) -> None:
        with open(temporary, "w") as f:
            f.write(text)

    write_atomically(path, write)


def read_cache(path: str, read: Callable[[Any], T | None]) -> T | None:
    """`read(np.load(path))` for a cache of derived data; None when missing, stale (`read`
    returns None) or damaged (one warning): the caller rebuilds it."""
    import numpy as np

    remove_leftovers(path)  # A killed rebuild's temporary file, however large.
    try:
        # Our own handle: np.load leaks the one it opens when the zip is damaged.
        with open(path, "rb") as file, np.load(file, allow_pickle=False) as cached:
            return read(cached)
    except FileNotFoundError:
        return None
    except DAMAGED_NPZ as error:
        reason = first_line(error, with_type=True)
        logging.warning("The cache file %s is damaged (%s); rebuilding it", path, reason)
        return None
