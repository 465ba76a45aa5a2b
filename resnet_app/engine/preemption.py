"""SIGTERM, SIGINT and SIGUSR1: stop after the step in progress, save, exit.

SIGTERM or Ctrl-C sets `StopRequest`'s flag, read by the compiled loop before every
step; the trainer saves and returns (status 0). A second Ctrl-C exits at once,
without a checkpoint; a repeated SIGTERM changes nothing. SIGUSR1, a scheduler's
notice (SLURM's `--signal=B:USR1@120`), stops and saves alike, then raises
`PreemptedError` (status 3) so the job is requeued; workers agree on it.

Python runs handlers only in the main thread between bytecodes, never during a
long compiled call, so the handler does nothing: `signal.set_wakeup_fd` writes
the signal's number to a pipe, and a watcher thread reading it sets the flag.
"""

from __future__ import annotations

import os
import signal
import threading

import tensorflow as tf
from absl import logging

from resnet_app.common import run_dir, startup_noise
from resnet_app.common.errors import PreemptedError

# The scheduler's notice that the job is about to end: save, exit to be requeued.
PREEMPTION_SIGNAL = signal.SIGUSR1
SIGNALS = (signal.SIGTERM, signal.SIGINT, PREEMPTION_SIGNAL)
# Signals that stop the run for good (exit status 0); a second SIGINT exits at once.
SIGNAL_NAMES = frozenset(s.name for s in (signal.SIGTERM, signal.SIGINT))


class StopRequest:
    """A stop flag (a host `tf.Variable`) set by SIGTERM, SIGINT or SIGUSR1 while installed
    (a context manager); `signal_name` is the first signal or an action's reason, and
    `preempted` whether a preemption notice came, before or after another stop."""

    def __init__(self):
        self.flag = tf.Variable(False, trainable=False, name="stop_requested")
        self.signal_name: str | None = None
        self.preempted = False
        self._previous: dict = {}
        self._pipe: tuple[int, int] | None = None
        self._previous_fd = -1
        self._signalled = False  # A signal came (an action's request is not one).

    def request(self, name: str) -> None:
        """Asks the run to stop, for a signal (its name) or an action (why)."""
        if self.signal_name is None:
            self.signal_name, after = name, ""
            if name in SIGNAL_NAMES:
                after = " (send it again to exit at once, without one)"
            elif name == PREEMPTION_SIGNAL.name:
                status = PreemptedError.exit_status
                after = f" (a preemption notice), then exiting with status {status} to be requeued"
            logging.warning(
                "%s: stopping after the step in progress, then saving a checkpoint%s", name, after
            )
            self.flag.assign(True)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is not threading.main_thread():
            return self  # Signals are only delivered to the main thread.
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        self._pipe = (read_end, write_end)
        # The handler does nothing: the watcher thread does the work.
        self._previous = {s: signal.signal(s, lambda number, frame: None) for s in SIGNALS}
        self._previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        self._watcher = threading.Thread(target=self._watch, args=(read_end,), daemon=True)
        self._watcher.start()
        return self

    def _watch(self, read_end: int) -> None:
        try:
            while data := os.read(read_end, 1):  # Empty once the pipe is closed.
                number = data[0]
                if number not in SIGNALS:
                    continue
                name = signal.Signals(number).name
                # A person pressing Ctrl-C again means it; a scheduler may repeat SIGTERM.
                if self._signalled and number == signal.SIGINT:
                    logging.error("Second %s: exiting now, without a checkpoint", name)
                    logging.flush()
                    startup_noise.restore()  # os._exit skips atexit: write what it holds.
                    os._exit(128 + number)
                self._signalled = True
                if number == PREEMPTION_SIGNAL and not self.preempted:
                    self.preempted = True  # Even after another stop: the job must come back.
                    if self.signal_name is not None:
                        logging.warning(
                            "%s after %s: a preemption notice; exiting with status %d to be "
                            "requeued",
                            name, self.signal_name, PreemptedError.exit_status,
                        )  # fmt: skip
                self.request(name)
        except OSError:
            pass
        finally:
            os.close(read_end)

    def __exit__(self, *exc_info) -> None:
        if self._pipe is None:
            return
        signal.set_wakeup_fd(self._previous_fd)
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        os.close(self._pipe[1])  # The watcher reads end-of-file and returns.
        self._watcher.join(timeout=5)
        self._pipe = None


def preempted_error(step: int, model_dir: str) -> PreemptedError:
    """The one line of a preempted run that saved `step` in `model_dir`."""
    return PreemptedError(
        f"preempted ({PREEMPTION_SIGNAL.name}, the scheduler's notice): saved "
        f"{run_dir.checkpoint_name(step)} in {model_dir}; the job resumes from it when "
        "requeued (the same command)"
    )
