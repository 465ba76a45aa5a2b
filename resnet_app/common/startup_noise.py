"""TensorFlow's harmless start-up lines, kept off the terminal.

TensorFlow's C++ code prints a few notices while it loads, before absl logging
starts, so `TF_CPP_MIN_LOG_LEVEL` cannot silence them; a user who made a mistake
should see one `error:` line. `install()` points fd 2 at a forked reader that
drops exactly those lines, only while the first `import tensorflow` runs;
outside that window stderr is untouched. The reader outlives a crash of ours
and empties the pipe even if its output is gone. RESNET_APP_TF_STARTUP=show
(or `--verbosity=1`) shows them.
"""

from __future__ import annotations

import glob
import importlib.abc
import importlib.util
import os
import re
import signal
import sys
import time

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
_window = None  # Set while TensorFlow loads: (the saved stderr, the reader's pid).
_READER_WAIT_SECONDS = 2.0


def install(show_all: bool = False) -> None:
    """Filters TensorFlow's start-up lines out of stderr while the first `import tensorflow`
    runs; nothing when `show_all`, RESNET_APP_TF_STARTUP=show, or TensorFlow is loaded."""
    global _installed
    if _installed or show_all or os.environ.get(SHOW_ENV) == "show" or "tensorflow" in sys.modules:
        return
    _installed = True
    sys.meta_path.insert(0, _TensorFlowImport())


class _TensorFlowImport(importlib.abc.MetaPathFinder):
    """Finds the first `import tensorflow` and loads it with the filter on."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # Once; and the real finders below answer.
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _FilteredLoader(spec.loader)
        return spec


class _FilteredLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        _open_window()
        try:
            self._loader.exec_module(module)
            config = getattr(module, "config", None)
            if hasattr(config, "list_physical_devices"):
                config.list_physical_devices()  # TensorFlow's look for GPUs: the cuInit line.
        finally:
            restore()
            # The module names its real loader, as if imported without the filter.
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._loader
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._loader


def _open_window() -> None:
    """fd 2 into a pipe read by a forked filter process, until `restore()`."""
    global _window
    sys.stderr.flush()
    terminal = os.dup(2)
    read_end, write_end = os.pipe()
    gpu = has_nvidia_device()
    pid = os.fork()
    if pid == 0:  # The reader: only reads and writes, then leaves without cleanup.
        try:
            # A Ctrl-C or SIGTERM to the group is the trainer's; the reader ends
            # when the pipe does, after writing what it holds.
            for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(number, signal.SIG_IGN)
            os.close(write_end)
            _filter(read_end, terminal, LineFilter(gpu))
        finally:
            os._exit(0)
    os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)
    _window = (terminal, pid)


def _filter(read_end: int, terminal: int, line_filter: LineFilter) -> None:
    """Until the pipe ends: every byte read, the kept ones written while the output takes them."""
    writable = True
    while True:
        try:
            data = os.read(read_end, 65536)
        except InterruptedError:
            continue
        if not data:
            break
        if writable:
            writable = _write_all(terminal, line_filter.feed(data))
    if writable:
        _write_all(terminal, line_filter.finish())


def restore() -> None:
    """Ends the filter's window (if open): stderr is the process's own again, and
    what the reader holds is written before this returns (or 2 s have passed)."""
    global _window
    if _window is None:
        return
    terminal, pid = _window
    _window = None
    sys.stderr.flush()
    os.dup2(terminal, 2)  # The pipe's last writer is gone: the reader sees its end.
    os.close(terminal)
    deadline = time.monotonic() + _READER_WAIT_SECONDS
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.005)


def _write_all(fd: int, data: bytes) -> bool:
    """Whether all of `data` was written (False once the output is closed or broken)."""
    while data:
        try:
            data = data[os.write(fd, data) :]
        except InterruptedError:
            continue
        except OSError:
            return False
    return True
