"""Mixup and CutMix of a training batch, drawn statelessly from the batch's seed.

Mixup (Zhang et al. 2018) blends each image with its partner, `lam * x_i +
(1 - lam) * x_partner`; CutMix (Yun et al. 2019) pastes a box of the partner
into it, `lam` the share left. Example i's partner is B - 1 - i of the same
global batch (timm's), mixed on the host before the batch is split, so any
number of towers mixes alike. `lam` ~ Beta(alpha, alpha); with both alphas
set, CutMix is chosen with probability `switch_prob`; one draw per batch
("batch" mode) or per example ("example"), from the batch's seed (run seed and
batch number), so a resumed run mixes as the uninterrupted one.

The batch keeps "label" as the dominant label (the larger share) and gains
"mix_label" (the other) and "mix_weight" (the dominant share, >= 0.5); the
loss's target is `mix_weight * onehot(label) + (1 - mix_weight) *
onehot(mix_label)` (multi-hot rows mix alike).
"""

from __future__ import annotations

import tensorflow as tf

from resnet_app.data import options, seeds
from resnet_app.data.settings import MixSettings


def _beta(seed: tf.Tensor, alpha: float, count: int) -> tf.Tensor:
    """`count` draws of Beta(alpha, alpha), as X / (X + Y) of two Gamma(alpha) draws."""
    if alpha <= 0:
        return tf.ones([count])
    gammas = tf.random.stateless_gamma([2, count], seed, alpha=alpha)
    return gammas[0] / (gammas[0] + gammas[1])


def draws(seed: tf.Tensor, settings: MixSettings, batch_size: int) -> dict[str, tf.Tensor]:
    """One batch's draws: "cutmix" bool [B], "lam" float32 [B] (the drawn share) and
    "centre" float32 [B, 2] (the box centre as fractions of height and width)."""
    count = batch_size if settings.mode == "example" else 1
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 4)
    if settings.mixup_alpha > 0 and settings.cutmix_alpha > 0:
        cutmix = tf.random.stateless_uniform([count], seeds[0]) < settings.switch_prob
    else:
        cutmix = tf.fill([count], settings.cutmix_alpha > 0)
    lam = tf.where(
        cutmix,
        _beta(seeds[1], settings.cutmix_alpha, count),
        _beta(seeds[2], settings.mixup_alpha, count),
    )
    centre = tf.random.stateless_uniform([count, 2], seeds[3])
    drawn = {"cutmix": cutmix, "lam": lam, "centre": centre}
    return {key: tf.repeat(value, batch_size // count, axis=0) for key, value in drawn.items()}


def mix_with(batch: dict, choices: dict) -> dict:
    """The batch mixed with its reversed self by given draws (see `draws`)."""
    images, labels = batch["image"], batch["label"]
    partner_images, partner_labels = tf.reverse(images, [0]), tf.reverse(labels, [0])
    height, width = images.shape[1], images.shape[2]
    lam = choices["lam"]
    # CutMix's box (top, bottom, left, right) of area about 1 - lam, clipped.
    ratio = tf.sqrt(1.0 - lam)
    size = tf.stack([ratio * height, ratio * width], axis=1)
    middle = choices["centre"] * tf.constant([height, width], tf.float32)
    low = tf.clip_by_value(tf.cast(tf.round(middle - size / 2), tf.int32), 0, [height, width])
    high = tf.clip_by_value(tf.cast(tf.round(middle + size / 2), tf.int32), 0, [height, width])
    box = tf.stack([low[:, 0], high[:, 0], low[:, 1], high[:, 1]], axis=1)
    rows = tf.reshape(tf.range(height), [1, height, 1])
    cols = tf.reshape(tf.range(width), [1, 1, width])
    top, bottom, left, right = (tf.reshape(box[:, k], [-1, 1, 1]) for k in range(4))
    inside = (rows >= top) & (rows < bottom) & (cols >= left) & (cols < right)
    area = tf.cast(box[:, 1] - box[:, 0], tf.float32) * tf.cast(box[:, 3] - box[:, 2], tf.float32)
    cut_share = 1.0 - area / float(height * width)  # The share actually left after pasting.
    cutmix = choices["cutmix"]
    pasted = tf.where(inside[..., None], partner_images, images)
    weight = tf.cast(tf.reshape(lam, [-1, 1, 1, 1]), images.dtype)
    blended = weight * images + (1 - weight) * partner_images
    mixed = tf.where(tf.reshape(cutmix, [-1, 1, 1, 1]), pasted, blended)
    share = tf.where(cutmix, cut_share, lam)
    own_dominant = share >= 0.5
    # Multi-label rows [B, classes] are swapped whole.
    dominant = tf.reshape(own_dominant, [-1] + [1] * (labels.shape.rank - 1))
    return {
        **batch,
        "image": mixed,
        "label": tf.where(dominant, labels, partner_labels),
        "mix_label": tf.where(dominant, partner_labels, labels),
        "mix_weight": tf.where(own_dominant, share, 1.0 - share),
    }


def mix_stream(stream, settings: MixSettings, seed: int, first_batch: int):
    """The batched training stream with each batch mixed, if `settings` are on, by its
    number since epoch 0 (`first_batch` the stream's first): entered anywhere alike."""
    if not settings.enabled:
        return stream
    key = seeds.stream_seed(seed, seeds.MIX, 0)

    def mix_numbered(number, batch):
        size = batch["image"].shape[0]
        if size is None:
            raise ValueError("mixing needs batches of a static size (drop_remainder=True)")
        seed = tf.random.experimental.stateless_fold_in(key, number)
        return mix_with(batch, draws(seed, settings, size))

    return stream.enumerate(start=first_batch).map(
        mix_numbered, num_parallel_calls=options.parallel_calls()
    )
