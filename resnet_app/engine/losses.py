"""The training losses: pure functions of (logits, batch), one entry per kind.

`Loss(...)(logits, batch)` returns the batch's summed loss over its real
examples (mask 1) and its count of correct examples; the step divides the sum
by the global example count. A kind is one function from (soft or hard
targets, logits) to per-example losses, registered in `PER_EXAMPLE` under
the name `train.loss` takes (`config.sections.LOSSES` lists the same names
for the TensorFlow-free check; a test keeps the two equal).

- "cross_entropy": softmax cross-entropy; against integer labels when nothing
  softens them, else against the soft targets (label smoothing, Mixup/CutMix).
- "bce": binary cross-entropy of each class's sigmoid against the (smoothed)
  one-hot target, averaged over the classes (the loss of Wightman et al.
  2021's ResNet recipes, as timm's BinaryCrossEntropy computes it), with
  `bce_target_threshold` binarizing the targets (timm's `target_threshold`).

Multi-label batches (a float32 [batch, classes] multi-hot "label") train with
"bce" whatever `kind` says, and count as correct the examples whose top class
is one of theirs.

Knowledge distillation (Hinton et al. 2015): when the batch carries the
teacher's logits ("teacher_logits", `engine/teacher.py`), each example's loss
is (1 - alpha) * the loss above + alpha * T^2 * the soft loss, with T the
temperature: KL(softmax(teacher / T) || softmax(student / T)) for
single-label data, and for multi-label data the binary cross-entropy of each
class's sigmoid(student / T) against the teacher's sigmoid(teacher / T),
averaged over the classes. The T^2 keeps the soft loss's gradients on the
scale of the hard loss's whatever T is (the paper's section 2).

AugMix's consistency loss (Hendrycks et al. 2020): when the batch carries its
views' logits (`engine/consistency.py`), each example's loss adds
`jsd_weight` times the Jensen-Shannon divergence of its three predictions (a
class weight then scales the whole of it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from resnet_app.engine import consistency


def _softmax_cross_entropy(loss: Loss, batch: dict, logits: tf.Tensor) -> tf.Tensor:
    if not loss.label_smoothing and "mix_label" not in batch:
        return tf.nn.sparse_softmax_cross_entropy_with_logits(batch["label"], logits)
    return tf.nn.softmax_cross_entropy_with_logits(loss.targets(batch, logits), logits)


def _binary_cross_entropy(loss: Loss, batch: dict, logits: tf.Tensor) -> tf.Tensor:
    targets = loss.targets(batch, logits)
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(targets, logits), axis=-1)


def soft_loss(student: tf.Tensor, teacher: tf.Tensor, temperature: float, multi_label: bool):
    """Per-example distillation loss of float32 logits, times T^2 (not yet weighted by alpha)."""
    student, teacher = student / temperature, tf.cast(teacher, tf.float32) / temperature
    if multi_label:
        per_class = tf.nn.sigmoid_cross_entropy_with_logits(tf.sigmoid(teacher), student)
        loss = tf.reduce_mean(per_class, axis=-1)
    else:
        log_teacher = tf.nn.log_softmax(teacher)
        log_student = tf.nn.log_softmax(student)
        loss = tf.reduce_sum(tf.exp(log_teacher) * (log_teacher - log_student), axis=-1)
    return loss * temperature**2


PER_EXAMPLE: dict[str, Callable[[Loss, dict, tf.Tensor], tf.Tensor]] = {
    "cross_entropy": _softmax_cross_entropy,
    "bce": _binary_cross_entropy,
}
"""Each kind's per-example losses from (the loss's settings, the batch, float32 logits)."""


@dataclasses.dataclass(frozen=True)
class Loss:
    """A training loss: `loss(logits, batch) -> (loss sum, correct count)`.

    Attributes:
      kind: a key of `PER_EXAMPLE`.
      label_smoothing: s gives each class s / classes and the targets the rest.
      bce_target_threshold: with "bce", targets above this become 1 and the
        rest 0, after smoothing and mixing (the A3 recipe's 0.2); None keeps
        the soft targets.
      class_weights: float32 [classes] weights (`data/class_balance.py`): each
        example counts by its class's weight (with Mixup, the dominant
        label's), or None.
      distill_alpha: the distillation loss's weight when the batch carries
        "teacher_logits" (the rest is the loss above).
      distill_temperature: the temperature T of the distillation loss.
      jsd_weight: the weight of AugMix's consistency loss when the batch
        carries its views' logits (`consistency.LOGITS_KEY`).
    """

    kind: str = "cross_entropy"
    label_smoothing: float = 0.0
    bce_target_threshold: float | None = None
    class_weights: np.ndarray | None = dataclasses.field(default=None, compare=False)
    distill_alpha: float = 0.5
    distill_temperature: float = 4.0
    jsd_weight: float = 0.0

    def __post_init__(self):
        if self.kind not in PER_EXAMPLE:
            raise ValueError(f"unknown loss {self.kind!r}; known: {', '.join(PER_EXAMPLE)}")

    def __call__(self, logits: tf.Tensor, batch: dict) -> tuple[tf.Tensor, tf.Tensor]:
        logits = tf.cast(logits, tf.float32)
        labels, mask = batch["label"], batch["mask"]
        multi_label = labels.shape.rank == 2
        per_example = PER_EXAMPLE["bce" if multi_label else self.kind](self, batch, logits)
        if "teacher_logits" in batch:
            alpha = self.distill_alpha
            soft = soft_loss(logits, batch["teacher_logits"], self.distill_temperature, multi_label)
            per_example = (1 - alpha) * per_example + alpha * soft
        if consistency.LOGITS_KEY in batch:
            views = batch[consistency.LOGITS_KEY]
            per_example += self.jsd_weight * consistency.js_divergence(logits, views)
        weight = mask
        if self.class_weights is not None:
            # The sum is still divided by the real example count, not by the
            # weights' sum: the loss stays on the scale the learning rate was
            # tuned for when the weights average 1 over the data, as balanced
            # weights do exactly.
            weight = mask * tf.gather(tf.constant(self.class_weights, tf.float32), labels)
        top = tf.argmax(logits, -1, output_type=tf.int32)
        hit = tf.gather(labels, top, batch_dims=1) > 0.5 if multi_label else tf.equal(top, labels)
        correct = tf.reduce_sum(mask * tf.cast(hit, tf.float32))
        return tf.reduce_sum(weight * per_example), correct

    def targets(self, batch: dict, logits: tf.Tensor) -> tf.Tensor:
        """Soft targets: one-hot, or Mixup/CutMix's two labels by their shares; then smoothed.

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
