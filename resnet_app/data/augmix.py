"""AugMix (Hendrycks et al. 2020), with torchvision's parameters.

An image's AugMix is a convex mix of the image and `width` chains of ops:

  mixed = m0 * image + sum_i w_i * chain_i(image),   (m0, m1) ~ Dirichlet(alpha, alpha),
                                                     w ~ m1 * Dirichlet(alpha, ..., alpha)

Each chain applies `depth` ops (-1: 1 to 3, drawn), each drawn uniformly, at
a bin drawn from the first `severity` of 10, with a random sign; the sum is
float32 in that order, truncated, as torchvision's `AugMix` on uint8 images.
The ops and tables are its `_augmentation_space(10, size)` (`all_ops` adds the
four enhance ops the paper leaves out):

  ShearX, ShearY          0 to 0.3, signed
  TranslateX, -Y          0 to a third of the width (height), whole pixels, signed
  Rotate                  0 to 30 degrees, signed
  Posterize               4 - round(bin / 2.25) bits: 4 down to 0
  Solarize                threshold 255 down to 0
  AutoContrast, Equalize  no magnitude
  Brightness, Color,      a factor 1 + m, m from 0 to 0.9, signed (all_ops)
  Contrast, Sharpness

The ops are PIL's arithmetic, as the paper's code (torchvision's tensor ops
round otherwise, by at most a level: docs/training.md), sampling bilinearly.
With the consistency loss (`augmix_jsd`) an example has `VIEWS` views, itself
and two AugMix drawn apart: "image" and "augmix_views" in the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from resnet_app.data import augment_ops, autoaugment
from resnet_app.data.settings import AUGMIX_VIEWS

NUM_BINS = autoaugment.NUM_BINS  # torchvision's _PARAMETER_MAX: 10 bins, as AutoAugment's.
MAX_DEPTH = 3  # A drawn depth is 1 to 3 (torchvision's randint(1, 4)).
ENHANCE_OPS = ("Brightness", "Color", "Contrast", "Sharpness")
# Identity first: it pads the chains shorter than the longest; it is never drawn.
OPS = (
    "Identity",
    *("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Posterize", "Solarize"),
    *("AutoContrast", "Equalize", *ENHANCE_OPS),
)
VIEWS = AUGMIX_VIEWS  # With the consistency loss: the image and two AugMix of it.
FEATURES = ("augmix_ops", "augmix_signs", "augmix_bins", "augmix_weights")  # Each [views, ...].

# AutoAugment's tables but Posterize's, which keeps 4 bits down to 0.
TABLES = {
    **autoaugment.TABLES,
    "bits": 4 - np.round(np.arange(NUM_BINS, dtype=np.float32) / np.float32(2.25)).astype(np.int32),
}


def translation(bins, size) -> tf.Tensor:
    """Whole pixels at `bins` of torch.linspace(0, size / 3, 10)."""
    return autoaugment.linspace_pixels(bins, tf.cast(size, tf.float64) / 3.0)


RANGES = augment_ops.OpRanges(OPS, augment_ops.binned(TABLES), None, translation, "BILINEAR")


def op_count(all_ops: bool) -> int:
    """How many ops a chain draws from (Identity is not one of them)."""
    return len(OPS) - 1 - (0 if all_ops else len(ENHANCE_OPS))


def _dirichlet(seed: tf.Tensor, alpha: float, count: int) -> tf.Tensor:
    """float32 [count] from Dirichlet(alpha, ..., alpha): normalized Gamma(alpha) draws."""
    gammas = tf.random.stateless_gamma([count], seed, alpha=alpha)
    return gammas / tf.reduce_sum(gammas)


def _choose_view(seed: tf.Tensor, settings) -> dict[str, tf.Tensor]:
    """One view's chains and weights, from its seed (see `choose`)."""
    width = settings.augmix_width
    length = MAX_DEPTH if settings.augmix_depth < 0 else settings.augmix_depth
    draws_seed, beta_seed, weights_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 3)
    )
    draws = tf.random.stateless_uniform([4, width, length], draws_seed)
    ops = 1 + tf.cast(tf.floor(draws[0] * op_count(settings.augmix_all_ops)), tf.int32)
    if settings.augmix_depth < 0:
        depths = 1 + tf.cast(tf.floor(draws[3, :, :1] * MAX_DEPTH), tf.int32)  # [width, 1]
        ops = tf.where(tf.range(length) < depths, ops, OPS.index("Identity"))
    beta = _dirichlet(beta_seed, settings.augmix_alpha, 2)
    weights = _dirichlet(weights_seed, settings.augmix_alpha, width) * beta[1]
    return {
        "augmix_ops": ops,
        "augmix_signs": augment_ops.signs_of(draws[1]),
        "augmix_bins": tf.floor(draws[2] * settings.augmix_severity),
        "augmix_weights": tf.concat([beta[:1], weights], axis=0),
    }


def choose(seed: tf.Tensor, settings, views: int) -> dict[str, tf.Tensor]:
    """One example's draws for `views` AugMix views (1, or 2 with the consistency loss):
    "augmix_ops" int32 [views, width, length] (into `OPS`; the Identity past a
    chain's depth), "augmix_signs" and "augmix_bins" float32 alike, and
    "augmix_weights" float32 [views, width + 1] (the image's m0, then each chain's)."""
    base = augment_ops.sub_seed(seed, AugMix.streams[0])  # Then the view's number.
    per_view = [
        _choose_view(tf.random.experimental.stateless_fold_in(base, view), settings)
        for view in range(views)
    ]
    return {key: tf.stack([view[key] for view in per_view]) for key in FEATURES}


def mix(images: tf.Tensor, ops, signs, bins, weights, fill: Sequence[int]) -> tf.Tensor:
    """One AugMix of each image (uint8 [batch, H, W, 3]) by one view's draws (ops, signs,
    bins [batch, width, length], weights [batch, width + 1]): every chain of every
    image in one `apply_ops` (a graph of one chain's size); the sum truncated."""
    width, length = ops.shape[1], ops.shape[2]
    chains = augment_ops.apply_ops(
        tf.repeat(images, width, axis=0),  # Each image's copies side by side.
        *(tf.reshape(draws, [-1, length]) for draws in (ops, signs, bins)),
        fill,
        RANGES,
    )
    chains = tf.reshape(chains, tf.concat([[-1, width], tf.shape(images)[1:]], axis=0))
    weights = tf.cast(weights, tf.float32)[:, :, None, None, None]
    mixed = weights[:, 0] * tf.cast(images, tf.float32)
    for chain in range(width):  # torchvision's order of the float32 sum.
        mixed += weights[:, chain + 1] * tf.cast(chains[:, chain], tf.float32)
    return tf.cast(tf.clip_by_value(mixed, 0.0, 255.0), tf.uint8)


class AugMix(augment_ops.Augmentation):
    """Each image's AugMix; with the consistency loss its two, [batch, VIEWS - 1, H, W, 3]."""

    name, streams = "augmix", (8,)

    def draw(self, seed, config):
        return choose(seed, config.augment, max(1, config.augment.views - 1))

    def apply(self, images, draws, config, fill):
        count = draws["augmix_ops"].shape[1]
        # The views as one batch: each image repeated, each view's draws in its row.
        flat = [tf.reshape(draws[key], [-1, *draws[key].shape[2:]]) for key in FEATURES]
        mixed = mix(tf.repeat(images, count, axis=0), *flat, fill)
        if count == 1:
            return mixed
        return tf.reshape(mixed, tf.concat([[-1, count], tf.shape(images)[1:]], axis=0))
