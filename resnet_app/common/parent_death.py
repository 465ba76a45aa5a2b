"""`python -m resnet_app.common.parent_death PARENT PROGRAM [ARGS...]`: PROGRAM, dying with PARENT.

`resnet_app.launch` starts each worker through this: it asks Linux to SIGKILL
the process when the launcher is gone (the parent-death signal, `prctl(2)`
PR_SET_PDEATHSIG), then execs PROGRAM, which keeps the process, its pid and
the setting. So a launcher killed outright (`kill -9`, the OOM killer) leaves
no worker that holds the run lock, the accelerators and its ports.

Why a program of its own rather than `subprocess.Popen(preexec_fn=...)`: a
preexec_fn runs Python between fork and exec, which is unsafe in a process
with threads (the launcher pumps each worker's output on one), and exec is
where the setting must already be made. This costs one interpreter start
(about 30 ms) per worker.

Two details of the parent-death signal. It comes when the *thread* that
started the child ends, not the process: the launcher starts workers from its
main thread, which lives as long as it does. And the parent may die before
`prctl` runs, in which case no signal will ever come: the process was already
given to another parent, so after `prctl` it checks that its parent is still
PARENT, and dies at once if not. Elsewhere than Linux only that check is
made.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Not SIGTERM: with the launcher gone, nobody would wait for a worker that saves,
# or kill one stuck in a collective whose peer is gone.
DEATH_SIGNAL = signal.SIGKILL


def die_with_parent(parent: int, number: int = DEATH_SIGNAL) -> None:
    """Has the kernel send `number` to this process when `parent` ends; if it already has, dies now.

    Args:
      parent: the pid of the process that must outlive this one.
      number: the signal.

    Raises:
      OSError: `prctl` failed.
    """
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
