"""The training augmentations, registered once (`AUGMENTATIONS`), and random erasing and Cutout.

Each is an `augment_ops.Augmentation`, its draws from a seed stream of its
own folded from the example's (so no other draw depends on it), carried with
the example under its name; `data/preprocessing.py` applies each one that is
on, in this order, at one site. A new augmentation is a class and its entry.

Random erasing (Zhong et al. 2020) picks, with probability p, a box of area
fraction in `erase_area_range` and log-uniform aspect in `erase_aspect_range`
in up to 10 attempts (timm's rule), and fills it after normalization with
N(0, 1) noise (timm's "pixel" mode). Cutout (DeVries & Taylor 2017) sets a
square wholly inside the image to 0, the mean colour.
"""

from __future__ import annotations

import math

import tensorflow as tf

from resnet_app.data import augmix, autoaugment, randaugment, trivialaugment
from resnet_app.data.augment_ops import Augmentation

ERASE_ATTEMPTS = 10
# Per example: whether to erase, the box's top and left, then per attempt its
# area and aspect ratio.
ERASE_DRAWS = 3 + 2 * ERASE_ATTEMPTS


def erase_boxes(draws: tf.Tensor, size: int, augment) -> tf.Tensor:
    """The box each example erases: int32 [batch, 4] (top, left, height, width), 0s for none.

    Of the `ERASE_ATTEMPTS` boxes `draws` (float32 [batch, ERASE_DRAWS]) give
    by the `data.augment` settings, the first that fits (at least a pixel,
    less than `size` a side) is placed uniformly; if none fits, none is erased.
    """
    height = width = size
    tries = tf.reshape(draws[:, 3:], [-1, ERASE_ATTEMPTS, 2])
    low, high = augment.erase_area_range
    area = height * width * (low + tries[..., 0] * (high - low))
    log_low, log_high = (math.log(bound) for bound in augment.erase_aspect_range)
    aspect = tf.exp(log_low + tries[..., 1] * (log_high - log_low))
    box_height = tf.cast(tf.round(tf.sqrt(area * aspect)), tf.int32)
    box_width = tf.cast(tf.round(tf.sqrt(area / aspect)), tf.int32)
    fits = (box_height >= 1) & (box_width >= 1) & (box_height < height) & (box_width < width)
    first = tf.argmax(tf.cast(fits, tf.int32), axis=1, output_type=tf.int32)
    box_height = tf.gather(box_height, first, batch_dims=1)
    box_width = tf.gather(box_width, first, batch_dims=1)
    # floor(u * (n + 1)) is uniform on 0..n; u < 1 keeps it <= n.
    top = tf.cast(draws[:, 1] * tf.cast(height - box_height + 1, tf.float32), tf.int32)
    left = tf.cast(draws[:, 2] * tf.cast(width - box_width + 1, tf.float32), tf.int32)
    box = tf.stack([top, left, box_height, box_width], axis=1)
    erase = (draws[:, 0] < augment.erase_probability) & tf.reduce_any(fits, axis=1)
    return tf.where(erase[:, None], box, tf.zeros_like(box))


def erase_batch(images: tf.Tensor, boxes: tf.Tensor, noise: tf.Tensor) -> tf.Tensor:
    """Each image's box (int32 [batch, 4], top, left, height, width) replaced by its noise."""
    top, left, height, width = tf.unstack(boxes, axis=1)
    rows = tf.range(tf.shape(images)[1])[None, :]
    columns = tf.range(tf.shape(images)[2])[None, :]
    in_rows = (rows >= top[:, None]) & (rows < (top + height)[:, None])
    in_columns = (columns >= left[:, None]) & (columns < (left + width)[:, None])
    inside = tf.cast(in_rows[:, :, None, None] & in_columns[:, None, :, None], tf.float32)
    # Exact, 0s and 1s: the noise inside, the image outside.
    return images * (1.0 - inside) + noise * inside


class RandomErasing(Augmentation):
    name, pixels, streams = "erase", False, (2,)

    def on(self, augment):
        return augment.erase_probability > 0

    def draw(self, seed, config):
        seed = self.seed(seed)
        draws = tf.random.stateless_uniform([ERASE_DRAWS], seed)
        # Only the draws and the noise per example: the boxes are computed on batches.
        shape = [config.image_size, config.image_size, config.channels]
        noise = tf.cond(
            draws[0] < config.augment.erase_probability,
            lambda: tf.random.stateless_normal(
                shape, tf.random.experimental.stateless_fold_in(seed, 1)
            ),
            lambda: tf.zeros(shape),
        )
        return {"draws": draws, "noise": noise}

    def apply(self, images, draws, config, fill):
        boxes = erase_boxes(draws["draws"], config.image_size, config.augment)
        return tf.cond(  # Most images are not erased.
            tf.reduce_any(boxes[:, 2] > 0),
            lambda: erase_batch(images, boxes, draws["noise"]),
            lambda: images,
        )


class Cutout(Augmentation):
    name, pixels, streams = "cutout", False, (5,)

    def on(self, augment):
        return augment.cutout_size > 0

    def draw(self, seed, config):
        positions = max(1, config.image_size - config.augment.cutout_size + 1)  # Wholly inside.
        return {"corner": tf.random.stateless_uniform([2], self.seed(seed), 0, positions, tf.int32)}

    def apply(self, images, draws, config, fill):
        corners = draws["corner"]
        side = tf.fill(tf.shape(corners[:, :1]), min(config.augment.cutout_size, config.image_size))
        boxes = tf.concat([corners, side, side], axis=1)
        return erase_batch(images, boxes, tf.zeros_like(images))


# In the order they apply: the op policies (at most one is on), then those after normalization.
AUGMENTATIONS: dict[str, Augmentation] = {
    augmentation.name: augmentation
    for augmentation in (
        trivialaugment.TA_WIDE,
        *autoaugment.POLICY_AUGMENTATIONS,
        augmix.AugMix(),
        randaugment.RandAugment(),
        Cutout(),
        RandomErasing(),
    )
}


def active(augment) -> list[Augmentation]:
    """The augmentations the `data.augment` settings turn on, in order."""
    return [augmentation for augmentation in AUGMENTATIONS.values() if augmentation.on(augment)]


def draws(seed: tf.Tensor, config) -> dict[str, dict[str, tf.Tensor]]:
    """One example's draws for each augmentation that is on, by its name."""
    return {a.name: a.draw(seed, config) for a in active(config.augment)}
