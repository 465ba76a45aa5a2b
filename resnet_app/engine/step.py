"""The training step: each tower's gradients, applied as the sync policy says.

A `Tower` sums its batch's loss terms over the real examples and divides by the
policy's `count` (the global batch's real examples under all-reduce, the
tower's own under local SGD), plus the regularization divided by the towers
that share it: one device's update on the whole batch, however split. Gradient
accumulation sums the gradients of `accumulate_steps` slices run one after
another. `TrainStep.loop` runs several steps per call of one compiled function,
each at the learning rate the host computed, reads a stop flag before every
step, and ends the call after a step whose sums are not finite.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from resnet_app.common import compat
from resnet_app.engine import optim, sync
from resnet_app.engine.losses import Loss, consistency
from resnet_app.engine.train_metrics import LoopResult
from resnet_app.nets import drop_path

SUM = tf.distribute.ReduceOp.SUM


def _dense(gradients: list, variables: list) -> list[tf.Tensor]:
    """Zeros for variables the loss does not reach: both branches of a cond must match."""
    return [
        tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
        for g, v in zip(gradients, variables)
    ]


class Tower:
    """One tower's gradients and sums (`names`).

    Args:
      model, optimizer: built in the strategy's scope.
      loss: the `losses.Loss` (default: cross-entropy).
      seed: with the step and each example's id, keys stochastic depth and dropout.
      accumulate_steps: micro-batches per tower batch.
      jit: compile the forward and backward pass with XLA.
    """

    def __init__(self, model, optimizer, loss=None, seed=0, accumulate_steps=1, jit=False):
        self.model, self.optimizer, self.seed = model, optimizer, seed
        self.loss = Loss() if loss is None else loss
        self.accumulate_steps = accumulate_steps
        self.names = (*self.loss.names, "regularization")
        self._forward_backward = (
            tf.function(self._gradients, jit_compile=True) if jit else self._gradients
        )

    def logits(self, batch: dict) -> tf.Tensor:
        """Training-mode logits of the images and AugMix's views, in one forward pass."""
        images = consistency.stacked_images(batch)
        if not getattr(self.model, "uses_example_keys", False):
            return self.model(images, training=True)
        # Keyed by the step about to be applied: the optimizer's count, restored on resume.
        ids, copies = consistency.stacked_keys(batch)
        keys = drop_path.example_keys(self.seed, self.optimizer.iterations, ids, copies)
        return self.model(images, training=True, drop_keys=keys)

    def regularization(self) -> tf.Tensor:
        """The model's L2 penalties (computed from the weights when read)."""
        return tf.add_n([tf.cast(x, tf.float32) for x in self.model.losses] or [tf.constant(0.0)])

    def _gradients(self, batch: dict, count: tf.Tensor, shares: int) -> tuple[list, dict]:
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            logits, batch = consistency.split(self.logits(batch), batch)
            sums = {**self.loss(logits, batch, self.model), "regularization": self.regularization()}
            # The regularization counted once over all towers and micro-batches.
            loss = tf.math.divide_no_nan(sums["loss"], count) + sums["regularization"] / (
                shares * self.accumulate_steps
            )
            scaled = self.optimizer.scale_loss(loss)  # fp16's loss scale; else the identity.
        return _dense(tape.gradient(scaled, variables), variables), sums

    @compat.converted_by_autograph
    def __call__(self, batch: dict, count: tf.Tensor, shares: int) -> tuple[list, dict]:
        """(gradients, sums): `count` divides the loss, `shares` the regularization; over
        `accumulate_steps` consecutive slices, each divided by the whole batch's count
        (BatchNorm normalizes each by its own statistics)."""
        steps = self.accumulate_steps
        if steps == 1:
            return self._forward_backward(batch, count, shares)
        size = tf.shape(batch["label"])[0] // steps
        gradients = [tf.zeros(v.shape, v.dtype) for v in self.model.trainable_variables]
        sums = dict.fromkeys(self.names, tf.constant(0.0))
        for i in tf.range(steps):
            micro = {key: value[i * size : (i + 1) * size] for key, value in batch.items()}
            more, micro_sums = self._forward_backward(micro, count, shares)
            gradients = [a + b for a, b in zip(gradients, more, strict=True)]
            sums = {  # The regularization is the same in every slice.
                name: value if name == "regularization" else sums[name] + value
                for name, value in micro_sums.items()
            }
        return gradients, sums


class TrainStep:
    """The compiled training loop of a `Tower` under a strategy.

    Args:
      tower: the `Tower`.
      strategy: the distribution strategy.
      policy: the sync policy (`sync.create_policy`); None: all-reduce.
      ema: the moving average of the weights (it follows the global model), or None.
      last_step: the copy of the last completed step (`last_step.py`), or None.
      time_input: time each step's wait for its batch (op determinism refuses clocks).
    """

    def __init__(self, tower, strategy, policy=None, ema=None, last_step=None, time_input=True):
        self.tower, self.optimizer, self.strategy = tower, tower.optimizer, strategy
        self.policy = sync.AllReduce(strategy, tower.model) if policy is None else policy
        self.ema, self.last_step, self.time_input = ema, last_step, time_input
        self.names = ("examples", *tower.names)  # The sums a step returns.
        self._loops = {}  # One compiled loop per input shape (progressive resizing).

    def compiled_loop(self, iterator) -> tf.types.experimental.GenericFunction:
        """The compiled multi-step loop for `iterator`'s batches (made on first use)."""
        key = repr(iterator.element_spec)
        if key not in self._loops:
            self._loops[key] = tf.function(self.run_steps, reduce_retracing=True)
        return self._loops[key]

    def replica_step(self, batch: dict) -> tf.Tensor:
        """One tower's part of a step: its gradients applied, its sums (`names`) returned."""
        policy = self.policy
        gradients, sums = self.tower(batch, policy.denominator(batch["mask"]), policy.shares())
        policy.apply(self.optimizer, gradients, self.tower.model.trainable_variables)
        # The same regularization on every replica: its share here sums back to one copy.
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        sums = {**sums, "examples": tf.reduce_sum(batch["mask"])}
        sums["regularization"] /= replicas
        return tf.stack([sums[name] for name in self.names])

    @compat.converted_by_autograph
    def run_steps(self, iterator, learning_rates, count, stop):
        """The compiled loop's body: up to `count` steps; (summed sums, steps, input wait)."""
        totals = tf.zeros([len(self.names)])
        done = tf.constant(0)
        waited = tf.constant(0.0, tf.float64)
        for i in tf.range(count):
            if stop is not None and self.policy.may_stop(stop):
                break
            optim.set_learning_rate(self.optimizer, learning_rates[i])
            if self.time_input:
                with tf.control_dependencies([totals]):  # After the previous step.
                    asked = tf.timestamp()
                with tf.control_dependencies([asked]):
                    batch = next(iterator)
                local = self.strategy.experimental_local_results(batch)
                with tf.control_dependencies(tf.nest.flatten(local)):
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
        update = functools.partial(self.ema.update, self.strategy, self.optimizer.iterations)
        due = self.policy.global_now()  # None: the weights are always the global model.
        if due is None:
            update()
        else:
            tf.cond(due, update, lambda: None)

    def loop(self, iterator, learning_rates, stop=None, pad_to=None) -> LoopResult:
        """Runs up to len(learning_rates) steps, step i at learning_rates[i], until
        `stop` (a boolean variable another thread may set) is True and the policy lets
        it. `pad_to` (the most steps any call runs) pads the rates: one trace for all."""
        count = len(learning_rates)
        rates = list(learning_rates) + [0.0] * max(0, (pad_to or 0) - count)
        compiled = self.compiled_loop(iterator)
        totals, done, waited = compiled(
            iterator, tf.constant(rates, tf.float32), tf.constant(count), stop
        )
        sums = {name: float(value) for name, value in zip(self.names, totals.numpy())}
        return LoopResult(int(done), sums, float(waited))
