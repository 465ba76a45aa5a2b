"""Softmax cross-entropy (`train.loss: cross_entropy`), with label smoothing and Mixup's targets."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from resnet_app.engine.losses import LabelTerm
from resnet_app.engine.losses.bce import BinaryCrossEntropy


@dataclasses.dataclass(frozen=True)
class CrossEntropy(LabelTerm):
    """Against the integer labels when nothing softens them, else the soft targets.

    Multi-label rows train with `BinaryCrossEntropy`: a softmax would make
    their classes compete.
    """

    name: ClassVar[str] = "cross_entropy"

    def term(self, logits: tf.Tensor, batch: dict, model=None) -> tf.Tensor:
        if batch["label"].shape.rank == 2:
            return BinaryCrossEntropy.term(self, logits, batch, model)
        if not self.label_smoothing and "mix_label" not in batch:
            return tf.nn.sparse_softmax_cross_entropy_with_logits(batch["label"], logits)
        return tf.nn.softmax_cross_entropy_with_logits(self.targets(batch, logits), logits)
