"""The training step: one tower's loss and gradients, run on every replica.

Each tower sums the per-example cross-entropy over its real examples (mask 1)
and divides by the number of real examples in the GLOBAL batch, summed across
towers; it adds the regularization loss divided by the number of replicas.
Gradients are summed across replicas when applied (Keras all-reduces with SUM),
so the update is the gradient of the global mean loss plus the regularization
counted exactly once: the same update as one device on the whole batch,
whatever the split, including a short last batch.

A tower that receives no example (a batch smaller than the number of towers)
contributes no data gradient. With per-tower BatchNorm it skips its forward
pass, whose batch statistics would be 0/0 and poison the moving averages;
with synchronized BatchNorm it must join the statistics' all-reduce, where
the cross-tower moments ignore it. (On CPUs, TF 2.21's oneDNN convolution
mis-shapes an empty batch and the all-reduce aborts; TF_ENABLE_ONEDNN_OPTS=0
avoids it. The trainer never makes an empty tower: its batches are full and
divisible by the number of towers.)

`TrainStep.loop` runs several steps per call of one compiled function and
assigns the learning rate before each of them from a vector the host computed:
the TF2 form of feeding the learning rate through a placeholder every step.
It checks each step's metrics for NaN/Inf (they are reduced anyway, so this is
free) and ends the call at the first non-finite one; and it reads a stop flag
before every step, so a preempted run stops after the step in progress.

With model averaging (`averaging.ModelAveraging`, `sync.mode: model_average`)
the step changes in three places and nowhere else: a tower divides by its own
example count and counts the whole regularization (it steps alone), applies
its gradients to its own copy without all-reducing them, and after the step
the copies are averaged when the interval divides the step count; a stop
then waits for the next average. With the default all-reduce the compiled
step is what it was.
"""

from __future__ import annotations

import dataclasses
import math

import keras
import tensorflow as tf

from resnet_app.common import compat
from resnet_app.engine import averaging as averaging_lib
from resnet_app.engine import ema as ema_lib
from resnet_app.engine import optim
from resnet_app.engine.interval import SUMS
from resnet_app.engine.last_step import LastStep
from resnet_app.nets import drop_path

SUM = tf.distribute.ReduceOp.SUM


@dataclasses.dataclass(frozen=True)
class LoopResult:
    """What one call of `TrainStep.loop` did.

    Attributes:
      steps: the steps run (fewer than asked when stopped or diverged).
      sums: `interval.SUMS` summed over those steps: "examples", "loss" (summed
        cross-entropy), "correct", "regularization" (summed over steps).
      input_wait: seconds the steps waited for their batches.
    """

    steps: int
    sums: dict[str, float]
    input_wait: float = 0.0

    @property
    def finite(self) -> bool:
        return all(math.isfinite(v) for v in self.sums.values())


def _has_synchronized_batch_norm(model: keras.Model) -> bool:
    return any(
        isinstance(layer, keras.layers.BatchNormalization) and layer.synchronized
        for layer in compat.nested_layers(model)
    )


def _local_tensors(strategy: tf.distribute.Strategy, batch) -> list[tf.Tensor]:
    """Every local component of a distributed batch (for control dependencies)."""
    return [
        t for value in tf.nest.flatten(batch) for t in strategy.experimental_local_results(value)
    ]


def _dense(gradients: list, variables: list) -> list[tf.Tensor]:
    """Zeros for variables the loss does not reach: both branches of a cond must match."""
    return [
        tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
        for g, v in zip(gradients, variables)
    ]


class TrainStep:
    """Builds the distributed training loop for a model and optimizer.

    Args:
      model: built in `strategy.scope()`.
      optimizer: built in `strategy.scope()` with
        `optimizer.build(model.trainable_variables)`.
      strategy: the distribution strategy.
      label_smoothing: label smoothing of the targets.
      loss: "cross_entropy" (softmax) or "bce": binary cross-entropy of each
        class's sigmoid against the (smoothed) one-hot target, averaged over
        the classes (the loss of Wightman et al. 2021's ResNet recipes, as
        timm's BinaryCrossEntropy computes it).
      bce_target_threshold: with "bce", targets above this become 1 and the
        rest 0, after smoothing and mixing (timm's `target_threshold`; the A3
        recipe's 0.2); None keeps the soft targets.
      accumulate_steps: split each tower's batch into this many micro-batches,
        run one after the other, their gradients summed into one update: the
        update of the whole batch (exactly, without BatchNorm) in the memory
        of one micro-batch. A step is still one update of `batch_size`
        examples, so checkpoints fall between updates and resume exactly.
      seed: the run's seed: with the step and each example's id, it keys the
        model's stochastic depth draws (`nets/drop_path.py`).
      partial_batches: the dataset may give a tower no example (a batch
        smaller than the number of towers). Per-tower BatchNorm then needs a
        cond around the forward pass, which costs about 45% of the step rate
        of ResNet-20 on a CPU, so it is only built when asked for. The
        trainer's batches are always full and never need it.
      jit: compile each tower's forward and backward pass with XLA.
      time_input: measure the time each step waits for its batch (clock
        reads are refused under TensorFlow's op determinism).
      averaging: model averaging instead of the gradient all-reduce (the
        model and optimizer built in `averaging.local_variables()`), or None.
      ema: the moving average of the weights, updated after every step (with
        model averaging, after every average), or None.
      last_step: the copy of the last completed step (multi-worker runs,
        `last_step.py`), committed after every step, or None.
      class_weights: float32 [classes] loss weights (`data/class_balance.py`),
        or None.

    Multi-label batches (a float32 [batch, classes] multi-hot "label") train
    with binary cross-entropy of each class's sigmoid, whatever `loss` says,
    and count as correct the examples whose top class is one of theirs.
    """

    def __init__(
        self,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        strategy: tf.distribute.Strategy,
        label_smoothing: float = 0.0,
        partial_batches: bool = False,
        jit: bool = False,
        time_input: bool = True,
        averaging: averaging_lib.ModelAveraging | None = None,
        loss: str = "cross_entropy",
        accumulate_steps: int = 1,
        seed: int = 0,
        ema: ema_lib.WeightEMA | None = None,
        bce_target_threshold: float | None = None,
        last_step: LastStep | None = None,
        class_weights=None,
    ):
        self.model = model
        self.class_weights = None if class_weights is None else tf.constant(class_weights)
        self.last_step = last_step
        self.averaging = averaging
        self.optimizer = optimizer
        self.strategy = strategy
        self.label_smoothing = label_smoothing
        self.loss = loss
        self.accumulate_steps = accumulate_steps
        self.seed = seed
        self.ema = ema
        self.bce_target_threshold = bce_target_threshold
        self.time_input = time_input
        self.skip_empty_towers = (
            partial_batches
            and strategy.num_replicas_in_sync > 1
            and not _has_synchronized_batch_norm(model)
        )
        # The tower's forward and backward pass, compiled by XLA when asked
        # (collectives and the optimizer update stay outside it).
        self._forward_backward = (
            tf.function(self._gradients, jit_compile=True) if jit else self._gradients
        )
        # One compiled loop per input shape (progressive resizing's sizes), each
        # traced for its exact shapes (`loop` pads the rates to keep theirs fixed).
        self._loops: dict[str, tf.types.experimental.GenericFunction] = {}

    def compiled_loop(self, iterator) -> tf.types.experimental.GenericFunction:
        """The compiled multi-step loop for `iterator`'s batches (made on first use)."""
        key = repr(iterator.element_spec)
        if key not in self._loops:
            self._loops[key] = tf.function(self._loop_fn, reduce_retracing=True)
        return self._loops[key]

    def _logits(self, batch: dict) -> tf.Tensor:
        """Training-mode logits; stochastic depth and dropout keyed by (seed, step, id)."""
        if not getattr(self.model, "uses_example_keys", False):
            return self.model(batch["image"], training=True)
        # The step about to be applied: the optimizer's update count, restored on resume.
        keys = drop_path.example_keys(self.seed, self.optimizer.iterations, batch["id"])
        return self.model(batch["image"], training=True, drop_keys=keys)

    def _losses(self, batch: dict):
        logits = tf.cast(self._logits(batch), tf.float32)
        labels, mask = batch["label"], batch["mask"]
        multi_label = labels.shape.rank == 2
        if self.loss == "bce" or multi_label:
            per_example = tf.reduce_mean(
                tf.nn.sigmoid_cross_entropy_with_logits(self._targets(batch, logits), logits),
                axis=-1,
            )
        elif self.label_smoothing or "mix_label" in batch:
            per_example = tf.nn.softmax_cross_entropy_with_logits(
                self._targets(batch, logits), logits
            )
        else:
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        weight = mask
        if self.class_weights is not None:
            # Each example counts by its class's weight (with Mixup, the dominant
            # label's). The sum is still divided by the real example count, not
            # by the weights' sum: the loss stays on the scale the learning rate
            # was tuned for when the weights average 1 over the data, as
            # balanced weights do exactly.
            weight = mask * tf.gather(self.class_weights, labels)
        loss_sum = tf.reduce_sum(weight * per_example)
        top = tf.argmax(logits, -1, output_type=tf.int32)
        # Multi-label: the top class is one of the example's.
        hit = tf.gather(labels, top, batch_dims=1) > 0.5 if multi_label else tf.equal(top, labels)
        correct = tf.reduce_sum(mask * tf.cast(hit, tf.float32))
        return loss_sum, correct, self._regularization()

    def _targets(self, batch: dict, logits: tf.Tensor) -> tf.Tensor:
        """Soft targets: one-hot, or Mixup/CutMix's two labels by their shares; then smoothed.

        Smoothing s gives each class s / classes and the targets the rest.
        Multi-label rows are their own targets, mixed and smoothed alike.
        """
        classes = tf.shape(logits)[-1]

        def hot(labels):
            if labels.shape.rank == 2:
                return tf.cast(labels, tf.float32)
            return tf.one_hot(labels, classes)

        targets = hot(batch["label"])
        if "mix_label" in batch:  # `data/mixing.py`: the dominant label's share, the other's.
            weight = batch["mix_weight"][:, None]
            targets = weight * targets + (1 - weight) * hot(batch["mix_label"])
        smoothing = self.label_smoothing
        targets = targets * (1 - smoothing) + smoothing / tf.cast(classes, tf.float32)
        if self.bce_target_threshold is not None:
            targets = tf.cast(targets > self.bce_target_threshold, tf.float32)
        return targets

    def _regularization(self) -> tf.Tensor:
        """The model's L2 penalties (computed from the weights when read)."""
        return tf.add_n([tf.cast(x, tf.float32) for x in self.model.losses] or [tf.constant(0.0)])

    def _shares(self) -> int:
        """How many towers share the regularization: all of them, or with model
        averaging none (each tower steps alone, so it counts the whole of it)."""
        if self.averaging is not None:
            return 1
        return tf.distribute.get_replica_context().num_replicas_in_sync

    def _gradients(self, batch: dict, count: tf.Tensor):
        """One tower's gradients and its loss sum, correct count and regularization.

        `count` is the loss's denominator: the global batch's example count, or
        with model averaging this tower's.
        """
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss_sum, correct, regularization = self._losses(batch)
            # Regularization is counted once over all towers (and micro-batches).
            shares = self._shares() * self.accumulate_steps
            loss = tf.math.divide_no_nan(loss_sum, count) + regularization / shares
            # Times the loss scale under fp16 (apply_gradients divides it out);
            # the identity for other optimizers.
            scaled = self.optimizer.scale_loss(loss)
        gradients = _dense(tape.gradient(scaled, variables), variables)
        return gradients, loss_sum, correct, regularization

    @compat.converted_by_autograph
    def _accumulated(self, batch: dict, count: tf.Tensor):
        """`_forward_backward` over `accumulate_steps` consecutive slices of the tower's batch.

        The slices' gradients add up to the whole batch's (each slice's loss is
        divided by the whole batch's count), computed one slice at a time, so
        only one slice's activations are alive at once. BatchNorm normalizes
        each slice by its own statistics and updates its moving averages once
        per slice.
        """
        steps = self.accumulate_steps
        if steps == 1:
            return self._forward_backward(batch, count)
        size = tf.shape(batch["label"])[0] // steps
        variables = self.model.trainable_variables
        gradients = [tf.zeros(v.shape, v.dtype) for v in variables]
        loss_sum = correct = tf.constant(0.0)
        regularization = tf.constant(0.0)
        for i in tf.range(steps):
            micro = {key: value[i * size : (i + 1) * size] for key, value in batch.items()}
            more, micro_loss, micro_correct, regularization = self._forward_backward(micro, count)
            gradients = [a + b for a, b in zip(gradients, more, strict=True)]
            loss_sum += micro_loss
            correct += micro_correct
        return gradients, loss_sum, correct, regularization

    def replica_step(self, batch: dict) -> tf.Tensor:
        """One tower's part of a step: gradients applied, its `interval.SUMS` returned."""
        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync
        variables = self.model.trainable_variables
        if self.averaging is None:
            # The denominator is the real example count of the whole global
            # batch, because the gradients of all towers are summed when applied.
            count = context.all_reduce(SUM, tf.reduce_sum(batch["mask"]))
        else:
            # Model averaging: the tower steps alone, on the mean loss of its own
            # examples. With equal shares, the mean of the towers' steps is the
            # all-reduce step.
            count = tf.reduce_sum(batch["mask"])

        def forward_backward():
            return self._accumulated(batch, count)

        def empty_tower():
            # No forward pass, but this tower's share of the regularization.
            with tf.GradientTape() as tape:
                regularization = self._regularization()
                loss = self.optimizer.scale_loss(regularization / self._shares())
            gradients = _dense(tape.gradient(loss, variables), variables)
            return gradients, tf.constant(0.0), tf.constant(0.0), regularization

        if self.skip_empty_towers:
            has_examples = tf.shape(batch["label"])[0] > 0
            gradients, loss_sum, correct, regularization = tf.cond(
                has_examples, forward_backward, empty_tower
            )
        else:
            gradients, loss_sum, correct, regularization = forward_backward()
        if self.averaging is None:
            self.optimizer.apply_gradients(zip(gradients, variables))
        else:
            self.averaging.apply_locally(gradients, variables)
        # In SUMS order, reduced as one vector. The regularization is the
        # same on every replica: its share here sums back to one copy.
        return tf.stack(
            [tf.reduce_sum(batch["mask"]), loss_sum, correct, regularization / replicas]
        )

    @compat.converted_by_autograph
    def _loop_fn(
        self, iterator, learning_rates: tf.Tensor, count: tf.Tensor, stop: tf.Variable | None
    ):
        totals = tf.zeros([len(SUMS)])
        done = tf.constant(0)
        waited = tf.constant(0.0, tf.float64)
        for i in tf.range(count):
            if stop is not None and self._may_stop(stop):
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
            if self.averaging is not None:
                self.averaging.average_if_due()
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
        """The moving average's update after a step; with model averaging, after an average."""

        def update():
            self.ema.update(self.strategy, self.optimizer.iterations)

        if self.averaging is None or self.averaging.interval == 1:
            update()
        else:
            tf.cond(self.averaging.at_average(), update, lambda: None)

    def _may_stop(self, stop: tf.Variable):
        """Whether to stop before the next step: when asked to, and with model
        averaging only right after an average (what a checkpoint must hold)."""
        if self.averaging is None:
            return stop
        return tf.logical_and(tf.convert_to_tensor(stop), self.averaging.at_average())

    def loop(
        self,
        iterator,
        learning_rates,
        stop: tf.Variable | None = None,
        pad_to: int | None = None,
    ) -> LoopResult:
        """Runs up to len(learning_rates) steps, step i with learning rate learning_rates[i].

        The call ends early, after the step in progress, once `stop` is True
        (read before every step; another thread may set it; with model
        averaging, at the next average), or right after a step whose loss is
        not finite.

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
