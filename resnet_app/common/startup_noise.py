"""TensorFlow's harmless start-up lines, kept off the terminal.

TensorFlow's C++ code prints a few lines while it loads, before absl logging
is initialized, so `TF_CPP_MIN_LOG_LEVEL` cannot silence them: absl's
"All log messages before absl::InitializeLog()" warning, the oneDNN notice,
the CPU-instructions notice, and on a machine without a GPU "Could not find
cuda drivers" and "failed call to cuInit". A user who made a mistake should
see the one `error:` line, not these.

`install()` puts a filter on the process's stderr at the file-descriptor
level, where the C++ code writes: a pipe whose reader drops exactly those
lines and passes every other byte through unchanged, in order. The cuInit
line passes on a machine that has an NVIDIA device, where it means a broken
driver. `--verbosity=1` (or more), or RESNET_APP_TF_STARTUP=show, shows them all.
"""

from __future__ import annotations

import atexit
import glob
import os
import re
import sys
import threading

SHOW_ENV = "RESNET_APP_TF_STARTUP"
# A C++ log line's prefix: severity, date, time, thread id.
_PREFIX = r"[IWE]\d{4} \d+:\d+:\d+\.\d+\s+\d+ "
HARMLESS = tuple(
    re.compile(pattern)
    for pattern in (
        r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
        r"STDERR$",
        _PREFIX + r"port\.cc:\d+\] oneDNN custom operations are on\. ",
        _PREFIX + r"cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will "
        r"not be used\.$",
        _PREFIX + r"cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized to use "
        r"available CPU instructions in performance-critical operations\.$",
        r"To enable the following instructions: [A-Z0-9_ ]+, in other operations, rebuild "
        r"TensorFlow with the appropriate compiler flags\.$",
    )
)
# Harmless only where there is no GPU to initialize.
WITHOUT_GPU = (re.compile(_PREFIX + r"cuda_platform\.cc:\d+\] failed call to cuInit: "),)
_DRAIN_SECONDS = 2.0


def has_nvidia_device() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def is_harmless(line: str, gpu: bool) -> bool:
    """Whether `line` (without its newline) is one of TensorFlow's known start-up lines."""
    patterns = HARMLESS if gpu else HARMLESS + WITHOUT_GPU
    return any(pattern.match(line) for pattern in patterns)


class LineFilter:
    """Bytes in, bytes out: complete lines that are not harmless, in order."""

    def __init__(self, gpu: bool):
        self._gpu = gpu
        self._partial = b""

    def feed(self, data: bytes) -> bytes:
        """What of `data` to write now (an unfinished last line waits for its end)."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        kept = [line + b"\n" for line in lines if not self._drops(line)]
        return b"".join(kept)

    def finish(self) -> bytes:
        """The unfinished last line, at the end of the stream."""
        rest, self._partial = self._partial, b""
        return b"" if not rest or self._drops(rest) else rest

    def _drops(self, line: bytes) -> bool:
        return is_harmless(line.decode("utf-8", "replace").rstrip("\r"), self._gpu)


_installed = False
_drain = None  # Set by install(): ends the filter, writing what it holds.


def install(show_all: bool = False) -> None:
    """Filters TensorFlow's harmless start-up lines out of this process's stderr.

    Call it before TensorFlow is imported. Does nothing when `show_all`, when
    RESNET_APP_TF_STARTUP=show, or when it is already installed.

    Args:
      show_all: let every line through (`--verbosity=1` or more).
    """
    global _installed, _drain
    if _installed or show_all or os.environ.get(SHOW_ENV) == "show":
        return
    _installed = True
    sys.stderr.flush()
    terminal = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    line_filter = LineFilter(has_nvidia_device())

    def pump() -> None:
        while data := os.read(read_end, 65536):
            _write_all(terminal, line_filter.feed(data))
        _write_all(terminal, line_filter.finish())
        os.close(read_end)

    reader = threading.Thread(target=pump, name="startup_noise", daemon=True)
    reader.start()

    def drain() -> None:
        # Ends the pipe (a child process still holding it keeps it open: then
        # the reader is left after a short wait) and lets the reader write the rest.
        sys.stderr.flush()
        os.dup2(terminal, 2)
        reader.join(_DRAIN_SECONDS)

    _drain = drain
    atexit.register(drain)


def restore() -> None:
    """Ends the filter now, every line it holds written: call it before `os._exit`."""
    if _drain is not None:
        _drain()


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]
