"""AutoAugment's learned policies (Cubuk et al. 2019), as torchvision's `AutoAugment`.

A policy is 25 sub-policies of two ops, each op with the probability it
applies and its magnitude, one of 10 bins. Each training image gets one
sub-policy, drawn uniformly; each of its two ops applies with its
probability, with a random sign for the signed ops. The ImageNet, CIFAR-10
and SVHN policies are the paper's, as torchvision lists them. The ops are
RandAugment's and Invert; their ranges are torchvision's
(`_augmentation_space(10, ...)`), torch's float32 linspace values:

  ShearX, ShearY          0 to 0.3, signed
  TranslateX, -Y          0 to 150/331 of the width (height), whole pixels, signed
  Rotate                  0 to 30 degrees, signed
  Brightness, Color,      a factor 1 + m, m from 0 to 0.9, signed
  Contrast, Sharpness
  Posterize               8 - round(bin / 2.25) bits: 8 down to 4
  Solarize                threshold 255 down to 0
  AutoContrast, Equalize, Invert  no magnitude

Geometric ops sample the nearest pixel (torchvision's default) and fill with
the dataset's mean colour.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from resnet_app.data import augment_ops, randaugment
from resnet_app.data.trivialaugment import torch_linspace

NUM_BINS = 10
OPS = (*randaugment.OPS, "Invert")

# (op, probability, magnitude bin or None), two per sub-policy.
POLICIES = {
    "imagenet": (
        (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
        (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
        (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
        (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
        (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
        (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
        (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
        (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
        (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
        (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
        (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
        (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
        (("Color", 0.4, 0), ("Equalize", 0.6, None)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    ),
    "cifar10": (
        (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
        (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
        (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
        (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
        (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
        (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
        (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
        (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
        (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
        (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
        (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
        (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
        (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
        (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
        (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
        (("Color", 0.9, 9), ("Equalize", 0.6, None)),
        (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
        (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
        (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
        (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
        (("Equalize", 0.8, None), ("Invert", 0.1, None)),
        (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
    ),
    "svhn": (
        (("ShearX", 0.9, 4), ("Invert", 0.2, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.6, None), ("Solarize", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("AutoContrast", 0.8, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.4, None)),
        (("ShearY", 0.9, 5), ("Solarize", 0.2, 6)),
        (("Invert", 0.9, None), ("AutoContrast", 0.8, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("Solarize", 0.3, 3)),
        (("ShearY", 0.8, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.9, None), ("TranslateY", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Contrast", 0.3, 3), ("Rotate", 0.8, 4)),
        (("Invert", 0.8, None), ("TranslateY", 0.0, 2)),
        (("ShearY", 0.7, 6), ("Solarize", 0.4, 8)),
        (("Invert", 0.6, None), ("Rotate", 0.8, 4)),
        (("ShearY", 0.3, 7), ("TranslateX", 0.9, 3)),
        (("ShearX", 0.1, 6), ("Invert", 0.6, None)),
        (("Solarize", 0.7, 2), ("TranslateY", 0.6, 7)),
        (("ShearY", 0.8, 4), ("Invert", 0.8, None)),
        (("ShearX", 0.7, 9), ("TranslateY", 0.8, 3)),
        (("ShearY", 0.8, 5), ("AutoContrast", 0.7, None)),
        (("ShearX", 0.7, 2), ("Invert", 0.1, None)),
    ),
}

TABLES = {
    "degrees": torch_linspace(0.0, 30.0, NUM_BINS),
    "shear": torch_linspace(0.0, 0.3, NUM_BINS),
    "factor": torch_linspace(0.0, 0.9, NUM_BINS).astype(np.float64),
    # torch rounds half to even; bin / 2.25 is never a half.
    "bits": 8 - np.round(np.arange(NUM_BINS, dtype=np.float32) / np.float32(2.25)).astype(np.int32),
    "threshold": np.ceil(torch_linspace(255.0, 0.0, NUM_BINS)).astype(np.int32),
}


def linspace_pixels(bins, end: tf.Tensor) -> tf.Tensor:
    """Whole pixels at `bins` of torch.linspace(0, end, 10) (`end` float64), float32:
    the end rounded to float32, the step a ninth of it in float32, each value one
    fused multiply-add (torch's arithmetic), then Python's int()."""
    end = tf.cast(tf.cast(end, tf.float32), tf.float64)
    step = tf.cast(tf.cast(end, tf.float32) / float(NUM_BINS - 1), tf.float64)
    index = tf.cast(tf.convert_to_tensor(bins), tf.float64)
    value = tf.where(index < NUM_BINS // 2, index * step, end - (NUM_BINS - 1 - index) * step)
    return tf.floor(tf.cast(value, tf.float32))  # >= 0: int() is the floor.


def translation(bins, size) -> tf.Tensor:
    """Whole pixels at `bins` of torch.linspace(0, 150 / 331 * size, 10) (its ImageNet rule)."""
    return linspace_pixels(bins, 150.0 / 331.0 * tf.cast(size, tf.float64))


RANGES = augment_ops.OpRanges(
    OPS, augment_ops.binned(TABLES), None, translation, interpolation="NEAREST"
)


class AutoAugment(augment_ops.OpPolicy):
    """One of `policy`'s sub-policies per image; each of its ops applies with its chance."""

    ranges, streams = RANGES, (7,)  # Its stream: the sub-policy, the chances and the signs.

    def __init__(self, name: str):
        self.name = name

    def draw(self, seed, config):
        table = POLICIES[self.name]
        ops = tf.constant([[OPS.index(name) for name, _, _ in pair] for pair in table], tf.int32)
        chances = tf.constant([[p for _, p, _ in pair] for pair in table], tf.float32)
        bins = tf.constant([[float(b or 0) for _, _, b in pair] for pair in table])
        draws = self.uniform(seed, [5])
        chosen = tf.cast(tf.floor(draws[0] * len(table)), tf.int32)
        applies = draws[1:3] <= chances[chosen]  # torchvision: probs[i] <= p.
        indices = tf.where(applies, ops[chosen], OPS.index("Identity"))
        return self.op_draws(indices, draws[3:5], bins[chosen])


POLICY_AUGMENTATIONS = tuple(AutoAugment(name) for name in POLICIES)
