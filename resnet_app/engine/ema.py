"""The moving average of the weights (`train.ema_decay`) and SWA's (`train.swa_start`).

After every update a second model of the network moves towards the trained one,
`ema <- d * ema + (1 - d) * w`, BatchNorm statistics included (timm's
`ModelEmaV2`): a model of its own, evaluated, saved (the checkpoint's `ema`) and
exported as any, resumed bitwise. `train.ema_warmup` uses min(d, (1 + n) / (10 +
n)) at update n. Each replica's copy follows its own weights; under model averaging
(interval K) only the averaged weights, with d**K. An fp16 step that overflowed
leaves the weights, but the average still steps (as timm's).

SWA (`SwaAverage`, Izmailov et al. 2018) is the same copy with decay 0 before the
start update S, n/(n+1) at update S + n*P (torch's `AveragedModel`) and 1
between; its BatchNorm statistics are measured again at the run's end.
"""

from __future__ import annotations

import keras
import tensorflow as tf


class WeightEMA:
    """The moving average of `model`'s variables, held in `average_model` (the same
    network, built in the same scope but outside `local_sgd.local_variables()`), with
    decay d in (0, 1), updated once per `every` optimizer updates with d**every."""

    def __init__(
        self,
        model: keras.Model,
        average_model: keras.Model,
        decay: float,
        warmup: bool = False,
        every: int = 1,
    ):
        if not 0 < decay < 1:
            raise ValueError(f"the EMA decay must be in (0, 1), got {decay}")
        self.model, self.decay, self.warmup, self.every = average_model, decay, warmup, every
        pairs = zip(average_model.variables, model.variables, strict=True)
        self._pairs = [(a.value, w.value) for a, w in pairs]
        mismatched = [
            (a.name, w.name) for a, w in self._pairs if a.shape != w.shape or a.dtype != w.dtype
        ]
        if mismatched:
            raise ValueError(f"the average's variables do not match the model's: {mismatched[:3]}")
        average_model.trainable = False  # Never trained; only assigned.

    def reset(self) -> None:
        """Sets the average to the model's weights (eagerly, across replicas): its start."""
        for average, weight in self._pairs:
            average.assign(weight.read_value())

    def decay_at(self, updates: tf.Tensor, every: int | None = None) -> tf.Tensor:
        """The decay after `updates` optimizer updates, `every` (default: the interval) at once."""
        every = self.every if every is None else every
        decay = tf.constant(self.decay, tf.float32)
        if self.warmup:
            n = tf.cast(updates, tf.float32)
            decay = tf.minimum(decay, (1.0 + n) / (10.0 + n))
        return decay**every if every > 1 else decay

    def update(
        self, strategy: tf.distribute.Strategy, updates: tf.Tensor, every: int | None = None
    ) -> None:
        """In cross-replica context: each replica's average takes one step towards that
        replica's weights; `updates` is the optimizer's count after the step."""
        decay = self.decay_at(updates, every)

        def step(average, weight):
            return average.assign(decay * average + (1.0 - decay) * weight)

        for average, weight in self._pairs:
            strategy.extended.update(average, step, args=(weight,), group=False)

    def update_now(self, strategy: tf.distribute.Strategy, updates: tf.Variable) -> None:
        """Eagerly, after an average off the interval (a run's last step): the updates
        since the previous average at once."""
        count = int(updates.numpy())
        self.update(strategy, tf.constant(count), every=count % self.every or self.every)


class SwaAverage(WeightEMA):
    """SWA: the equal-weight mean of the models at updates `start`, `start + period`, ..."""

    def __init__(self, model: keras.Model, average_model: keras.Model, start: int, period: int):
        if start < 1 or period < 1:
            raise ValueError(f"SWA needs start >= 1 and period >= 1, got {start}, {period}")
        super().__init__(model, average_model, decay=0.5)
        self.start, self.period = start, period

    def decay_at(self, updates: tf.Tensor, every: int | None = None) -> tf.Tensor:
        """0 before `start`; n/(n+1) at the (n+1)-th model averaged; 1 between them."""
        del every  # All-reduce only: one update at a time.
        since = tf.cast(updates, tf.int64) - self.start
        count = tf.cast(tf.math.floordiv(since, self.period), tf.float32)
        averaged = tf.equal(tf.math.floormod(since, self.period), 0)
        decay = tf.where(averaged, count / (count + 1.0), 1.0)
        return tf.where(since < 0, 0.0, decay)
