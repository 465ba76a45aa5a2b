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

`GlobalModel.ready(step)` makes the model global and checks that it is finite
once per step, whatever asks first (the evaluator or the checkpointer): one
BatchNorm all-reduce and one finite check per evaluated and saved step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import keras
import tensorflow as tf
from absl import logging

from resnet_app.common import checkpoint, distribute
from resnet_app.engine import averaging as averaging_lib
from resnet_app.engine.divergence import DivergedError
from resnet_app.engine.timing import next_multiple, round_up

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
        models = [model] if average_model is None else [model, average_model]
        self._syncs = [distribute.moving_statistics_sync(m, strategy) for m in models]

    def align(self, name: str, every: int) -> int:
        return every

    def at_sync(self, step: int) -> bool:
        return True

    def next_sync(self, step: int) -> int:
        return step + 1

    def make_global(self, step: int) -> None:
        for sync in self._syncs:
            sync()  # Per-tower statistics differ until averaged.


class ModelAverage:
    """Replicas that train alone and average every `averaging.interval` steps.

    Args:
      averaging: the `ModelAveraging` the step uses.
      total: the run's last step, where the run averages once more.
      ema: the moving average of the weights, or None: it follows that last
        average too.
    """

    def __init__(
        self,
        averaging: averaging_lib.ModelAveraging,
        total: int,
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
