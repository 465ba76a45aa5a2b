"""TrivialAugment-wide (Müller & Hutter 2021), as torchvision's `TrivialAugmentWide`.

Each training image gets one op, drawn uniformly from RandAugment's 14 (the
same PIL arithmetic), at one of 31 magnitude bins drawn uniformly, with a
random sign for the signed ops. The bins are torchvision's "wide" ranges:

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
the nearest pixel (torchvision's default) and fill with the dataset's mean
colour (torchvision fills with 0 unless given a fill).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from resnet_app.data import augment_ops, randaugment

NUM_BINS = 31


def torch_linspace(start: float, end: float, steps: int) -> np.ndarray:
    """float32 `torch.linspace(start, end, steps)` as torch's CPU kernel computes it:
    start + i * step for the first half, end - (steps - 1 - i) * step for the rest,
    each a fused multiply-add (one rounding: 32 - 15 * (32 / 30) is 15.999999)."""
    start32, end32 = np.float32(start), np.float32(end)
    step = np.float64((end32 - start32) / np.float32(steps - 1))
    index = np.arange(steps)
    # A float32 times a small integer is exact in float64: one rounding, as an FMA.
    first = np.float64(start32) + step * index
    last = np.float64(end32) - step * (steps - 1 - index)
    return np.where(index < steps // 2, first, last).astype(np.float32)


TABLES = {
    "degrees": torch_linspace(0.0, 135.0, NUM_BINS),
    "shear": torch_linspace(0.0, 0.99, NUM_BINS),
    # Python's int() of the float: toward zero, before the sign (which is symmetric).
    "translate": np.trunc(torch_linspace(0.0, 32.0, NUM_BINS)).astype(np.float32),
    # The float32 value as a Python float meets 1.0 (in double), as torchvision's.
    "factor": torch_linspace(0.0, 0.99, NUM_BINS).astype(np.float64),
    # torch rounds half to even; bin / 5 is never a half.
    "bits": 8 - np.round(np.arange(NUM_BINS, dtype=np.float32) / np.float32(5.0)).astype(np.int32),
    # PIL inverts values >= the float threshold: >= its ceiling, in integers.
    "threshold": np.ceil(torch_linspace(255.0, 0.0, NUM_BINS)).astype(np.int32),
}
_arguments = augment_ops.binned(TABLES)
WIDE_RANGES = augment_ops.OpRanges(  # Translations: 0 to 32 pixels at any size.
    randaugment.OPS, _arguments, None, lambda bins, size: _arguments(bins)["translate"], "NEAREST"
)


class TrivialAugment(augment_ops.OpPolicy):
    """One op per image, drawn uniformly from `ranges.ops`, at a uniform bin of `bins`."""

    streams = (6,)  # The op, sign and bin.

    def __init__(self, name: str, ranges: augment_ops.OpRanges, bins: int):
        self.name, self.ranges, self.bins = name, ranges, bins

    def draw(self, seed, config):
        draws = self.uniform(seed, [3, 1])  # The op, its sign and its bin.
        indices = tf.cast(tf.floor(draws[0] * len(self.ranges.ops)), tf.int32)
        return self.op_draws(indices, draws[1], tf.floor(draws[2] * self.bins))


TA_WIDE = TrivialAugment("ta_wide", WIDE_RANGES, NUM_BINS)
