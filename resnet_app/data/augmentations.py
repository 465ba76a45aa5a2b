"""The training augmentations, registered once (`AUGMENTATIONS`), and random erasing and Cutout.

Each is an `augment_ops.Augmentation`: whether the `data.augment` settings
turn it on, one example's draws from a seed stream of its own folded from the
example's seed (so the crop and flip draws, and every other augmentation's,
do not depend on it), and its transform of a batch by those draws. The
draws travel with the example through the pipeline, under the
augmentation's name; `data/preprocessing.py` applies every one that is on,
in the order here, at one site. A new augmentation is a class and its entry
below.

Random erasing (Zhong et al. 2020) picks, with probability p, a box of area
fraction in `erase_area_range` and aspect ratio (height / width, log-uniform)
in `erase_aspect_range`, in up to 10 attempts (an attempt whose box does not
fit is redrawn; timm's rule), and replaces it, after normalization, with
per-pixel N(0, 1) noise (timm's "pixel" mode; zeros would be the mean colour).
Cutout (DeVries & Taylor 2017, as Page 2018's ResNet-9 uses it) sets a square
wholly inside the image to 0, the mean colour.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tensorflow as tf

from resnet_app.data import augmix, autoaugment, randaugment, trivialaugment
from resnet_app.data.augment_ops import Augmentation, sub_seed

ERASE_ATTEMPTS = 10
# Per example: whether to erase, the box's top and left, then per attempt its
# area and aspect ratio.
ERASE_DRAWS = 3 + 2 * ERASE_ATTEMPTS


def erase_boxes(
    draws: tf.Tensor,
    height: int,
    width: int,
    probability: float,
    area_range: Sequence[float],
    aspect_range: Sequence[float],
) -> tf.Tensor:
    """The box each example erases: int32 [batch, 4] (top, left, height, width), 0s for none.

    Of the `ERASE_ATTEMPTS` boxes `draws` (float32 [batch, ERASE_DRAWS]) give,
    the first that fits (at least a pixel; height < `height`, width < `width`)
    is placed uniformly; if none fits, nothing is erased.
    """
    tries = tf.reshape(draws[:, 3:], [-1, ERASE_ATTEMPTS, 2])
    low, high = area_range
    area = height * width * (low + tries[..., 0] * (high - low))
    log_low, log_high = math.log(aspect_range[0]), math.log(aspect_range[1])
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
    erase = (draws[:, 0] < probability) & tf.reduce_any(fits, axis=1)
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
    name, pixels = "erase", False
    STREAM = (1 << 40) + 2

    def on(self, augment):
        return augment.erase_probability > 0

    def draw(self, seed, config):
        seed = sub_seed(seed, self.STREAM)
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

    def boxes(self, draws: tf.Tensor, config) -> tf.Tensor:
        augment, size = config.augment, config.image_size
        return erase_boxes(
            draws,
            size,
            size,
            augment.erase_probability,
            augment.erase_area_range,
            augment.erase_aspect_range,
        )

    def apply(self, images, draws, config, fill):
        boxes = self.boxes(draws["draws"], config)
        return tf.cond(  # Most images are not erased.
            tf.reduce_any(boxes[:, 2] > 0),
            lambda: erase_batch(images, boxes, draws["noise"]),
            lambda: images,
        )


class Cutout(Augmentation):
    name, pixels = "cutout", False
    STREAM = (1 << 40) + 5

    def on(self, augment):
        return augment.cutout_size > 0

    def draw(self, seed, config):
        # Wholly inside the image: top and left in [0, size - side].
        positions = max(1, config.image_size - config.augment.cutout_size + 1)
        corner = tf.random.stateless_uniform(
            [2], sub_seed(seed, self.STREAM), 0, positions, tf.int32
        )
        return {"corner": corner}

    def apply(self, images, draws, config, fill):
        corners = draws["corner"]
        side = min(config.augment.cutout_size, config.image_size)
        side = tf.fill(tf.shape(corners[:, :1]), side)
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


def draws_per_example(config) -> bool:
    """Whether an example draws anything beyond its crop and flip."""
    return bool(active(config.augment))


def draws(seed: tf.Tensor, config) -> dict[str, dict[str, tf.Tensor]]:
    """One example's draws for each augmentation that is on, by its name."""
    return {a.name: a.draw(seed, config) for a in active(config.augment)}
