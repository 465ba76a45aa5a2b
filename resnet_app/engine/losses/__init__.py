"""The training loss: a sum of terms, one module each in this package.

A term is a frozen dataclass: its settings, a `name` (its metric is
"loss_<name>"), a `weight` and `term(logits, batch, model)`, the float32
per-example losses of float32 logits. `Loss` sums the active terms over the
real examples; `create_loss` picks them from the config: the label term
`train.loss` names (`config.sections.LOSSES`, the one registry), distillation
with a teacher, AugMix's consistency with its views.
"""

from __future__ import annotations

import dataclasses
import pkgutil
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import tensorflow as tf

from resnet_app.config import Config
from resnet_app.config.sections import LOSSES
from resnet_app.engine.losses.consistency import Consistency
from resnet_app.engine.losses.distillation import Distillation


@dataclasses.dataclass(frozen=True)
class LabelTerm:
    """A term of the logits against the labels: what `train.loss` names.

    Attributes:
      label_smoothing: s gives each class s / classes and the targets the rest.
      target_threshold: targets above it become 1 and the rest 0, after
        smoothing and mixing (`train.bce_target_threshold`); None keeps them soft.
      weight: the term's weight in the sum.
    """

    name: ClassVar[str] = ""
    label_smoothing: float = 0.0
    target_threshold: float | None = None
    weight: float = 1.0

    def targets(self, batch: dict, logits: tf.Tensor) -> tf.Tensor:
        """Soft targets: one-hot (multi-label rows as they are), or Mixup/CutMix's two
        labels by their shares (`data/mixing.py`); then smoothed and thresholded."""
        classes = tf.shape(logits)[-1]

        def hot(labels):
            if labels.shape.rank == 2:
                return tf.cast(labels, tf.float32)
            return tf.one_hot(labels, classes)

        targets = hot(batch["label"])
        if "mix_label" in batch:
            weight = batch["mix_weight"][:, None]
            targets = weight * targets + (1 - weight) * hot(batch["mix_label"])
        smoothing = self.label_smoothing
        targets = targets * (1 - smoothing) + smoothing / tf.cast(classes, tf.float32)
        if self.target_threshold is not None:
            targets = tf.cast(targets > self.target_threshold, tf.float32)
        return targets


def label_term(name: str) -> type[LabelTerm]:
    """The label term class `train.loss` names (imported now if named as "module:Class")."""
    found = LOSSES[name]
    return pkgutil.resolve_name(found) if isinstance(found, str) else found


@dataclasses.dataclass(frozen=True)
class Loss:
    """`loss(logits, batch, model)`: sums over a batch's real examples (mask 1).

    Attributes:
      terms: summed in this order, each times its weight (default: cross-entropy).
      class_weights: float32 [classes] (`data/class_balance.py`): each example's
        sum counts by its class's weight (with Mixup, the dominant label's); the
        step still divides by the example count, so balanced weights (mean 1)
        keep the loss on the scale the learning rate was tuned for.
    """

    terms: tuple[Any, ...] = ()
    class_weights: np.ndarray | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        if not self.terms:
            object.__setattr__(self, "terms", (label_term("cross_entropy")(),))

    @property
    def names(self) -> tuple[str, ...]:
        """The sums' names: "loss", "correct", and each term's share when there are several."""
        shares = [f"loss_{term.name}" for term in self.terms] if len(self.terms) > 1 else []
        return ("loss", "correct", *shares)

    def __call__(self, logits: tf.Tensor, batch: dict, model=None) -> dict[str, tf.Tensor]:
        logits = tf.cast(logits, tf.float32)
        labels, mask = batch["label"], batch["mask"]
        weight = mask
        if self.class_weights is not None:
            weight = mask * tf.gather(tf.constant(self.class_weights, tf.float32), labels)
        shares = []
        for term in self.terms:
            value = term.term(logits, batch, model)
            shares.append(value if term.weight == 1 else term.weight * value)
        per_example = sum(shares[1:], shares[0])
        top = tf.argmax(logits, -1, output_type=tf.int32)
        if labels.shape.rank == 2:  # Multi-label: the top class is one of the example's.
            hit = tf.gather(labels, top, batch_dims=1) > 0.5
        else:
            hit = tf.equal(top, labels)
        sums = {
            "loss": tf.reduce_sum(weight * per_example),
            "correct": tf.reduce_sum(mask * tf.cast(hit, tf.float32)),
        }
        for name, share in zip(self.names[2:], shares):
            sums[name] = tf.reduce_sum(weight * share)
        return sums


def create_loss(
    config: Config,
    class_weights: np.ndarray | None = None,
    teacher: Callable[[tf.Tensor], tf.Tensor] | None = None,
) -> Loss:
    """The run's loss: its label term, with distillation from `teacher` (the label
    term then weighs 1 - distill_alpha) and AugMix's consistency when set."""
    train, jsd = config.train, config.data.augment.augmix_jsd
    alpha = 0.0 if teacher is None else train.distill_alpha
    terms = [label_term(train.loss)(train.label_smoothing, train.bce_target_threshold, 1 - alpha)]
    if teacher is not None:
        terms.append(Distillation(teacher, train.distill_temperature, alpha))
    if jsd:
        terms.append(Consistency(jsd))
    return Loss(tuple(terms), class_weights)
