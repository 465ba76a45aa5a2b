"""An exponential moving average (EMA) of the weights (`train.ema_decay`).

After every update the trainer moves a second copy of the model towards the
trained one:

    ema <- d * ema + (1 - d) * w

for every variable of the model: the weights and the BatchNorm moving
statistics (timm's `ModelEmaV2` and Model Garden's `ExponentialMovingAverage`
average the statistics too; Keras's optimizer `use_ema` averages only the
trainable weights, and keeps its average inside the optimizer). The copy
starts equal to the model's weights (after `train.init_from`), is a model of
its own (`WeightEMA.model`), so it is evaluated, saved (the checkpoint's
`ema` object) and exported as any model is; and it is a pure function of the
weights' history, so a run resumed from a checkpoint continues it bitwise.

With `train.ema_warmup` the decay of update n (1 for the first) is
min(d, (1 + n) / (10 + n)), the warm-up of TensorFlow's
`tf.train.ExponentialMovingAverage(num_updates=...)`: early averages do not
hold on to the random initialization.

Replicas: the copy is mirrored, and every replica's copy of it is updated
from that replica's own weights, with no communication; under the all-reduce
every replica holds the same weights, so every copy of the average stays the
same. (Per-tower BatchNorm, `model.bn_synchronized: false`, keeps moving
statistics per tower, as TF1's towers did; each tower's average follows its
own, and before every evaluation and save the towers' statistics of both are
averaged, `sync.AllReduce`: the averages are linear, so the mean of the
towers' averages is the average of the mean statistics.)

With model averaging (`sync.mode: model_average`, interval K) the copies of
the weights differ between averages, so the average is updated only right
after the weights are averaged, once per K updates, from the averaged
weights, with the decay d**K (min(...)**K while warming up): the same horizon
in updates as the all-reduce run's. A run whose length is not a multiple of K
averages once more at its end, and the average follows with d**(steps since).

An fp16 step whose loss scale overflowed leaves the weights as they were; the
average still takes its step towards them (as timm's `ModelEma` does).

Stochastic weight averaging (`train.swa_start`, Izmailov et al. 2018;
`SwaAverage`) is the same copy with another decay: before the start update S
it follows the weights (decay 0); at update S + n*P (P = `train.swa_every`) it
becomes the mean of the n + 1 models so far, a <- n/(n+1) * a + w/(n+1), the
running mean of torch's `AveragedModel`; between those updates it holds (decay
1). The decay is a function of the update count alone, so it too resumes
bitwise. Its BatchNorm statistics are the mean of the models' moving ones;
the run measures them again at its end for its averaged checkpoint
(`loop._write_swa_average`), as SWA prescribes.
"""

from __future__ import annotations

import keras
import tensorflow as tf


class WeightEMA:
    """The moving average of a model's variables, held in a second model of the same network.

    Args:
      model: the trained model.
      average_model: a second instance of the same network, built in the same
        strategy's scope (outside `averaging.local_variables()`); it becomes
        the average.
      decay: d, in (0, 1).
      warmup: use min(d, (1 + n) / (10 + n)) for update n.
      every: the average is updated once per this many optimizer updates
        (model averaging's interval), with the decay raised to this power.

    Raises:
      ValueError: when the two models' variables do not correspond.
    """

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
        self.model = average_model
        self.decay = decay
        self.warmup = warmup
        self.every = every
        # The TensorFlow variables (distributed ones under a strategy) behind Keras's.
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
        """The decay applied after `updates` optimizer updates, `every` (default:
        the interval) of them at once (float32)."""
        every = self.every if every is None else every
        decay = tf.constant(self.decay, tf.float32)
        if self.warmup:
            n = tf.cast(updates, tf.float32)
            decay = tf.minimum(decay, (1.0 + n) / (10.0 + n))
        return decay**every if every > 1 else decay

    def update(
        self, strategy: tf.distribute.Strategy, updates: tf.Tensor, every: int | None = None
    ) -> None:
        """In cross-replica context: one step of the average towards the weights.

        Each replica's copy of the average moves towards that replica's own
        weights (`extended.update` hands each device its own components).

        Args:
          strategy: the strategy the models were built in.
          updates: the optimizer's update count after the step (`iterations`).
          every: the optimizer updates this one stands for (default: the interval).
        """
        decay = self.decay_at(updates, every)

        def step(average, weight):
            return average.assign(decay * average + (1.0 - decay) * weight)

        for average, weight in self._pairs:
            strategy.extended.update(average, step, args=(weight,), group=False)

    def update_now(self, strategy: tf.distribute.Strategy, updates: tf.Variable) -> None:
        """Eagerly, after an average off the interval (a run's last step): the
        updates since the previous average, at once (decay d**(updates % K))."""
        count = int(updates.numpy())
        self.update(strategy, tf.constant(count), every=count % self.every or self.every)


class SwaAverage(WeightEMA):
    """Stochastic weight averaging: the equal-weight mean of the models at updates
    `start`, `start + period`, ... (see the module docstring).

    Args:
      model: the trained model.
      average_model: a second instance of the same network (see `WeightEMA`).
      start: the update count of the first model averaged (>= 1).
      period: the updates between two models averaged (>= 1).
    """

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
