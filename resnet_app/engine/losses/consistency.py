"""AugMix's Jensen-Shannon consistency loss (Hendrycks et al. 2020, section 3).

With `data.augment.augmix_jsd` = lambda > 0 a training batch carries each
example's two AugMix views beside its image (`data/augmix.py`). The tower runs
the three as one batch of 3B (BatchNorm normalizes them together, as the
paper's code does) and each example's loss adds lambda * JS(p_image, p_view1,
p_view2), with M = the mean of the three clipped to [1e-7, 1] before its log,
as the paper's code and timm's `JsdCrossEntropy`. Accuracy counts the image's
logits. Each view draws its own stochastic depth; view 0 of copy 0 keeps the
key of a run without views.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from resnet_app.data.settings import AUGMIX_VIEWS as VIEWS

VIEWS_KEY = "augmix_views"  # float [batch, 2, H, W, C]: the example's AugMix views.
LOGITS_KEY = "view_logits"  # float32 [2, batch, classes]: their logits, for the loss.


def stacked_images(batch: dict) -> tf.Tensor:
    """Every image, then every first view, then every second (the images without views)."""
    if VIEWS_KEY not in batch:
        return batch["image"]
    views = batch[VIEWS_KEY]
    return tf.concat([batch["image"], views[:, 0], views[:, 1]], axis=0)


def stacked_keys(batch: dict) -> tuple[tf.Tensor, tf.Tensor | None]:
    """(ids, copies) of `stacked_images`' examples for `drop_path.example_keys`: a
    view's number joins its copy's (copy * 3 + view); copies None without views or repeats."""
    ids, copies = batch["id"], batch.get("copy")
    if VIEWS_KEY not in batch:
        return ids, copies
    copy = tf.zeros_like(ids, tf.int64) if copies is None else tf.cast(copies, tf.int64)
    copies = tf.concat([copy * VIEWS + view for view in range(VIEWS)], axis=0)
    return tf.tile(ids, [VIEWS]), copies


def split(logits: tf.Tensor, batch: dict) -> tuple[tf.Tensor, dict]:
    """The images' logits, and the batch with its views' logits (`LOGITS_KEY`)."""
    if VIEWS_KEY not in batch:
        return logits, batch
    clean, first, second = tf.split(logits, VIEWS, axis=0)
    return clean, {**batch, LOGITS_KEY: tf.stack([first, second])}


@dataclasses.dataclass(frozen=True)
class Consistency:
    """Each example's JS divergence of its three predictions, times `weight` (lambda)."""

    name: ClassVar[str] = "consistency"
    weight: float = 1.0

    def term(self, logits: tf.Tensor, batch: dict, model=None) -> tf.Tensor:
        stacked = tf.concat([logits[None], batch[LOGITS_KEY]], axis=0)  # [3, batch, classes]
        log_probs = tf.nn.log_softmax(stacked)
        probs = tf.exp(log_probs)
        log_mixture = tf.math.log(tf.clip_by_value(tf.reduce_mean(probs, axis=0), 1e-7, 1.0))
        return tf.reduce_mean(tf.reduce_sum(probs * (log_probs - log_mixture), axis=-1), axis=0)
