"""RandAugment (Cubuk et al. 2020), with timm's per-op probability and magnitude noise.

Each training image gets `randaugment_ops` ops, each drawn uniformly (with
replacement) from the paper's 14 (`data/augment_ops.py`), each at the one
magnitude M (0-10, the TF / timm scale; up to 30 extrapolates). Each op with a
magnitude grows more severe with it and is the identity at M = 0 (timm's
"increasing" ops, used by DeiT and "ResNet strikes back"); level = M / 10:

  Identity, AutoContrast, Equalize  no magnitude (PIL's autocontrast, equalize)
  Rotate            +-30 * level degrees about the centre
  Solarize          invert values >= max(0, 256 - int(256 * level))
  Color, Contrast,  blend with PIL's degenerate image by the factor
  Brightness,       max(0.1, 1 +- 0.9 * level)
  Sharpness
  Posterize         keep max(1, 8 - int(4 * level)) bits
  ShearX, ShearY    +-0.3 * level, about the top-left corner (as timm)
  TranslateX, -Y    +-0.45 * level of the width or height (timm's relative form)

where +- is a random sign per op. timm's variations are options, drawn from
streams of their own (the ops and signs stay): each op applies with a
probability p (`randaugment_prob`), and its magnitude is drawn from N(M, std)
(`randaugment_magnitude_std`). Geometric ops sample bilinearly and fill with
the mean colour (timm's, which fills with the mean it normalizes by).
"""

from __future__ import annotations

import tensorflow as tf

from resnet_app.data import augment_ops

OPS = (
    *("Identity", "AutoContrast", "Equalize", "Rotate", "Solarize", "Color", "Posterize"),
    *("Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateX", "TranslateY"),
)
MAGNITUDE_SCALE = 10.0  # The scale's top: noisy magnitudes are clipped to it (or to M).


def op_arguments(magnitude) -> dict[str, tf.Tensor]:
    """Each op's argument at M (a number, or float32 [batch]), before the sign: Python's
    float64 arithmetic, rounded to float32 at the end, so a float32 M gives M's
    arguments bit for bit ("factor" stays float64: `Enhance` rounds 1 +- it once)."""
    if isinstance(magnitude, (tf.Tensor, tf.Variable)):
        level = tf.cast(magnitude, tf.float64) / 10
    else:  # tf.cast(6.3, tf.float64) would round 6.3 to float32 first.
        level = tf.constant(magnitude, tf.float64) / 10

    def truncated(value: tf.Tensor) -> tf.Tensor:  # Python's int(value), for value >= 0.
        return tf.cast(tf.floor(value), tf.int32)

    return {
        "degrees": tf.cast(30 * level, tf.float32),
        "threshold": tf.maximum(0, 256 - truncated(256 * level)),
        "factor": 0.9 * level,
        "bits": tf.maximum(1, 8 - truncated(4 * level)),
        "shear": tf.cast(0.3 * level, tf.float32),
        "translate": tf.cast(0.45 * level, tf.float32),
    }


RANGES = augment_ops.OpRanges(OPS, op_arguments)


def choose_ops(seed: tf.Tensor, num_ops: int) -> tuple[tf.Tensor, tf.Tensor]:
    """int32 [num_ops] indices into `OPS` and float32 [num_ops] signs, from the
    example's RandAugment seed (its first stream's)."""
    draws = tf.random.stateless_uniform([2, num_ops], seed)
    indices = tf.cast(tf.floor(draws[0] * len(OPS)), tf.int32)
    return indices, augment_ops.signs_of(draws[1])


def noisy_magnitudes(seed: tf.Tensor, num_ops: int, magnitude: float, std: float) -> tf.Tensor:
    """float32 [num_ops]: N(M, std) clipped to [0, max(10, M)], from the example's
    seed of the magnitudes' stream (timm clips to [0, 10], or [0, mmax])."""
    noise = tf.random.stateless_normal([num_ops], seed)
    top = max(MAGNITUDE_SCALE, magnitude)
    return tf.clip_by_value(magnitude + std * noise, 0.0, top)


class RandAugment(augment_ops.OpPolicy):
    name, ranges = "randaugment", RANGES
    streams = (1, 3, 4)  # The ops and signs; which ops apply; the magnitudes.

    def on(self, augment):
        return augment.randaugment_ops > 0

    def draw(self, seed, config):
        augment, count = config.augment, config.augment.randaugment_ops
        indices, signs = choose_ops(self.seed(seed), count)
        if augment.randaugment_prob < 1:
            # timm applies an op when random() <= p, random() in [0, 1): the same chance.
            keep = self.uniform(seed, [count], stream=1)
            identity = tf.constant(OPS.index("Identity"), indices.dtype)
            indices = tf.where(keep < augment.randaugment_prob, indices, identity)
        draws = {"op_indices": indices, "op_signs": signs}
        if augment.randaugment_magnitude_std > 0:
            magnitude, std = augment.randaugment_magnitude, augment.randaugment_magnitude_std
            draws["op_magnitudes"] = noisy_magnitudes(self.seed(seed, 2), count, magnitude, std)
        return draws

    def magnitude(self, draws, config):
        return draws.get("op_magnitudes", config.augment.randaugment_magnitude)
