"""One trainer per run directory: an exclusive `flock(2)` on `model_dir/trainer.lock`.

Two trainers would interleave metrics.jsonl and overwrite each other's
checkpoints; a second one refuses in one line naming the holder (who wrote its
pid, host and start into the file). The kernel drops the lock however its holder
dies. Only a multi-worker job's chief locks. No TensorFlow.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time

from absl import logging

from resnet_app.common import run_dir
from resnet_app.common.errors import ConfigError

_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


class RunLock:
    """The exclusive lock of a run directory (made if needed): `acquire`, `release`, or `with`."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self.path = run_dir.lock_path(model_dir)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Takes the lock, or refuses with a ConfigError naming the holder."""
        run_dir.create(self.model_dir)
        try:
            fd = run_dir.open_file(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as error:
            raise ConfigError(
                f"cannot open the run's lock file {self.path} ({error.strerror}); pick a "
                "--model_dir you can write to"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = _read_holder(fd)
            os.close(fd)
            if error.errno in _UNSUPPORTED:
                logging.warning(
                    "The filesystem of %s takes no locks (%s): a second trainer on this run "
                    "directory would not be kept out",
                    self.model_dir,
                    error.strerror,
                )
                return self
            raise ConfigError(_in_use(self.model_dir, holder)) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(_this_process()).encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        """Drops the lock (the file stays: removing it would race a trainer opening it)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # Closing the descriptor unlocks it.
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()


def refuse_if_held(model_dir: str) -> None:
    """Refuses at once, writing nothing, when another trainer holds `model_dir`'s lock
    (the command line, before TensorFlow loads; the trainer still locks)."""
    path = run_dir.lock_path(model_dir)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # No lock file: nobody has trained there yet.
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno not in _UNSUPPORTED:
            raise ConfigError(_in_use(model_dir, _read_holder(fd))) from None
    finally:
        os.close(fd)


def _this_process() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join(sys.argv)[:300],
    }


def _read_holder(fd: int) -> dict:
    """What the holder wrote into the lock file ({} if nothing readable yet)."""
    with contextlib.suppress(OSError, ValueError):
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    return {}


def _in_use(model_dir: str, holder: dict) -> str:
    pid, host = holder.get("pid", "?"), holder.get("host", "?")
    here = host == socket.gethostname()
    stop = f"stop it with kill -TERM {pid} (it saves first)" if here else f"stop it on {host}"
    return (
        f"--model_dir={model_dir} is in use by another trainer (pid {pid} on {host}, started "
        f"{holder.get('started', '?')}); wait for it to finish, {stop} and rerun to resume, "
        "or pick another --model_dir"
    )
