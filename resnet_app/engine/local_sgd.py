"""Local SGD (`sync.mode: model_average`): replicas train alone and average every K steps.

It replaces the per-step gradient all-reduce (TF1's `ModelAverageOptimizer`):
every replica updates its own copy of every variable and slot from its share of
the batch (plus the whole regularization), and whenever K divides the step
count one all-reduce replaces every copy of the weights, BatchNorm statistics
and slots by their mean. K=1 is the all-reduce update for SGD and momentum.

`local_variables()` makes every variable built inside it a `SyncOnReadVariable`:
replica reads and updates touch the replica's copy, a cross-replica read is the
copies' mean (the iteration count and learning rate: the first copy's), and a
restore writes every copy. Checkpoints and evaluations happen right after an
average, when the copies are equal: resuming is exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import keras
import tensorflow as tf
from absl import logging

from resnet_app.common import compat, distribute
from resnet_app.engine.cadence import next_multiple, round_up

if TYPE_CHECKING:
    from resnet_app.engine.ema import WeightEMA

ON_READ = tf.VariableSynchronization.ON_READ
MEAN = tf.VariableAggregation.MEAN
ONLY_FIRST_REPLICA = tf.VariableAggregation.ONLY_FIRST_REPLICA


def _replica_local_creator(next_creator, **kwargs):
    kwargs["synchronization"] = ON_READ
    dtype = kwargs.get("dtype")
    floating = dtype is None or tf.as_dtype(dtype).is_floating
    # The iteration count and learning rate (Keras asks ONLY_FIRST_REPLICA for
    # them) are the same everywhere; a mean of integers would be a float.
    first = kwargs.get("aggregation") == ONLY_FIRST_REPLICA or not floating
    kwargs["aggregation"] = ONLY_FIRST_REPLICA if first else MEAN
    return next_creator(**kwargs)


@contextlib.contextmanager
def local_variables() -> Iterator[None]:
    """Variables created inside get one copy per replica; enter it inside
    `strategy.scope()`, around building the model and its optimizer, nowhere else."""
    with tf.variable_creator_scope(_replica_local_creator):
        yield


class LocalSGD:
    """Local SGD of a model built in `local_variables()`, and its sync policy
    (`sync.SyncPolicy`): evaluations, saves and stops wait for an average, and a run
    whose length is not a multiple of the interval averages once more at its end.

    Args:
      model: built in `strategy.scope()` and `local_variables()`.
      optimizer: created and built there too.
      strategy: the strategy.
      interval: average every this many steps (1 or more).

    Attributes:
      total: the run's last step, where it averages once more (None: never).
      ema: the moving average of the weights, which follows that last average, or None.

    Raises:
      ValueError: for variables not made by `local_variables()`. (The config refuses
        a loss scale; the optimizer has no EMA or gradient accumulation.)
    """

    def __init__(
        self,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        strategy: tf.distribute.Strategy,
        interval: int,
    ):
        self.optimizer, self.strategy, self.interval = optimizer, strategy, interval
        self.total: int | None = None
        self.ema: WeightEMA | None = None
        variables = [*model.variables, *optimizer.variables]
        not_local = [v.path for v in variables if v.value.synchronization != ON_READ]
        if not_local:
            raise ValueError(f"not created in local_sgd.local_variables(): {not_local[:3]}")
        # The weights, statistics and slots; not the iteration count and learning rate.
        self.averaged = [v for v in variables if getattr(v.value, "aggregation", MEAN) == MEAN]
        self._average = tf.function(self._average_fn)

    def apply(self, optimizer, gradients: list[tf.Tensor], variables: list) -> None:
        """In replica context: `optimizer.apply_gradients` on the replica's own copy
        (clipping, decoupled weight decay, the update rule, the count), without its
        all-reduce of the gradients."""
        gradients = compat.clip_gradients(optimizer, gradients)
        # The base class's decay works on the replica's copy; the TF backend's
        # would merge into cross-replica context.
        compat.apply_weight_decay_locally(optimizer, variables)
        learning_rate = optimizer.learning_rate
        for gradient, variable in zip(gradients, variables):
            optimizer.update_step(gradient, variable, learning_rate)
        optimizer.iterations.assign_add(1)

    def at_average(self) -> tf.Tensor:
        """Whether `interval` divides the step: the copies are averaged (or never differed)."""
        step = tf.convert_to_tensor(self.optimizer.iterations)
        return tf.equal(step % tf.cast(self.interval, step.dtype), 0)

    def _average_fn(self) -> None:
        self.strategy.run(lambda: distribute.assign_replica_mean(self.averaged))

    # The sync policy.
    def align(self, name: str, every: int) -> int:
        rounded = round_up(every, self.interval)
        if rounded != every:
            logging.info(
                "Model averaging every %d steps: %s %d -> %d (evaluations and checkpoints "
                "need the averaged model)",
                self.interval, name, every, rounded,
            )  # fmt: skip
        return rounded

    def at_sync(self, step: int) -> bool:
        return step % self.interval == 0 or step == self.total

    def next_sync(self, step: int) -> int:
        return next_multiple(step, self.interval)

    def make_global(self, step: int) -> None:
        # The moving statistics are averaged with the weights: nothing else to sync.
        if step == self.total and step % self.interval:
            self._average()
            if self.ema is not None:  # The steps since the last average, at once.
                self.ema.update_now(self.strategy, self.optimizer.iterations)

    def denominator(self, mask: tf.Tensor) -> tf.Tensor:
        # The tower's own examples: with equal shares the mean of the towers' steps
        # is the all-reduce step.
        return tf.reduce_sum(mask)

    def shares(self) -> int:
        return 1

    def after_step(self) -> None:
        if self.interval == 1:
            self._average_fn()
        else:
            tf.cond(self.at_average(), self._average_fn, lambda: None)

    def global_now(self) -> tf.Tensor | None:
        return None if self.interval == 1 else self.at_average()

    def may_stop(self, stop: tf.Variable) -> tf.Tensor:
        return tf.logical_and(tf.convert_to_tensor(stop), self.at_average())
