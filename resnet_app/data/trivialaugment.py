"""TrivialAugment-wide (Müller & Hutter 2021), as torchvision's `TrivialAugmentWide`.

Each training image gets one op, drawn uniformly from RandAugment's 14
(`data/randaugment.py`: the same op set and the same PIL arithmetic), at one
of 31 magnitude bins drawn uniformly, with a random sign for the signed ops.
The bins are torchvision's "wide" ranges (its `_augmentation_space`, 31 bins):

  ShearX, ShearY             0 to 0.99 (the shear factor), signed
  TranslateX, TranslateY     0 to 32 pixels, truncated to whole pixels, signed
  Rotate                     0 to 135 degrees, signed
  Brightness, Color,         a factor 1 + m, m from 0 to 0.99, signed
  Contrast, Sharpness        (no floor at 0.1, unlike timm's RandAugment)
  Posterize                  8 - round(bin / 5) bits: 8 down to 2
  Solarize                   threshold 255 down to 0 (values >= it invert)
  Identity, AutoContrast, Equalize  no magnitude

Every range is torch.linspace's float32 values, computed as torch computes
them, so an op's argument is torchvision's bit for bit. Geometric ops sample
the nearest pixel (torchvision's default for its policies) and fill with the
dataset's mean colour, as RandAugment here does (torchvision fills with 0
unless given a fill). The draws are stateless ops of the example's seed
(`TRIVIAL_STREAM`), so a resumed run redraws what the interrupted one drew.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from resnet_app.data import randaugment

NUM_BINS = 31


def torch_linspace(start: float, end: float, steps: int) -> np.ndarray:
    """float32 `torch.linspace(start, end, steps)` as torch's CPU kernel computes it:
    start + i * step for the first half, end - (steps - 1 - i) * step for the rest,
    each a fused multiply-add (one rounding; measured against torch 2.14: 32 - 15 *
    (32 / 30) is 15.999999, not the 16.0 two roundings give)."""
    start32, end32 = np.float32(start), np.float32(end)
    step = np.float64((end32 - start32) / np.float32(steps - 1))
    index = np.arange(steps)
    # A float32 times a small integer is exact in float64: one rounding, as an FMA.
    first = np.float64(start32) + step * index
    last = np.float64(end32) - step * (steps - 1 - index)
    return np.where(index < steps // 2, first, last).astype(np.float32)


def _tables() -> dict[str, np.ndarray]:
    """Each op's argument per bin, as `randaugment_magnitudes.op_arguments` names them."""
    translate = torch_linspace(0.0, 32.0, NUM_BINS)
    solarize = torch_linspace(255.0, 0.0, NUM_BINS)
    # torch rounds half to even; bin / 5 is never a half.
    bits = 8 - np.round(np.arange(NUM_BINS, dtype=np.float32) / np.float32(5.0)).astype(np.int32)
    return {
        "degrees": torch_linspace(0.0, 135.0, NUM_BINS),
        "shear": torch_linspace(0.0, 0.99, NUM_BINS),
        # Python's int() of the float: toward zero, before the sign (which is symmetric).
        "translate": np.trunc(translate).astype(np.float32),
        # The float32 value as a Python float meets 1.0 (in double), as torchvision's.
        "factor": torch_linspace(0.0, 0.99, NUM_BINS).astype(np.float64),
        "bits": bits,
        # PIL inverts values >= the float threshold: >= its ceiling, in integers.
        "threshold": np.ceil(solarize).astype(np.int32),
    }


TABLES = _tables()


def wide_arguments(bins) -> dict[str, tf.Tensor]:
    """Each op's argument at magnitude bin `bins` (a number, or float32 [batch])."""
    index = tf.cast(tf.convert_to_tensor(bins), tf.int32)
    return {name: tf.gather(tf.constant(table), index) for name, table in TABLES.items()}


def wide_translation(bins, size) -> tf.Tensor:
    """TranslateX's and -Y's shift in pixels at `bins`: 0 to 32 whatever the size."""
    del size
    return wide_arguments(bins)["translate"]


WIDE_RANGES = randaugment.OpRanges(
    wide_arguments, min_factor=None, translate_pixels=wide_translation, interpolation="NEAREST"
)


def choose(seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """One example's op: int32 [1] index into `randaugment.OPS`, float32 [1] sign and
    float32 [1] magnitude bin (0 to 30), from the example's seed."""
    draws = tf.random.stateless_uniform([3], randaugment.sub_seed(seed, randaugment.TRIVIAL_STREAM))
    index = tf.cast(tf.floor(draws[0] * len(randaugment.OPS)), tf.int32)
    sign = tf.where(draws[1] < 0.5, -1.0, 1.0)
    bin_ = tf.floor(draws[2] * NUM_BINS)
    return index[None], sign[None], bin_[None]
