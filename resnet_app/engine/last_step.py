"""The last step every worker completed, kept in memory: what a survivor saves.

When a worker of a multi-worker run dies in the middle of a step, the step's
collectives fail on the others, but not all at once: a variable whose
gradient's all-reduce went through may be updated while another's is not,
and the forward pass has already moved the BatchNorm statistics. The live
variables are then no step's state. So each device keeps a copy of what the
compiled loop writes (the weights and statistics, the optimizer's slots,
iterations and learning rate, the moving average of the weights), and
`commit` replaces it whole after every step, behind a barrier: the copy is
written only once every variable of the step has been updated and the step's
metrics reduced, that is once every collective of the step completed on this
worker. A step that fails anywhere leaves the previous copy intact. With
model averaging a step is complete once averaged: the copy is taken at
averages only (what a checkpoint holds, `sync.py`), so a survivor loses the
steps since the last average, at most `interval` - 1.

`restore` puts the copy back into this worker's variables, without any
collective (after a failure the collectives are aborted for good), and
returns its step. The cost is one device-side copy of that state per step,
in memory and time: see `scripts/benchmark.py --variants=...,last_step`.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from resnet_app.engine.averaging import ModelAveraging


def _components(strategy: tf.distribute.Strategy, variables) -> list[tf.Variable]:
    """Every local copy (one per local replica) of every variable, in order."""
    found = []
    for variable in variables:
        # A Keras variable wraps a tf.Variable.
        value = variable.value if isinstance(variable, keras.Variable) else variable
        found += list(strategy.experimental_local_results(value))
    return found


class LastStep:
    """A copy of the loop's variables as of the last completed step.

    Args:
      strategy: the run's strategy.
      variables: what the compiled loop writes (Keras or tf variables, possibly
        distributed); every local copy is kept.
      averaging: with model averaging, copies are taken at averages only.

    Attributes:
      step: a host variable, the step the copy holds.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        variables,
        averaging: ModelAveraging | None = None,
    ):
        self.averaging = averaging
        self._live = [v for v in _components(strategy, variables) if v.dtype != tf.string]
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
        """In the compiled loop, after a step: the copy becomes this step's, whole.

        Args:
          after: tensors that exist once the step's collectives completed (its
            reduced metrics).
        """
        with tf.control_dependencies(after):
            step = self._steps.assign_add(1)
        if self.averaging is None or self.averaging.interval == 1:
            self._commit(step)
        else:
            tf.cond(self.averaging.at_average(), lambda: self._commit(step), lambda: None)

    def _commit(self, step: tf.Tensor) -> None:
        # Each read follows the variable's last update (automatic control
        # dependencies) and the barrier (`step` follows `after`); no copy is
        # written before every read is done.
        with tf.control_dependencies([step]):
            values = [tf.identity(live) for live in self._live]
        with tf.control_dependencies(values):
            writes = [copy.assign(value) for copy, value in zip(self._copies, values)]
        with tf.control_dependencies(writes):
            self.step.assign(step)

    def commit_now(self, step: int) -> None:
        """Eagerly, between calls: the copy becomes the live state of `step`
        (at the start, and after a restore or rollback)."""
        for copy, live in zip(self._copies, self._live):
            copy.assign(live)
        self.step.assign(step)
        self._steps.assign(step)

    def restore(self) -> int:
        """Puts the copy back into this worker's variables (no collective); returns its step."""
        for copy, live in zip(self._copies, self._live):
            live.assign(copy)
        return int(self.step.numpy())
