"""How the replicas stay one model: the sync policy the controller asks.

Evaluations and checkpoints must see the global model, the one every replica
would hold. What that takes depends on how the replicas synchronize:

- `AllReduce` (the default): gradients are all-reduced every step, so the
  weights never differ; only per-tower BatchNorm moving statistics do, and
  they are averaged before an evaluation or a save
  (`distribute.moving_statistics_sync`). Any step may end a call, save or
  evaluate.
- `ModelAverage` (`sync.mode: model_average`, see `averaging.py`): the
  replicas' copies are the global model only right after an average, every
  `interval` steps. `eval_every` and `checkpoint_every` are rounded up to
  multiples of the interval (`align`); a save or a stop that comes between
  averages waits for the next one (`at_sync`, `next_sync`: at most interval -
  1 steps); and a run whose length is not a multiple of the interval averages
  once more at its last step (`make_global`). A checkpoint therefore always
  holds identical copies, and resuming from it is exactly the uninterrupted
  run. (Extending a finished run whose length was not a multiple of the
  interval goes on from that last average, which a longer uninterrupted run
  would not have made.)

The step (`step.TrainStep`) is given the same policy and asks it how a
tower's update is made: `denominator` (the loss's: the global batch's example
count, or the tower's own), `shares` (the towers that share the
regularization), `apply` (all-reduced, or to the tower's own copy), and after
each step `after_step` (an average when due), `global_now` (whether the EMA
may follow) and `may_stop` (a stop waits for an average).

`GlobalModel.ready(step)` makes the model global and checks that it is finite
once per step, whatever asks first (the evaluator or the checkpointer): one
BatchNorm all-reduce and one finite check per evaluated and saved step.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Protocol

import keras
import tensorflow as tf
from absl import logging

from resnet_app.common import checkpoint, distribute
from resnet_app.engine import averaging as averaging_lib
from resnet_app.engine.cadence import next_multiple, round_up
from resnet_app.engine.divergence import DivergedError

SUM = tf.distribute.ReduceOp.SUM

if TYPE_CHECKING:
    from resnet_app.engine.ema import WeightEMA
    from resnet_app.engine.setup import Run


class SyncPolicy(Protocol):
    """What the controller and its actions ask of the way the replicas synchronize."""

    def align(self, name: str, every: int) -> int:
        """The interval `name` may have (evaluations and saves need the global model)."""

    def at_sync(self, step: int) -> bool:
        """Whether the replicas hold the global model at `step` (a save may happen)."""

    def next_sync(self, step: int) -> int:
        """The first step after `step` at which they do (a waiting save or stop ends there)."""

    def make_global(self, step: int) -> None:
        """Makes every replica hold the global model at `step`, before an evaluation or save."""

    # The step's side: in replica context ...
    def denominator(self, mask: tf.Tensor) -> tf.Tensor:
        """The tower's loss denominator, from its examples' mask."""

    def shares(self) -> int:
        """How many towers share the regularization (each counts 1 / shares of it)."""

    def apply(self, optimizer, gradients: list[tf.Tensor], variables: list) -> None:
        """Applies a tower's gradients."""

    # ... and in cross-replica context, inside the compiled loop.
    def after_step(self) -> None:
        """Runs after each step's update."""

    def global_now(self) -> tf.Tensor | None:
        """Whether the replicas hold the global model after this step (None: always)."""

    def may_stop(self, stop: tf.Variable) -> tf.Tensor:
        """Whether a requested stop may happen before the next step."""


class AllReduce:
    """Gradients all-reduced every step: only BatchNorm moving statistics differ.

    Args:
      model: the model, built in `strategy.scope()`.
      strategy: its strategy.
      average_model: the moving average of the weights (`engine/ema.py`), or
        None: its per-tower statistics are averaged with the model's.
    """

    def __init__(
        self,
        model: keras.Model,
        strategy: tf.distribute.Strategy,
        average_model: keras.Model | None = None,
    ):
        self._models = [model] if average_model is None else [model, average_model]
        self._strategy = strategy

    @functools.cached_property
    def _syncs(self) -> list:
        return [distribute.moving_statistics_sync(m, self._strategy) for m in self._models]

    def align(self, name: str, every: int) -> int:
        return every

    def at_sync(self, step: int) -> bool:
        return True

    def next_sync(self, step: int) -> int:
        return step + 1

    def make_global(self, step: int) -> None:
        for sync in self._syncs:
            sync()  # Per-tower statistics differ until averaged.

    def denominator(self, mask: tf.Tensor) -> tf.Tensor:
        # The whole global batch's: the towers' gradients are summed when applied.
        return tf.distribute.get_replica_context().all_reduce(SUM, tf.reduce_sum(mask))

    def shares(self) -> int:
        return tf.distribute.get_replica_context().num_replicas_in_sync

    def apply(self, optimizer, gradients: list[tf.Tensor], variables: list) -> None:
        optimizer.apply_gradients(zip(gradients, variables))  # All-reduced (summed).

    def after_step(self) -> None:
        pass

    def global_now(self) -> None:
        return None

    def may_stop(self, stop: tf.Variable) -> tf.Variable:
        return stop


class ModelAverage:
    """Replicas that train alone and average every `averaging.interval` steps.

    Args:
      averaging: the `ModelAveraging` the step uses.
      total: the run's last step, where the run averages once more (None: no
        last average, for a step used alone).
      ema: the moving average of the weights, or None: it follows that last
        average too.
    """

    def __init__(
        self,
        averaging: averaging_lib.ModelAveraging,
        total: int | None = None,
        ema: WeightEMA | None = None,
    ):
        self.averaging = averaging
        self.interval = averaging.interval
        self.total = total
        self.ema = ema

    def align(self, name: str, every: int) -> int:
        """`every` rounded up to a multiple of the interval, logged if changed."""
        rounded = round_up(every, self.interval)
        if rounded != every:
            logging.info(
                "Model averaging every %d steps: %s %d -> %d (evaluations and checkpoints "
                "need the averaged model)",
                self.interval,
                name,
                every,
                rounded,
            )
        return rounded

    def at_sync(self, step: int) -> bool:
        # The last step averages once more (`make_global`), before its evaluation.
        return step % self.interval == 0 or step == self.total

    def next_sync(self, step: int) -> int:
        return next_multiple(step, self.interval)

    def make_global(self, step: int) -> None:
        # The moving statistics are averaged with the weights: nothing else to sync.
        if step == self.total and step % self.interval:
            self.averaging.average()  # The run ends with the global model.
            if self.ema is not None:  # The steps since the last average, at once.
                self.ema.update_now(self.averaging.strategy, self.averaging.optimizer.iterations)

    def denominator(self, mask: tf.Tensor) -> tf.Tensor:
        # The tower steps alone, on the mean loss of its own examples. With
        # equal shares, the mean of the towers' steps is the all-reduce step.
        return tf.reduce_sum(mask)

    def shares(self) -> int:
        return 1  # Each tower steps alone: it counts the whole regularization.

    def apply(self, optimizer, gradients: list[tf.Tensor], variables: list) -> None:
        self.averaging.apply_locally(gradients, variables)  # Its own copy, not all-reduced.

    def after_step(self) -> None:
        self.averaging.average_if_due()

    def global_now(self) -> tf.Tensor | None:
        return None if self.interval == 1 else self.averaging.at_average()

    def may_stop(self, stop: tf.Variable) -> tf.Tensor:
        # A checkpoint must hold the averaged model: a stop waits for the next average.
        return tf.logical_and(tf.convert_to_tensor(stop), self.averaging.at_average())


def create_policy(run: Run) -> AllReduce | ModelAverage:
    """The run's sync policy: `ModelAverage` when the run averages, else `AllReduce`."""
    if run.averaging is not None:
        return ModelAverage(run.averaging, run.plan.total_steps, run.ema)
    return AllReduce(run.model, run.strategy, None if run.ema is None else run.ema.model)


class GlobalModel:
    """The model as evaluations and checkpoints must see it: global, and finite.

    Args:
      policy: the run's sync policy.
      checkpoints: the run's checkpoint (it knows the model's and optimizer's
        variables).
      strategy: the strategy (every worker must agree on a divergence).
    """

    def __init__(
        self,
        policy: SyncPolicy,
        checkpoints: checkpoint.RunCheckpoint,
        strategy: tf.distribute.Strategy,
    ):
        self.policy = policy
        self.checkpoints = checkpoints
        self.strategy = strategy
        self._ready_at: int | None = None

    def ready(self, step: int) -> None:
        """Makes the model global at `step` and checks it, once until it changes.

        Raises:
          DivergedError: when a weight is not finite (on any worker: all raise).
        """
        if self._ready_at == step:
            return
        self.policy.make_global(step)
        # On any worker: then every worker raises.
        if distribute.any_worker(self.strategy, not self.checkpoints.finite()):
            raise DivergedError(step, "the weights")
        self._ready_at = step

    def changed(self) -> None:
        """The weights changed (steps ran): the next `ready` checks again."""
        self._ready_at = None

    def restored(self, step: int) -> None:
        """A checkpoint of `step` was restored: global and finite already (checked when saved)."""
        self._ready_at = step
