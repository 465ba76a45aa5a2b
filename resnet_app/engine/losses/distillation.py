"""Knowledge distillation (Hinton et al. 2015) from `train.teacher` (`engine/teacher.py`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Distillation:
    """KL(softmax(teacher / T) || softmax(student / T)) per example, times T^2; for
    multi-label data the binary cross-entropy of each class's sigmoid(student / T)
    against sigmoid(teacher / T), averaged over the classes. The T^2 keeps its
    gradients on the label term's scale whatever T (the paper's section 2).

    Attributes:
      teacher: the teacher's float32 logits of a batch's images, without gradient.
      temperature: T.
      weight: alpha (`train.distill_alpha`); the label term weighs 1 - alpha.
    """

    name: ClassVar[str] = "distillation"
    teacher: Callable[[tf.Tensor], tf.Tensor]
    temperature: float = 4.0
    weight: float = 0.5

    def term(self, logits: tf.Tensor, batch: dict, model=None) -> tf.Tensor:
        temperature = self.temperature
        student = logits / temperature
        teacher = tf.cast(self.teacher(batch["image"]), tf.float32) / temperature
        if batch["label"].shape.rank == 2:
            per_class = tf.nn.sigmoid_cross_entropy_with_logits(tf.sigmoid(teacher), student)
            loss = tf.reduce_mean(per_class, axis=-1)
        else:
            log_teacher = tf.nn.log_softmax(teacher)
            log_student = tf.nn.log_softmax(student)
            loss = tf.reduce_sum(tf.exp(log_teacher) * (log_teacher - log_student), axis=-1)
        return loss * temperature**2
