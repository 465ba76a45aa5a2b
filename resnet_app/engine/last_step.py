"""The last step every worker completed, kept in memory: what a survivor saves.

When a worker dies mid-step the others' collectives fail, but not all at once, so
the live variables are no step's state. Each device keeps a copy of what the loop
writes, replaced whole by `commit` after every step behind a barrier: once every
collective of the step completed here. With model averaging the copy is taken at
averages, so a survivor loses at most `interval` - 1 steps. `restore` puts it back
without any collective.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from resnet_app.engine.local_sgd import LocalSGD


class LastStep:
    """A copy of every local component of `variables` (what the compiled loop writes)
    as of the last completed step; `step`, a host variable, is that step's number."""

    def __init__(self, strategy, variables, local_sgd: LocalSGD | None = None):
        self.local_sgd = local_sgd
        self._live = []  # Every local copy (one per local replica) of every variable.
        for variable in variables:
            value = variable.value if isinstance(variable, keras.Variable) else variable
            components = strategy.experimental_local_results(value)
            self._live += [v for v in components if v.dtype != tf.string]
        self._copies = []
        for live in self._live:
            with tf.device(live.device):
                self._copies.append(
                    tf.Variable(tf.zeros(live.shape, live.dtype), trainable=False, name="last")
                )
        with tf.device("/cpu:0"):
            self.step = tf.Variable(-1, dtype=tf.int64, trainable=False, name="last_step")
            self._steps = tf.Variable(-1, dtype=tf.int64, trainable=False, name="steps_run")

    def commit(self, after: list[tf.Tensor]) -> None:
        """In the compiled loop: the copy becomes this step's, whole, once the tensors
        `after` (the step's reduced metrics: its collectives completed) exist."""
        with tf.control_dependencies(after):
            step = self._steps.assign_add(1)
        if self.local_sgd is None or self.local_sgd.interval == 1:
            self._commit(step)
        else:
            tf.cond(self.local_sgd.at_average(), lambda: self._commit(step), lambda: None)

    def _commit(self, step: tf.Tensor) -> None:
        # Each read follows the variable's last update (automatic control dependencies)
        # and the barrier; no copy is written before every read is done.
        with tf.control_dependencies([step]):
            values = [tf.identity(live) for live in self._live]
        with tf.control_dependencies(values):
            writes = [copy.assign(value) for copy, value in zip(self._copies, values)]
        with tf.control_dependencies(writes):
            self.step.assign(step)

    def commit_now(self, step: int) -> None:
        """Eagerly, between calls (the start, a rollback): the copy becomes `step`'s."""
        for copy, live in zip(self._copies, self._live):
            copy.assign(live)
        self.step.assign(step)
        self._steps.assign(step)

    def restore(self) -> int:
        """Puts the copy back into this worker's variables (no collective); returns its step."""
        for copy, live in zip(self._copies, self._live):
            live.assign(copy)
        return int(self.step.numpy())
