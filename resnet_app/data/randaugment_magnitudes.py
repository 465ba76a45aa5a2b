"""RandAugment's magnitude M: each op's argument at M, and timm's noisy magnitudes.

An op's argument is a function of level = M / 10 (the table in
`data/randaugment.py`). M is one number for every image, or, with timm's
magnitude noise ("mstd"), drawn per image and per op from N(M, std) and
clipped (`noisy_magnitudes`); the arguments are then tensors, one per image.
Either way they are computed as Python computes them on floats, so that a
per-image magnitude equal to M gives M's arguments bit for bit.
"""

from __future__ import annotations

import tensorflow as tf

# The top of the 0-10 scale: noisy magnitudes are clipped to it (or to M, above it).
MAGNITUDE_SCALE = 10.0


def op_arguments(magnitude) -> dict[str, tf.Tensor]:
    """Each op's argument at `magnitude`, before the random sign.

    Args:
      magnitude: M (a number), or float32 [batch] magnitudes, one per image.

    Returns:
      float32 "degrees", "shear" and "translate" (a fraction of the size);
      float64 "factor" (the enhance ops' distance from 1: `randaugment.apply_op`
      rounds 1 +- it to float32 once, as PIL's C blend takes a float); int32
      "threshold" and "bits"; each of `magnitude`'s shape.
    """
    # In float64, rounded to float32 at the end: Python's arithmetic on a
    # number M, then the rounding a Python float gets when it meets a float32
    # tensor (which is what these arguments were). A float32 magnitude equal
    # to M thus gives M's arguments. (tf.cast(6.3, tf.float64) would round 6.3
    # to float32 first, hence the constant.)
    if isinstance(magnitude, (tf.Tensor, tf.Variable)):
        level = tf.cast(magnitude, tf.float64) / 10
    else:
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


def noisy_magnitudes(seed: tf.Tensor, num_ops: int, magnitude: float, std: float) -> tf.Tensor:
    """float32 [num_ops]: one example's magnitude for each op, N(M, std) clipped (timm's mstd).

    timm draws `random.gauss(M, std)` per op applied and clips it to [0, 10]
    (to [0, mmax] with its "mmax", which lets M exceed 10). Here M above 10
    extrapolates, as with timm's mmax, so the clip is [0, max(10, M)].

    Args:
      seed: int64 [2], the example's seed for these draws
        (`randaugment.sub_seed(seed, randaugment.MAGNITUDE_STREAM)`).
      num_ops: the example's ops.
      magnitude: M, the mean.
      std: the standard deviation (> 0; timm's uniform draw for an infinite
        std is not implemented).
    """
    noise = tf.random.stateless_normal([num_ops], seed)
    top = max(MAGNITUDE_SCALE, magnitude)
    return tf.clip_by_value(magnitude + std * noise, 0.0, top)


def step_magnitudes(magnitude, step: int, positions: tf.Tensor | None = None):
    """The magnitudes of the ops applied at `step` (0 for each image's first op, ...).

    Args:
      magnitude: M (a number: returned as it is), or float32 [num_ops] (one
        image's) or [batch, num_ops] (a batch's) magnitudes.
      step: which op.
      positions: a batch's images to take (int32 [n]); None for one image.

    Returns:
      M, or float32 [1] (one image) or [n] (the images at `positions`).
    """
    if isinstance(magnitude, (int, float)):
        return magnitude
    magnitudes = tf.convert_to_tensor(magnitude, tf.float32)[..., step]
    return magnitudes[None] if positions is None else tf.gather(magnitudes, positions)
