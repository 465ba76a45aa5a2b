"""`python -m resnet_app.common.parent_death PARENT PROGRAM [ARGS...]`: PROGRAM, dying with PARENT.

The launcher starts each worker through this: Linux SIGKILLs the process when
the launcher's thread is gone (`prctl(PR_SET_PDEATHSIG)`, kept across exec), so
no worker outlives a killed launcher. A program, not a `preexec_fn`: Python
between fork and exec is unsafe with the launcher's threads.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Not SIGTERM: with the launcher gone, nobody would wait for a worker that saves.
DEATH_SIGNAL = signal.SIGKILL


def die_with_parent(parent: int, number: int = DEATH_SIGNAL) -> None:
    """Has the kernel send `number` to this process when `parent` ends; if it has, dies now."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(number), 0, 0, 0) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")
    if os.getppid() != parent:  # It died before prctl: the signal will never come.
        os.kill(os.getpid(), number)


def main(argv: list[str]) -> None:
    """Runs `argv[2:]` in this process once it dies with the process `argv[1]`."""
    if len(argv) < 3:
        sys.exit(f"usage: python -m {__spec__.name} PARENT PROGRAM [ARGS...]")
    die_with_parent(int(argv[1]))
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv)
