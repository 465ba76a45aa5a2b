"""Binary cross-entropy (`train.loss: bce`): Wightman et al. 2021's loss for ResNets."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from resnet_app.engine.losses import LabelTerm


@dataclasses.dataclass(frozen=True)
class BinaryCrossEntropy(LabelTerm):
    """Each class's sigmoid against its (smoothed, mixed) target, averaged over the
    classes, as timm's `BinaryCrossEntropy` (`target_threshold` binarizes the targets)."""

    name: ClassVar[str] = "bce"

    def term(self, logits: tf.Tensor, batch: dict, model=None) -> tf.Tensor:
        targets = self.targets(batch, logits)
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(targets, logits), axis=-1)
