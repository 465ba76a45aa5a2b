"""How the replicas stay one model: the sync policy the step and the controller ask.

Evaluations and checkpoints must see the global model, the one every replica
would hold. Under `AllReduce` (the default) the gradients are all-reduced every
step, so only per-tower BatchNorm moving statistics differ, and they are averaged
before an evaluation or a save; any step may end a call, save or evaluate. The
other policy is local SGD's (`local_sgd.py`).

`GlobalModel.ready(step)` makes the model global and checks that it is finite
once per step, whoever asks first (the evaluator or the checkpointer).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import keras
import tensorflow as tf

from resnet_app.common import checkpoint, distribute
from resnet_app.engine.divergence import DivergedError
from resnet_app.engine.local_sgd import LocalSGD

SUM = tf.distribute.ReduceOp.SUM

if TYPE_CHECKING:
    from resnet_app.engine.setup import Run


class AllReduce:
    """Gradients all-reduced (summed) every step: the default sync policy.

    A policy is what the controller, its actions and the step ask. `align`
    gives the interval a kind of work may have; `at_sync` says whether the
    replicas hold the global model at a step, `next_sync` the first step after
    it where they do (a waiting save or stop ends there), and `make_global`
    makes them hold it. In replica context: `denominator` (the tower's loss
    denominator), `shares` (the towers sharing the regularization), `apply` (a
    tower's gradients); in cross-replica context, inside the compiled loop:
    `after_step`, `global_now` (whether the model is global after the step;
    None: always) and `may_stop` (whether a requested stop may happen).

    Args:
      strategy: the strategy.
      models: the model, built in `strategy.scope()`, and the moving average of its
        weights (`ema.py`) if any, whose per-tower statistics are averaged with its.
    """

    def __init__(self, strategy: tf.distribute.Strategy, *models: keras.Model):
        self._strategy, self._models = strategy, models

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
            sync()

    def denominator(self, mask: tf.Tensor) -> tf.Tensor:
        # The global batch's: the towers' gradients are summed when applied.
        return tf.distribute.get_replica_context().all_reduce(SUM, tf.reduce_sum(mask))

    def shares(self) -> int:
        return tf.distribute.get_replica_context().num_replicas_in_sync

    def apply(self, optimizer, gradients: list[tf.Tensor], variables: list) -> None:
        optimizer.apply_gradients(zip(gradients, variables))

    def after_step(self) -> None:
        pass

    def global_now(self) -> None:
        return None

    def may_stop(self, stop: tf.Variable) -> tf.Variable:
        return stop


SyncPolicy = AllReduce | LocalSGD  # LocalSGD answers the same questions.


def create_policy(run: Run) -> SyncPolicy:
    """The run's sync policy: its local SGD, which averages at its last step, or all-reduce."""
    if run.local_sgd is not None:
        run.local_sgd.total, run.local_sgd.ema = run.plan.total_steps, run.ema
        return run.local_sgd
    return AllReduce(run.strategy, run.model, *([] if run.ema is None else [run.ema.model]))


class GlobalModel:
    """The model as evaluations and checkpoints must see it: global, and finite.

    Args:
      policy: the run's sync policy.
      checkpoints: the run's checkpoint (it knows the variables).
      strategy: the strategy (every worker must agree on a divergence).
    """

    def __init__(self, policy: SyncPolicy, checkpoints: checkpoint.RunCheckpoint, strategy):
        self.policy, self.checkpoints, self.strategy = policy, checkpoints, strategy
        self._ready_at: int | None = None

    def ready(self, step: int) -> None:
        """Makes the model global at `step` and checks it, once until it changes.

        Raises:
          DivergedError: when a weight is not finite on any worker (all raise).
        """
        if self._ready_at == step:
            return
        self.policy.make_global(step)
        if distribute.any_worker(self.strategy, not self.checkpoints.finite()):
            raise DivergedError(step, "the weights")
        self._ready_at = step

    def changed(self) -> None:
        """The weights changed (steps ran): the next `ready` checks again."""
        self._ready_at = None

    def restored(self, step: int) -> None:
        """A checkpoint of `step` was restored: global and finite already (checked when saved)."""
        self._ready_at = step
