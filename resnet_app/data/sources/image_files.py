"""Image files named by a source (a folder, a CSV table): checked once, skipped when unreadable.

A file that is not a complete JPEG, PNG, BMP or GIF image is found by its first and last
bytes, without decoding, and skipped; the count is logged once. A split whose files fit in
`data.in_memory_mb` is read into memory once.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import pathlib
import time

import numpy as np
from absl import logging

from resnet_app.common.errors import ConfigError
from resnet_app.data.sources.base import Split

IN_MEMORY_MB = 512  # data.in_memory_mb's default.
THREADS = 16
# Files are read in this thread when the first PROBE take under SLOW_SECONDS each (a local,
# cached disk, where a pool's locks cost more than the reads: docs/performance.md), else on
# the threads in chunks of PROBE (a network filesystem's latency overlaps).
PROBE, SLOW_SECONDS = 512, 50e-6

_MAGIC = {
    b"\xff\xd8\xff": "jpeg",
    b"\x89PNG\r\n\x1a\n": "png",
    b"GIF87a": "gif",
    b"GIF89a": "gif",
    b"BM": "bmp",
}


def in_memory_bytes(config) -> int:
    """The size of a split's files that is read into memory once (`data.in_memory_mb`)."""
    return (IN_MEMORY_MB if config is None else config.in_memory_mb) << 20


def image_format(head: bytes) -> str | None:
    """ "jpeg", "png", "gif" or "bmp" from an image's first bytes (None: none of them)."""
    return next((name for magic, name in _MAGIC.items() if head.startswith(magic)), None)


def _inspect(path: str) -> tuple[str | None, int]:
    """(the image's format, "jpeg", "png", "gif", "bmp" or None if unreadable; its size).

    The format is the magic number of the first bytes, whatever the extension; a complete
    JPEG, PNG or GIF has its end marker in the last kilobyte, and a BMP is as long as its
    header says. This catches empty, foreign and truncated files without decoding them.
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as file:
            head = file.read(16)
            file.seek(max(0, size - 1024))
            tail = file.read()
    except OSError:
        return None, 0
    kind = image_format(head)
    complete = {
        "jpeg": b"\xff\xd9" in tail,
        "png": b"IEND" in tail,
        "gif": b";" in tail[-16:],
        "bmp": len(head) >= 6 and size >= int.from_bytes(head[2:6], "little"),
    }
    return (kind if kind and complete[kind] else None), size


class FileSplits:
    """Builds the splits of the source `dataset` from (paths, labels), counting what it skips;
    files are read into memory when a split's fit in `limit_bytes`."""

    def __init__(self, dataset: str, limit_bytes: int):
        self.dataset, self.limit_bytes = dataset, limit_bytes
        self.skipped, self.total, self.first_bad = 0, 0, None
        self._pool = concurrent.futures.ThreadPoolExecutor(THREADS)

    def split(self, name: str, paths: list[str], labels: np.ndarray, where: str) -> Split:
        """The split of the readable files among `paths`, with their `labels` (int64 [N] or
        multi-hot [N, classes]); `where` names the listing when none is readable."""
        formats, sizes = zip(*self._map(_inspect, paths)) if paths else ((), ())
        good = np.array([i for i, kind in enumerate(formats) if kind is not None], np.int64)
        bad = [paths[i] for i, kind in enumerate(formats) if kind is None]
        self.skipped, self.total = self.skipped + len(bad), self.total + len(paths)
        self.first_bad = self.first_bad or (bad[0] if bad else None)
        if not len(good):
            raise ConfigError(f"--dataset={self.dataset}: no readable images in {where}")
        files = np.array(paths)[good]
        contents = None
        if sum(sizes[i] for i in good) <= self.limit_bytes:
            read = self._map(lambda path: pathlib.Path(path).read_bytes(), list(files))
            contents = np.array(read, dtype=object)
        return Split(name, len(files), labels=labels[good], files=files, contents=contents)

    def _map(self, function, paths: list) -> list:
        """`function` of each path, in order: see PROBE."""
        began = time.perf_counter()
        done = [function(path) for path in paths[:PROBE]]
        if time.perf_counter() - began < SLOW_SECONDS * len(done):
            return done + [function(path) for path in paths[PROBE:]]
        chunks = [paths[i : i + PROBE] for i in range(PROBE, len(paths), PROBE)]
        rest = self._pool.map(lambda chunk: [function(path) for path in chunk], chunks)
        return done + list(itertools.chain.from_iterable(rest))

    def finish(self) -> None:
        """Logs the skipped files once."""
        self._pool.shutdown()
        if self.skipped:
            logging.warning(
                "%s: skipped %d of %d files that are not complete JPEG, PNG, BMP or GIF "
                "images (the first: %s)",
                self.dataset,
                self.skipped,
                self.total,
                self.first_bad,
            )
