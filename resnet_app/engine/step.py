"""The training step: every tower's gradients applied, as the sync policy says.

`TrainStep` is a composition: a `tower.Tower` computes one tower's gradients
and loss sums (the `losses.Loss`, stochastic depth keys, gradient
accumulation, an empty tower's guard); the sync policy (`sync.AllReduce` or
`sync.ModelAverage`) says how they are applied, what the loss is divided by
and when a stop may happen; after each step the policy's `after_step` (an
average when due), the moving average of the weights (`ema.WeightEMA`) and
the copy of the last step (`last_step.LastStep`) each do their one job.

`TrainStep.loop` runs several steps per call of one compiled function and
assigns the learning rate before each of them from a vector the host computed:
the TF2 form of feeding the learning rate through a placeholder every step.
It checks each step's metrics for NaN/Inf (they are reduced anyway, so this is
free) and ends the call at the first non-finite one; and it reads a stop flag
before every step, so a preempted run stops after the step in progress.
"""

from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

from resnet_app.common import compat
from resnet_app.engine import ema as ema_lib
from resnet_app.engine import optim, sync
from resnet_app.engine.last_step import LastStep
from resnet_app.engine.tower import Tower
from resnet_app.engine.train_metrics import SUMS

SUM = tf.distribute.ReduceOp.SUM


@dataclasses.dataclass(frozen=True)
class LoopResult:
    """What one call of `TrainStep.loop` did.

    Attributes:
      steps: the steps run (fewer than asked when stopped or diverged).
      sums: `train_metrics.SUMS` summed over those steps: "examples", "loss" (summed
        cross-entropy), "correct", "regularization" (summed over steps).
      input_wait: seconds the steps waited for their batches.
    """

    steps: int
    sums: dict[str, float]
    input_wait: float = 0.0

    @property
    def finite(self) -> bool:
        return all(math.isfinite(v) for v in self.sums.values())


def _local_tensors(strategy: tf.distribute.Strategy, batch) -> list[tf.Tensor]:
    """Every local component of a distributed batch (for control dependencies)."""
    return [
        t for value in tf.nest.flatten(batch) for t in strategy.experimental_local_results(value)
    ]


class TrainStep:
    """The distributed training loop of a tower's gradients.

    Args:
      tower: the `Tower` (its model and optimizer built in `strategy.scope()`,
        the optimizer with `optimizer.build(model.trainable_variables)`).
      strategy: the distribution strategy.
      policy: the sync policy (`sync.create_policy`); None: all-reduce.
      ema: the moving average of the weights, updated after every step (with
        model averaging, after every average), or None.
      last_step: the copy of the last completed step (multi-worker runs,
        `last_step.py`), committed after every step, or None.
      time_input: measure the time each step waits for its batch (clock
        reads are refused under TensorFlow's op determinism).
    """

    def __init__(
        self,
        tower: Tower,
        strategy: tf.distribute.Strategy,
        policy: sync.SyncPolicy | None = None,
        ema: ema_lib.WeightEMA | None = None,
        last_step: LastStep | None = None,
        time_input: bool = True,
    ):
        self.tower = tower
        self.optimizer = tower.optimizer
        self.strategy = strategy
        self.policy = sync.AllReduce(tower.model, strategy) if policy is None else policy
        self.ema = ema
        self.last_step = last_step
        self.time_input = time_input
        # One compiled loop per input shape (progressive resizing's sizes), each
        # traced for its exact shapes (`loop` pads the rates to keep theirs fixed).
        self._loops: dict[str, tf.types.experimental.GenericFunction] = {}

    def compiled_loop(self, iterator) -> tf.types.experimental.GenericFunction:
        """The compiled multi-step loop for `iterator`'s batches (made on first use)."""
        key = repr(iterator.element_spec)
        if key not in self._loops:
            self._loops[key] = tf.function(self.run_steps, reduce_retracing=True)
        return self._loops[key]

    def replica_step(self, batch: dict) -> tf.Tensor:
        """One tower's part of a step: gradients applied, its `train_metrics.SUMS` returned."""
        policy = self.policy
        count = policy.denominator(batch["mask"])
        gradients, loss_sum, correct, regularization = self.tower(batch, count, policy.shares())
        policy.apply(self.optimizer, gradients, self.tower.model.trainable_variables)
        # In SUMS order, reduced as one vector. The regularization is the
        # same on every replica: its share here sums back to one copy.
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        return tf.stack(
            [tf.reduce_sum(batch["mask"]), loss_sum, correct, regularization / replicas]
        )

    @compat.converted_by_autograph
    def run_steps(
        self, iterator, learning_rates: tf.Tensor, count: tf.Tensor, stop: tf.Variable | None
    ):
        """The compiled loop's body: up to `count` steps; (summed SUMS, steps, input wait)."""
        totals = tf.zeros([len(SUMS)])
        done = tf.constant(0)
        waited = tf.constant(0.0, tf.float64)
        for i in tf.range(count):
            if stop is not None and self.policy.may_stop(stop):
                break
            optim.set_learning_rate(self.optimizer, learning_rates[i])
            if self.time_input:
                # The time spent waiting for the batch: ~0 unless the input is the bottleneck.
                with tf.control_dependencies([totals]):  # After the previous step.
                    asked = tf.timestamp()
                with tf.control_dependencies([asked]):
                    batch = next(iterator)
                with tf.control_dependencies(_local_tensors(self.strategy, batch)):
                    waited += tf.timestamp() - asked
            else:
                batch = next(iterator)
            sums = self.strategy.run(self.replica_step, args=(batch,))
            self.policy.after_step()
            if self.ema is not None:
                self._update_ema()
            sums = self.strategy.reduce(SUM, sums, axis=None)
            if self.last_step is not None:
                self.last_step.commit(after=[sums])
            totals += sums
            done = i + 1
            if not tf.reduce_all(tf.math.is_finite(sums)):
                break  # Diverged: the weights are no longer worth training.
        return totals, done, waited

    def _update_ema(self) -> None:
        """The moving average follows the weights whenever they are the global model."""

        def update():
            self.ema.update(self.strategy, self.optimizer.iterations)

        due = self.policy.global_now()
        if due is None:
            update()
        else:
            tf.cond(due, update, lambda: None)

    def loop(
        self,
        iterator,
        learning_rates,
        stop: tf.Variable | None = None,
        pad_to: int | None = None,
    ) -> LoopResult:
        """Runs up to len(learning_rates) steps, step i with learning rate learning_rates[i].

        The call ends early, after the step in progress, once `stop` is True
        (read before every step; another thread may set it; the policy's
        `may_stop` may make it wait for an average), or right after a step
        whose loss is not finite.

        Args:
          iterator: over the distributed training dataset.
          learning_rates: one value per step.
          stop: a boolean variable outside any strategy, or None.
          pad_to: the most steps any call runs (`steps_per_loop`): the rates
            are padded to it, so calls of any length share one trace.

        Returns:
          The `LoopResult`.
        """
        count = len(learning_rates)
        rates = list(learning_rates) + [0.0] * max(0, (pad_to or 0) - count)
        compiled = self.compiled_loop(iterator)
        totals, done, waited = compiled(
            iterator, tf.constant(rates, tf.float32), tf.constant(count), stop
        )
        sums = {name: float(value) for name, value in zip(SUMS, totals.numpy())}
        return LoopResult(steps=int(done), sums=sums, input_wait=float(waited))
