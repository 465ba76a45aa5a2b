"""One tower's forward and backward pass: its gradients and its loss sums.

A tower sums the per-example loss over its real examples (mask 1) and divides
by `count`, the loss's denominator the sync policy gives: the number of real
examples in the GLOBAL batch, summed across towers (all-reduce, whose applied
update sums the towers' gradients), or the tower's own (model averaging). It
adds the regularization loss divided by `shares`, the towers that share it,
so that it is counted exactly once. The update is then the gradient of the
global mean loss plus the regularization: the same update as one device on
the whole batch, whatever the split, including a short last batch.

Gradient accumulation splits the tower's batch into `accumulate_steps`
micro-batches run one after the other, their gradients summed into one
update: the update of the whole batch (exactly, without BatchNorm) in the
memory of one micro-batch.

A tower that receives no example (a batch smaller than the number of towers)
contributes no data gradient. With per-tower BatchNorm it skips its forward
pass, whose batch statistics would be 0/0 and poison the moving averages;
with synchronized BatchNorm it must join the statistics' all-reduce, where
the cross-tower moments ignore it. (On CPUs, TF 2.21's oneDNN convolution
mis-shapes an empty batch and the all-reduce aborts; TF_ENABLE_ONEDNN_OPTS=0
avoids it. The trainer never makes an empty tower: its batches are full and
divisible by the number of towers.)
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from resnet_app.common import compat
from resnet_app.engine import consistency
from resnet_app.engine.losses import Loss
from resnet_app.nets import drop_path

Gradients = tuple[list[tf.Tensor], tf.Tensor, tf.Tensor, tf.Tensor]
"""(gradients, loss sum, correct count, regularization) of one tower's batch."""


def _has_synchronized_batch_norm(model: keras.Model) -> bool:
    return any(
        isinstance(layer, keras.layers.BatchNormalization) and layer.synchronized
        for layer in compat.nested_layers(model)
    )


def skips_empty_towers(
    model: keras.Model, strategy: tf.distribute.Strategy, partial_batches: bool
) -> bool:
    """Whether a tower must guard its forward pass against an empty batch: when
    batches may be partial, with several towers and per-tower BatchNorm. The
    cond costs about 45% of ResNet-20's step rate on a CPU, so it is only built
    when one can occur."""
    return (
        partial_batches
        and strategy.num_replicas_in_sync > 1
        and not _has_synchronized_batch_norm(model)
    )


def _dense(gradients: list, variables: list) -> list[tf.Tensor]:
    """Zeros for variables the loss does not reach: both branches of a cond must match."""
    return [
        tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
        for g, v in zip(gradients, variables)
    ]


class Tower:
    """The gradients of one tower's batch.

    Args:
      model: the model.
      optimizer: its optimizer (its update count keys stochastic depth; it
        scales the loss under fp16).
      loss: the `Loss`.
      seed: the run's seed: with the step and each example's id, it keys the
        model's stochastic depth draws (`nets/drop_path.py`).
      accumulate_steps: micro-batches per tower batch.
      jit: compile the forward and backward pass with XLA (collectives and
        the optimizer update stay outside it).
      skip_empty: guard the forward pass against an empty batch
        (`skips_empty_towers`).
      teacher: knowledge distillation's `teacher.Teacher`, whose logits of
        each (micro-)batch's images join the batch as "teacher_logits" for
        the loss; or None.
    """

    def __init__(
        self,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        loss: Loss | None = None,
        seed: int = 0,
        accumulate_steps: int = 1,
        jit: bool = False,
        skip_empty: bool = False,
        teacher: Callable[[tf.Tensor], tf.Tensor] | None = None,
    ):
        self.model = model
        self.optimizer = optimizer
        self.loss = Loss() if loss is None else loss
        self.seed = seed
        self.accumulate_steps = accumulate_steps
        self.skip_empty = skip_empty
        self.teacher = teacher
        self._forward_backward = (
            tf.function(self._gradients, jit_compile=True) if jit else self._gradients
        )

    def __call__(self, batch: dict, count: tf.Tensor, shares: int) -> Gradients:
        """The tower's `Gradients`; `count` divides the loss sum, `shares` the regularization."""
        if not self.skip_empty:
            return self._accumulated(batch, count, shares)
        return tf.cond(
            tf.shape(batch["label"])[0] > 0,
            lambda: self._accumulated(batch, count, shares),
            lambda: self._regularization_only(shares),
        )

    def logits(self, batch: dict) -> tf.Tensor:
        """Training-mode logits; stochastic depth and dropout keyed by (seed, step, id).

        With AugMix's views, those of the images, then of every first and every
        second view (`consistency.stacked_images`), from one forward pass.
        """
        images = consistency.stacked_images(batch)
        if not getattr(self.model, "uses_example_keys", False):
            return self.model(images, training=True)
        # The step about to be applied: the optimizer's update count, restored on resume.
        ids, copies = consistency.stacked_keys(batch)
        keys = drop_path.example_keys(self.seed, self.optimizer.iterations, ids, copies)
        return self.model(images, training=True, drop_keys=keys)

    def regularization(self) -> tf.Tensor:
        """The model's L2 penalties (computed from the weights when read)."""
        return tf.add_n([tf.cast(x, tf.float32) for x in self.model.losses] or [tf.constant(0.0)])

    def _gradients(self, batch: dict, count: tf.Tensor, shares: int) -> Gradients:
        variables = self.model.trainable_variables
        if self.teacher is not None:  # Outside the tape: no gradient flows into it.
            batch = {**batch, "teacher_logits": self.teacher(batch["image"])}
        with tf.GradientTape() as tape:
            logits, batch = consistency.split(self.logits(batch), batch)
            loss_sum, correct = self.loss(logits, batch)
            regularization = self.regularization()
            # Counted once over all towers and micro-batches.
            loss = tf.math.divide_no_nan(loss_sum, count) + regularization / (
                shares * self.accumulate_steps
            )
            # Times the loss scale under fp16 (apply_gradients divides it out);
            # the identity for other optimizers.
            scaled = self.optimizer.scale_loss(loss)
        gradients = _dense(tape.gradient(scaled, variables), variables)
        return gradients, loss_sum, correct, regularization

    def _regularization_only(self, shares: int) -> Gradients:
        """An empty tower's part: no forward pass, but its share of the regularization."""
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            regularization = self.regularization()
            loss = self.optimizer.scale_loss(regularization / shares)
        gradients = _dense(tape.gradient(loss, variables), variables)
        return gradients, tf.constant(0.0), tf.constant(0.0), regularization

    @compat.converted_by_autograph
    def _accumulated(self, batch: dict, count: tf.Tensor, shares: int) -> Gradients:
        """The forward and backward pass over `accumulate_steps` consecutive slices.

        Each slice's loss is divided by the whole batch's count, so the slices'
        gradients add up to the whole batch's, with only one slice's
        activations alive at once. BatchNorm normalizes each slice by its own
        statistics and updates its moving averages once per slice.
        """
        steps = self.accumulate_steps
        if steps == 1:
            return self._forward_backward(batch, count, shares)
        size = tf.shape(batch["label"])[0] // steps
        variables = self.model.trainable_variables
        gradients = [tf.zeros(v.shape, v.dtype) for v in variables]
        loss_sum = correct = tf.constant(0.0)
        regularization = tf.constant(0.0)
        for i in tf.range(steps):
            micro = {key: value[i * size : (i + 1) * size] for key, value in batch.items()}
            more, micro_loss, micro_correct, regularization = self._forward_backward(
                micro, count, shares
            )
            gradients = [a + b for a, b in zip(gradients, more, strict=True)]
            loss_sum += micro_loss
            correct += micro_correct
        return gradients, loss_sum, correct, regularization
