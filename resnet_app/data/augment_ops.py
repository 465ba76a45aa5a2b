"""The pixel ops the policies name (`OPS`), and the base of an augmentation (`Augmentation`).

A pixel op maps uint8 [batch, H, W, 3] images, each by its own sign and
magnitude, computing what PIL's `ImageOps`, `ImageEnhance` and
`Image.transform` compute, truncation included. A policy (RandAugment,
TrivialAugment, AutoAugment, AugMix) is a table over them, an `OpRanges`: the
op names its draws index and how its magnitude becomes each op's argument. A
new op is one `Op` in `OPS`, which a policy names.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import tensorflow as tf


def sub_seed(seed: tf.Tensor, stream: int) -> tf.Tensor:
    """The int64 [2] seed of one augmentation stream of an example, from its seed: the
    stream folded in above any example id (2**40), so it is never an example's seed."""
    return tf.random.experimental.stateless_fold_in(seed, tf.constant((1 << 40) + stream, tf.int64))


def signs_of(uniform: tf.Tensor) -> tf.Tensor:
    """float32 -1 or +1 from uniform draws."""
    return tf.where(uniform < 0.5, -1.0, 1.0)


class Augmentation:
    """One training augmentation (`data/augmentations.py` registers them): when it is on,
    one example's draws from a seed stream of its own, its transform of a batch.

    `name` keys its draws (and is the `data.augment.auto_augment` value of a
    policy); `pixels`: it maps uint8 pixels before the crop and normalization,
    else normalized float32 images after them; `streams`: its seed streams
    (`sub_seed`), no other kind's (tests check), so no other draw depends on them.
    """

    name: ClassVar[str]
    pixels: ClassVar[bool] = True
    streams: ClassVar[tuple[int, ...]]

    def on(self, augment) -> bool:
        """Whether the `data.augment` settings turn it on."""
        return augment.auto_augment == self.name

    def draw(self, seed: tf.Tensor, config) -> dict[str, tf.Tensor]:
        """One example's draws, from its int64 [2] seed and the `Preprocessing`."""
        raise NotImplementedError

    def seed(self, seed: tf.Tensor, stream: int = 0) -> tf.Tensor:
        """The seed of its `stream`-th stream for the example of `seed`."""
        return sub_seed(seed, self.streams[stream])

    def uniform(self, seed: tf.Tensor, shape, stream: int = 0) -> tf.Tensor:
        """float32 draws in [0, 1) from its `stream`-th stream for the example of `seed`."""
        return tf.random.stateless_uniform(shape, self.seed(seed, stream))

    def apply(self, images: tf.Tensor, draws: dict, config, fill: Sequence[int]) -> tf.Tensor:
        """A batch, each image by its draws (batched `draw`); `fill`: the RGB colour
        geometric ops fill with."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class OpRanges:
    """A policy's table: the op names its indices refer to, and how they sample.

    Attributes:
      ops: names in `OPS`.
      arguments: magnitude (a number, or float32 [batch]) -> the ops' float32
        "degrees", "shear", "translate" (a fraction of the size), float64
        "factor" (the enhance ops' distance from 1), int32 "threshold", "bits".
      min_factor: the enhance ops' factor 1 +- f is at least this (timm's 0.1).
      translate_pixels: (magnitude, width or height) -> whole pixels, right or
        down (torchvision's); None: "translate" moves left or up (timm's).
      interpolation: "BILINEAR" (timm's) or "NEAREST" (torchvision's default).
    """

    ops: tuple[str, ...]
    arguments: Callable
    min_factor: float | None = 0.1
    translate_pixels: Callable | None = None
    interpolation: str = "BILINEAR"


def binned(tables: dict[str, Any]) -> Callable:
    """`OpRanges.arguments` read from per-bin tables (NumPy arrays by argument name)."""

    def arguments(bins) -> dict[str, tf.Tensor]:
        index = tf.cast(tf.convert_to_tensor(bins), tf.int32)
        return {name: tf.gather(tf.constant(table), index) for name, table in tables.items()}

    return arguments


def _to_uint8(images: tf.Tensor) -> tf.Tensor:
    # PIL truncates its float results (a cast to uint8 does too).
    return tf.cast(tf.clip_by_value(images, 0.0, 255.0), tf.uint8)


def _per_image(values) -> tf.Tensor:
    """A scalar as it is; [batch] values shaped to broadcast over [batch, H, W, 3]."""
    values = tf.convert_to_tensor(values)
    return values if values.shape.rank == 0 else values[:, None, None, None]


# -- the kernels: uint8 [batch, H, W, 3] in and out ---------------------------------------


def _lookup(images: tf.Tensor, tables: tf.Tensor) -> tf.Tensor:
    """Maps each value through its image's and channel's table: tables [batch, 3, 256]."""
    offsets = (tf.range(tf.shape(images)[0])[:, None, None, None] * 3 + tf.range(3)) * 256
    return tf.gather(tf.reshape(tables, [-1]), tf.cast(images, tf.int32) + offsets)


def auto_contrast(images: tf.Tensor) -> tf.Tensor:
    """Stretches each channel to 0-255 (PIL's `autocontrast`; a flat channel stays)."""
    low = tf.cast(tf.reduce_min(images, axis=[1, 2]), tf.float64)[..., None]  # [batch, 3, 1]
    high = tf.cast(tf.reduce_max(images, axis=[1, 2]), tf.float64)[..., None]
    levels = tf.range(256, dtype=tf.float64)
    # PIL's arithmetic in doubles, x * scale + offset truncated: it can land just
    # below an integer that (x - low) * 255 / (high - low) would hit.
    scale = 255.0 / tf.maximum(high - low, 1.0)
    scaled = tf.floor(levels * scale + (-low * scale))
    tables = tf.where(high > low, tf.clip_by_value(scaled, 0.0, 255.0), levels)
    return _lookup(images, tf.cast(tables, tf.uint8))


def equalize(images: tf.Tensor) -> tf.Tensor:
    """Histogram equalization of each channel of each image, PIL's `equalize` rule."""
    keys = tf.cast(images, tf.int32) + tf.range(3) * 256
    keys = tf.reshape(keys, [tf.shape(images)[0], -1])
    histogram = tf.math.bincount(keys, minlength=768, maxlength=768, axis=-1)
    histogram = tf.reshape(histogram, [-1, 256])  # One per (image, channel).
    levels = tf.range(256)
    last = tf.reduce_max(tf.where(histogram > 0, levels, 0), axis=1)
    step = (tf.reduce_sum(histogram, axis=1) - tf.gather(histogram, last, batch_dims=1)) // 255
    step = step[:, None]
    tables = (step // 2 + tf.cumsum(histogram, axis=1, exclusive=True)) // tf.maximum(step, 1)
    tables = tf.where(step > 0, tf.clip_by_value(tables, 0, 255), levels)
    return _lookup(images, tf.cast(tf.reshape(tables, [-1, 3, 256]), tf.uint8))


def solarize(images: tf.Tensor, threshold) -> tf.Tensor:
    """Inverts the values at or above `threshold` (0-256; an int or int32 [batch])."""
    above = tf.cast(images, tf.int32) >= _per_image(threshold)
    # 255 - x is x XOR 255 on bytes; an XOR with 0 keeps x (cheaper than a select).
    return tf.bitwise.bitwise_xor(images, tf.cast(above, tf.uint8) * 255)


def posterize(images: tf.Tensor, bits) -> tf.Tensor:
    """Keeps the `bits` (0-8, an int or int32 [batch]) top bits; 0 keeps none (black)."""
    bits = tf.convert_to_tensor(bits, tf.int32)
    masks = 256 - tf.bitwise.left_shift(tf.ones_like(bits), 8 - bits)
    return tf.bitwise.bitwise_and(images, _per_image(tf.cast(masks, tf.uint8)))


def blend(degenerate, images: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
    """degenerate + factor [batch] * (images - degenerate), truncated (PIL's `blend`)."""
    degenerate = tf.cast(degenerate, tf.float32)
    pixels = tf.cast(images, tf.float32)
    factor = tf.cast(factor, tf.float32)[:, None, None, None]
    return _to_uint8(degenerate + factor * (pixels - degenerate))


def luma(images: tf.Tensor) -> tf.Tensor:
    """int32 [batch, H, W, 1]: PIL's RGB to L conversion (ITU-R 601, fixed point, rounded)."""
    r, g, b = tf.unstack(tf.cast(images, tf.int32), axis=-1)
    return tf.bitwise.right_shift(r * 19595 + g * 38470 + b * 7471 + 0x8000, 16)[..., None]


def mean_luma(images: tf.Tensor) -> tf.Tensor:
    """Each image's mean luma, rounded half up (PIL's `Contrast`)."""
    values = tf.cast(luma(images), tf.int64)
    count = tf.cast(tf.shape(values)[1] * tf.shape(values)[2], tf.int64)
    return (2 * tf.reduce_sum(values, axis=[1, 2, 3], keepdims=True) + count) // (2 * count)


def smooth(images: tf.Tensor) -> tf.Tensor:
    """PIL's SMOOTH filter (3x3, centre 5, others 1, / 13; border pixels kept), float32."""
    values = tf.cast(images, tf.int32)
    # The 3x3 sums, in integers (a convolution mishandles empty batches).
    rows = values[:, :-2] + values[:, 1:-1] + values[:, 2:]
    sums = rows[:, :, :-2] + rows[:, :, 1:-1] + rows[:, :, 2:] + 4 * values[:, 1:-1, 1:-1]
    smoothed = tf.cast((2 * sums + 13) // 26, tf.float32)  # Rounded, as PIL.
    pixels = tf.cast(images, tf.float32)
    middle = tf.concat([pixels[:, 1:-1, :1], smoothed, pixels[:, 1:-1, -1:]], axis=2)
    return tf.concat([pixels[:, :1], middle, pixels[:, -1:]], axis=1)


def affine(images: tf.Tensor, matrices: tf.Tensor, fill: Sequence[int], interpolation: str):
    """PIL's `Image.transform(size, AFFINE, matrix)` of each image.

    `matrices` float32 [batch, 6], (a, b, c, d, e, f): the output pixel centred
    at (x, y) reads the input at (a x + b y + c, d x + e y + f), PIL's
    coordinates; outside reads `fill` (RGB). "NEAREST" is PIL's (a floor, as
    TensorFlow's rounding less half a pixel). Bilinearly, a pixel whose 4
    neighbours are inside equals PIL's; along the edge this blends with `fill`
    where PIL repeats the edge.
    """
    a, b, c, d, e, f = tf.unstack(matrices, axis=1)
    zero = tf.zeros_like(a)
    # TensorFlow's coordinates have pixel centres at integers.
    transforms = tf.stack(
        [a, b, c + 0.5 * (a + b) - 0.5, d, e, f + 0.5 * (d + e) - 0.5, zero, zero], axis=1
    )
    fill = tf.constant(fill, tf.float32)
    # The op fills with one scalar: sample (images - fill), filled with 0.
    moved = tf.raw_ops.ImageProjectiveTransformV3(
        images=tf.cast(images, tf.float32) - fill,
        transforms=transforms,
        output_shape=tf.shape(images)[1:3],
        fill_value=0.0,
        interpolation=interpolation,
        fill_mode="CONSTANT",
    )
    # PIL interpolates in doubles and truncates; in float32 an exact integer can
    # land a hair below it: 1e-3 keeps the truncation on PIL's side.
    return _to_uint8(moved + (fill + 1e-3))


# -- the ops ------------------------------------------------------------------------------


class Op:
    """A pixel op as the policies name it."""

    def apply(self, images, signs, magnitude, fill, ranges: OpRanges) -> tf.Tensor:
        """uint8 [batch, H, W, 3] images, each at its sign (float32 [batch], +-1) and the
        magnitude (a number, or float32 [batch]) of the policy's `ranges`."""
        raise NotImplementedError


class Pointwise(Op):
    """`function(images)`, or `function(images, value)` of one of the policy's arguments."""

    def __init__(self, function: Callable, argument: str | None = None):
        self.function, self.argument = function, argument

    def apply(self, images, signs, magnitude, fill, ranges):
        if self.argument is None:
            return self.function(images)
        return self.function(images, ranges.arguments(magnitude)[self.argument])


class Enhance(Op):
    """A blend with a degenerate image (PIL's `ImageEnhance`) by the factor 1 +- "factor"."""

    def __init__(self, degenerate: Callable[[tf.Tensor], Any]):
        self.degenerate = degenerate

    def apply(self, images, signs, magnitude, fill, ranges):
        # 1 +- factor in double, then one rounding to float32: PIL's arithmetic.
        factor = 1.0 + tf.cast(signs, tf.float64) * ranges.arguments(magnitude)["factor"]
        if ranges.min_factor is not None:
            factor = tf.maximum(tf.constant(ranges.min_factor, tf.float64), factor)
        return blend(self.degenerate(images), images, tf.cast(factor, tf.float32))


class Geometric(Op):
    """An affine op: `matrix(signs, magnitude, ranges, height, width)` gives PIL's
    (a, b, c, d, e, f), each float32 [batch] (`affine`)."""

    def __init__(self, matrix: Callable):
        self.matrix = matrix

    def apply(self, images, signs, magnitude, fill, ranges):
        height, width = tf.unstack(tf.cast(tf.shape(images)[1:3], tf.float32))
        entries = self.matrix(tf.cast(signs, tf.float32), magnitude, ranges, height, width)
        return affine(images, tf.stack(entries, axis=1), fill, ranges.interpolation)


def _rotate(signs, magnitude, ranges, height, width):
    """PIL's `Image.rotate`: counter-clockwise about the centre."""
    angle = -signs * ranges.arguments(magnitude)["degrees"] * (math.pi / 180)
    cos, sin = tf.cos(angle), tf.sin(angle)
    cx, cy = width / 2, height / 2
    return cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy


def _shear(axis: int) -> Callable:
    """ShearX moves row y left by shear * y, ShearY column x up by shear * x (about the
    top-left corner, as timm and torchvision)."""

    def matrix(signs, magnitude, ranges, height, width):
        shear = signs * ranges.arguments(magnitude)["shear"]
        one, zero = tf.ones_like(signs), tf.zeros_like(signs)
        return (one, shear, zero, zero, one, zero) if axis else (one, zero, zero, shear, one, zero)

    return matrix


def _translate(axis: int) -> Callable:
    """TranslateX (axis 1) or -Y (0): a fraction of the size, left or up; or with the
    policy's `translate_pixels`, whole pixels right or down (torchvision's)."""

    def matrix(signs, magnitude, ranges, height, width):
        size = width if axis else height
        if ranges.translate_pixels is not None:
            move = -signs * ranges.translate_pixels(magnitude, size)
        else:
            move = signs * ranges.arguments(magnitude)["translate"] * size
        one, zero = tf.ones_like(signs), tf.zeros_like(signs)
        return (one, zero, move, zero, one, zero) if axis else (one, zero, zero, zero, one, move)

    return matrix


OPS: dict[str, Op] = {
    "Identity": Pointwise(tf.identity),
    "AutoContrast": Pointwise(auto_contrast),
    "Equalize": Pointwise(equalize),
    "Invert": Pointwise(tf.bitwise.invert),  # 255 - x: AutoAugment's, not RandAugment's.
    "Rotate": Geometric(_rotate),
    "ShearX": Geometric(_shear(1)),
    "ShearY": Geometric(_shear(0)),
    "TranslateX": Geometric(_translate(1)),
    "TranslateY": Geometric(_translate(0)),
    "Solarize": Pointwise(solarize, "threshold"),
    "Posterize": Pointwise(posterize, "bits"),
    "Color": Enhance(luma),  # Saturation: a blend with the grey image.
    "Contrast": Enhance(mean_luma),
    "Brightness": Enhance(lambda images: 0.0),  # A blend with black.
    "Sharpness": Enhance(smooth),
}


def apply_op(name: str, images, signs, magnitude, fill, ranges: OpRanges) -> tf.Tensor:
    """Op `name` on a batch (`Op.apply`)."""
    return OPS[name].apply(images, signs, magnitude, fill, ranges)


def apply_ops(images, indices, signs, magnitude, fill, ranges: OpRanges) -> tf.Tensor:
    """Each image's ops in turn (int32 indices into `ranges.ops`, float32 signs, and a
    magnitude for all or float32, each [batch, steps]): each op runs once per step,
    on the images that drew it; `fill`: the RGB colour geometric ops fill with."""
    positions = tf.range(tf.shape(images)[0])
    constant = isinstance(magnitude, (int, float))
    if not constant:
        magnitude = tf.convert_to_tensor(magnitude, tf.float32)
    for step in range(indices.shape[1]):
        groups = tf.dynamic_partition(positions, indices[:, step], len(ranges.ops))
        outputs = []
        for name, group in zip(ranges.ops, groups):
            at = magnitude if constant else tf.gather(magnitude[:, step], group)
            chosen, chosen_signs = tf.gather(images, group), tf.gather(signs[:, step], group)
            outputs.append(apply_op(name, chosen, chosen_signs, at, fill, ranges))
        images = tf.ensure_shape(tf.dynamic_stitch(groups, outputs), images.shape)
    return images


class OpPolicy(Augmentation):
    """A policy of op sequences: draws "op_indices" (into `ranges.ops`), "op_signs" and
    "op_magnitudes", [steps] each, applied in turn (`apply_ops`)."""

    ranges: OpRanges

    @staticmethod
    def op_draws(indices, signs, magnitudes=None) -> dict[str, tf.Tensor]:
        """The draws under their names; `signs` are uniform draws, signed by `signs_of`."""
        draws = {"op_indices": indices, "op_signs": signs_of(signs)}
        return draws if magnitudes is None else {**draws, "op_magnitudes": magnitudes}

    def magnitude(self, draws: dict, config):
        return draws["op_magnitudes"]

    def apply(self, images, draws, config, fill):
        indices, signs = draws["op_indices"], draws["op_signs"]
        magnitude = self.magnitude(draws, config)
        return apply_ops(images, indices, signs, magnitude, fill, self.ranges)
