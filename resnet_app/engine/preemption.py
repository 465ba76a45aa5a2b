"""SIGTERM and SIGINT: stop after the step in progress, save, exit cleanly.

A cluster preempts a job with SIGTERM; a person stops one with Ctrl-C. Either
asks `StopRequest` to stop: the compiled training loop reads its flag before
every step (`step.TrainStep.loop`), so the run stops after the step in
progress, and the trainer saves a checkpoint and returns. A second Ctrl-C
(SIGINT) exits at once, without a checkpoint; a repeated SIGTERM changes
nothing.

Python runs signal handlers only in the main thread and only between
bytecodes, which never happens while the main thread is inside a long
compiled call. So the handler itself does nothing; `signal.set_wakeup_fd`
makes the interpreter write the signal's number to a pipe as it arrives, and a
watcher thread reading that pipe sets the flag (a `tf.Variable`) at once.
"""

from __future__ import annotations

import os
import signal
import threading

import tensorflow as tf
from absl import logging

from resnet_app.common import startup_noise

SIGNALS = (signal.SIGTERM, signal.SIGINT)
SIGNAL_NAMES = frozenset(s.name for s in SIGNALS)


class StopRequest:
    """A stop flag set by SIGTERM or SIGINT while installed (a context manager).

    Attributes:
      flag: a boolean `tf.Variable` (on the host, outside any strategy).
      signal_name: the first signal received ("SIGTERM"), or the reason given
        to `request` by the loop (an action's), or None.
    """

    def __init__(self):
        self.flag = tf.Variable(False, trainable=False, name="stop_requested")
        self.signal_name: str | None = None
        self._previous: dict = {}
        self._pipe: tuple[int, int] | None = None
        self._previous_fd = -1
        self._signalled = False  # A signal came (an action's request is not one).

    def request(self, name: str) -> None:
        """Asks the run to stop: what a signal does, or an action of the loop.

        Args:
          name: the signal's name ("SIGTERM"), or why the run stops.
        """
        if self.signal_name is None:
            self.signal_name = name
            again = " (send it again to exit at once, without one)" if name in SIGNAL_NAMES else ""
            logging.warning(
                "%s: stopping after the step in progress, then saving a checkpoint%s", name, again
            )
            self.flag.assign(True)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is not threading.main_thread():
            return self  # Signals are only delivered to the main thread.
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        self._pipe = (read_end, write_end)
        self._previous = {s: signal.signal(s, _noop) for s in SIGNALS}
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


def _noop(signum, frame) -> None:
    """The Python-level handler: the watcher thread does the work."""
