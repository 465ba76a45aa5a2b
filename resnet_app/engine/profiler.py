"""`train.profile_steps`: TensorFlow's profiler over that many training steps.

It starts at the first boundary, after the first compiled call (start-up and
tracing left out) and that boundary's evaluation or checkpoint, and writes
`model_dir/profile/` for TensorBoard's Profile tab and `scripts/benchmark.py
limit`, which splits the step's time by kind of op.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import tensorflow as tf
from absl import logging

from resnet_app.common import run_dir
from resnet_app.engine.actions import Action, Boundary

if TYPE_CHECKING:
    from resnet_app.engine.setup import Run


class Profiler(Action):
    """Profiles steps (first, last] from the first boundary; on the chief only. It comes
    first among the actions: the trace starts after a boundary's work and ends before it."""

    def __init__(self, run: Run):
        self.steps, self.total = run.config.train.profile_steps, run.plan.total_steps
        self.directory = os.path.join(run.model_dir, run_dir.PROFILE_DIR)
        self.first = self.last = None
        self.done = not (self.steps and run.chief)

    def next_due(self, step: int) -> int | None:
        return self.last

    def __call__(self, boundary: Boundary) -> None:
        if self.last is not None and (boundary.step >= self.last or boundary.stopping):
            self._stop(boundary.step)

    def after(self, boundary: Boundary) -> None:
        stopping = boundary.stopping or boundary.stop_requested
        if not self.done and self.last is None and boundary.step < self.total and not stopping:
            tf.profiler.experimental.start(self.directory)
            self.first, self.last = boundary.step, min(boundary.step + self.steps, self.total)

    def interrupt(self) -> None:
        if self.last is not None:
            self._stop(None)

    def _stop(self, step: int | None) -> None:
        tf.profiler.experimental.stop()
        self.done, self.last = True, None
        if step is not None:
            logging.info(
                "Profiled steps %d-%d into %s (TensorBoard's Profile tab)",
                self.first + 1, step, self.directory,
            )  # fmt: skip
