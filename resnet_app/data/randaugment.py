"""RandAugment (Cubuk et al. 2020) and random erasing (Zhong et al. 2020), stateless.

Both run per training example on the tf.data side, and every random choice is a
stateless op of the example's seed (`data/seeds.py`), so a resumed run redraws
exactly what the interrupted one drew.

RandAugment applies `num_ops` operations, each drawn uniformly (with
replacement) from the paper's 14, each at the one magnitude M (0-10 scale, the
TF / timm convention; up to 30 extrapolates). The ops work on batches of uint8
[H, W, 3] images in the 0-255 domain, before normalization, each image with its
own arguments, and compute what PIL's `ImageOps` / `ImageEnhance` /
`Image.transform` compute (timm's implementation), including PIL's truncation
to the 0-255 grid. Each op with a magnitude grows more severe with it and is
the identity at M = 0 (timm's "increasing" ops, used by DeiT and "ResNet
strikes back"); level = M / 10:

  Identity, AutoContrast, Equalize  no magnitude (PIL's autocontrast, equalize)
  Rotate            +-30 * level degrees about the centre
  Solarize          invert values >= max(0, 256 - int(256 * level))
  Color, Contrast,  blend with PIL's degenerate image by the factor
  Brightness,       max(0.1, 1 +- 0.9 * level)
  Sharpness
  Posterize         keep max(1, 8 - int(4 * level)) bits (8 to 4 for M <= 10,
                    AutoAugment's range; timm's increasing form keeps 4 to 0)
  ShearX, ShearY    +-0.3 * level, about the top-left corner (as timm)
  TranslateX, -Y    +-0.45 * level of the width or height (timm's relative form)

where +- is a random sign per op. By default every op drawn is applied at M
(the paper). timm's two variations are options: each op applies with a
probability p, else it is skipped (`keep_ops`; a skipped op is the Identity;
timm's default p is 0.5), and each op's magnitude is drawn per image from
N(M, std), clipped to [0, max(10, M)] (`randaugment_magnitudes.py`; timm's
"mstd", whose clip is [0, 10] unless its "mmax" raises it). Their draws come
from streams of their own, so the ops and signs drawn are the same with or
without them.

Rotations, shears and translations sample bilinearly and fill the uncovered
area with the dataset's mean colour, rounded (timm's training transform fills
with the mean it normalizes by, TF with grey 128; after normalization the mean
is about 0, the colour of the CIFAR recipe's padding).

`randaugment` runs one image's ops (a switch per op); `randaugment_batch` runs
a batch's, each op once on the images that drew it, which on 32-pixel images
costs a fraction of per-image ops. Both give the same images. The op set is
shared with TrivialAugment (`data/trivialaugment.py`): an `OpRanges` says how a
policy's magnitude becomes the ops' arguments and how its ops sample.

Random erasing picks, with probability p, a box of area fraction in
`area_range` and aspect ratio (height / width, log-uniform) in `aspect_range`,
in up to 10 attempts (an attempt whose box does not fit is redrawn; timm's
rule), and replaces it, after normalization, with per-pixel N(0, 1) noise in the
normalized space (timm's default "pixel" mode; zeros would be the mean colour).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import tensorflow as tf

from resnet_app.data import randaugment_magnitudes as magnitudes

OPS = (
    *("Identity", "AutoContrast", "Equalize", "Rotate", "Solarize", "Color", "Posterize"),
    *("Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateX", "TranslateY"),
)
ERASE_ATTEMPTS = 10
# Per example: whether to erase, the box's top and left, then per attempt its
# area and aspect ratio.
ERASE_DRAWS = 3 + 2 * ERASE_ATTEMPTS
# Folded into an example's seed: RandAugment's and erasing's own streams. Above
# any example id, so a derived seed [h(seed), stream] is never an example's seed.
RANDAUGMENT_STREAM = (1 << 40) + 1
ERASE_STREAM = (1 << 40) + 2
KEEP_STREAM = (1 << 40) + 3  # Which of RandAugment's ops apply.
MAGNITUDE_STREAM = (1 << 40) + 4  # RandAugment's per-op magnitudes.
CUTOUT_STREAM = (1 << 40) + 5  # Cutout's square (`preprocessing.cutout_boxes`).
TRIVIAL_STREAM = (1 << 40) + 6  # TrivialAugment's op, sign and magnitude bin.
AUTOAUGMENT_STREAM = (1 << 40) + 7  # AutoAugment's sub-policy, its ops' chances and signs.
AUGMIX_STREAM = (1 << 40) + 8  # AugMix's chains and mixing weights, per view.


@dataclasses.dataclass(frozen=True)
class OpRanges:
    """How a policy's magnitude becomes each op's argument, and how its ops sample.

    Attributes:
      arguments: magnitude (a number, or float32 [batch]) -> the ops' arguments,
        as `randaugment_magnitudes.op_arguments` gives them.
      min_factor: the enhance ops' factor 1 +- f is at least this (timm's
        0.1), or None for no floor.
      translate_pixels: (magnitude, the image's width for TranslateX or height
        for TranslateY, float32) -> the shift in whole pixels, a positive one
        moving the content right or down (torchvision's); None: "translate"
        is a fraction of the size that moves it left or up (timm's).
      interpolation: how geometric ops sample: "BILINEAR" (timm's) or
        "NEAREST" (torchvision's default for its policies).
      ops: the op names the policy's indices refer to.
    """

    arguments: Callable
    min_factor: float | None = 0.1
    translate_pixels: Callable | None = None
    interpolation: str = "BILINEAR"
    ops: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.ops:
            object.__setattr__(self, "ops", OPS)


RANDAUGMENT_RANGES = OpRanges(magnitudes.op_arguments)


def sub_seed(seed: tf.Tensor, stream: int) -> tf.Tensor:
    """An int64 [2] seed for one augmentation of an example, from its seed."""
    return tf.random.experimental.stateless_fold_in(seed, tf.constant(stream, tf.int64))


def _to_uint8(images: tf.Tensor) -> tf.Tensor:
    # PIL truncates its float results (a cast to uint8 does too).
    return tf.cast(tf.clip_by_value(images, 0.0, 255.0), tf.uint8)


# -- pointwise and histogram ops: uint8 [batch, H, W, 3] in and out ---------------


def _lookup(images: tf.Tensor, tables: tf.Tensor) -> tf.Tensor:
    """Maps each value through its image's and channel's table: tables [batch, 3, 256]."""
    # One table per (image, channel), flattened: offsets select it.
    offsets = (tf.range(tf.shape(images)[0])[:, None, None, None] * 3 + tf.range(3)) * 256
    return tf.gather(tf.reshape(tables, [-1]), tf.cast(images, tf.int32) + offsets)


def auto_contrast(images: tf.Tensor) -> tf.Tensor:
    """Stretches each channel to 0-255 (PIL's `autocontrast`; a flat channel stays)."""
    low = tf.cast(tf.reduce_min(images, axis=[1, 2]), tf.float64)[..., None]  # [batch, 3, 1]
    high = tf.cast(tf.reduce_max(images, axis=[1, 2]), tf.float64)[..., None]
    levels = tf.range(256, dtype=tf.float64)
    # PIL's arithmetic, in doubles: x * scale + offset, then truncated; it can
    # land just below an integer that (x - low) * 255 / (high - low) would hit.
    scale = 255.0 / tf.maximum(high - low, 1.0)
    scaled = tf.floor(levels * scale + (-low * scale))
    tables = tf.where(high > low, tf.clip_by_value(scaled, 0.0, 255.0), levels)
    return _lookup(images, tf.cast(tables, tf.uint8))


def equalize(images: tf.Tensor) -> tf.Tensor:
    """Histogram equalization of each channel of each image, PIL's `equalize` rule."""
    # One histogram per (image, channel): [batch * 3, 256].
    keys = tf.cast(images, tf.int32) + tf.range(3) * 256
    keys = tf.reshape(keys, [tf.shape(images)[0], -1])
    histogram = tf.math.bincount(keys, minlength=768, maxlength=768, axis=-1)
    histogram = tf.reshape(histogram, [-1, 256])
    levels = tf.range(256)
    last = tf.reduce_max(tf.where(histogram > 0, levels, 0), axis=1)
    step = (tf.reduce_sum(histogram, axis=1) - tf.gather(histogram, last, batch_dims=1)) // 255
    step = step[:, None]
    tables = (step // 2 + tf.cumsum(histogram, axis=1, exclusive=True)) // tf.maximum(step, 1)
    tables = tf.where(step > 0, tf.clip_by_value(tables, 0, 255), levels)
    return _lookup(images, tf.cast(tf.reshape(tables, [-1, 3, 256]), tf.uint8))


def _per_image(values: tf.Tensor) -> tf.Tensor:
    """A scalar as it is; [batch] values shaped to broadcast over [batch, H, W, 3]."""
    values = tf.convert_to_tensor(values)
    return values if values.shape.rank == 0 else values[:, None, None, None]


def solarize(images: tf.Tensor, threshold) -> tf.Tensor:
    """Inverts the values at or above `threshold` (0-256; 256 changes nothing).

    Args:
      images: uint8 [batch, H, W, 3].
      threshold: an int, or int32 [batch], one per image.
    """
    above = tf.cast(images, tf.int32) >= _per_image(threshold)
    # 255 - x is x XOR 255 on bytes; an XOR with 0 keeps x (and costs less than a select).
    return tf.bitwise.bitwise_xor(images, tf.cast(above, tf.uint8) * 255)


def posterize(images: tf.Tensor, bits) -> tf.Tensor:
    """Keeps the `bits` (0-8: an int, or int32 [batch], one per image) top bits of each
    value; 0 keeps none (black: AugMix's last bins)."""
    bits = tf.convert_to_tensor(bits, tf.int32)
    masks = 256 - tf.bitwise.left_shift(tf.ones_like(bits), 8 - bits)
    return tf.bitwise.bitwise_and(images, _per_image(tf.cast(masks, tf.uint8)))


# -- blends with a degenerate image (PIL's ImageEnhance) ------------------------------


def blend(degenerate: tf.Tensor, images: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
    """degenerate + factor * (images - degenerate), clipped and truncated (PIL's `blend`).

    Args:
      degenerate: float32, broadcastable to `images`.
      images: uint8 [batch, H, W, 3].
      factor: float32 [batch].
    """
    degenerate = tf.cast(degenerate, tf.float32)
    pixels = tf.cast(images, tf.float32)
    factor = tf.cast(factor, tf.float32)[:, None, None, None]
    return _to_uint8(degenerate + factor * (pixels - degenerate))


def luma(images: tf.Tensor) -> tf.Tensor:
    """int32 [batch, H, W, 1]: PIL's RGB to L conversion (ITU-R 601, fixed point, rounded)."""
    r, g, b = tf.unstack(tf.cast(images, tf.int32), axis=-1)
    return tf.bitwise.right_shift(r * 19595 + g * 38470 + b * 7471 + 0x8000, 16)[..., None]


def color(images: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
    """Saturation: a blend with each image's grey version."""
    return blend(luma(images), images, factor)


def contrast(images: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
    """A blend with each image's mean grey (PIL: the mean luma, rounded half up)."""
    values = tf.cast(luma(images), tf.int64)
    count = tf.cast(tf.shape(values)[1] * tf.shape(values)[2], tf.int64)
    mean = (2 * tf.reduce_sum(values, axis=[1, 2, 3], keepdims=True) + count) // (2 * count)
    return blend(mean, images, factor)


def brightness(images: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
    """A blend with black."""
    return blend(0.0, images, factor)


def sharpness(images: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
    """A blend with PIL's SMOOTH filter (3x3, centre 5, others 1, / 13; border pixels kept)."""
    values = tf.cast(images, tf.int32)
    # The 3x3 sums, in integers (a convolution mishandles empty batches).
    rows = values[:, :-2] + values[:, 1:-1] + values[:, 2:]
    sums = rows[:, :, :-2] + rows[:, :, 1:-1] + rows[:, :, 2:] + 4 * values[:, 1:-1, 1:-1]
    smooth = tf.cast((2 * sums + 13) // 26, tf.float32)  # Rounded, as PIL.
    pixels = tf.cast(images, tf.float32)
    middle = tf.concat([pixels[:, 1:-1, :1], smooth, pixels[:, 1:-1, -1:]], axis=2)
    degenerate = tf.concat([pixels[:, :1], middle, pixels[:, -1:]], axis=1)
    return blend(degenerate, images, factor)


# -- geometric ops -----------------------------------------------------------------


def affine(
    images: tf.Tensor, matrices: tf.Tensor, fill: Sequence[int], interpolation: str = "BILINEAR"
) -> tf.Tensor:
    """PIL's `Image.transform(size, AFFINE, matrix)` of each image.

    Args:
      images: uint8 [batch, H, W, 3].
      matrices: float32 [batch, 6], (a, b, c, d, e, f): the output pixel whose
        centre is (x, y) reads the input at (a x + b y + c, d x + e y + f), in
        PIL's coordinates (the image's top-left corner at (0, 0)).
      fill: the RGB colour of the area read from outside the image.
      interpolation: "BILINEAR", or "NEAREST" (the pixel the point falls in:
        PIL's NEAREST, which floors the point's coordinates, as TensorFlow's
        rounding of them less half a pixel does).

    Returns:
      uint8 [batch, H, W, 3]. Bilinearly, a pixel whose 4 sampled neighbours
      are all inside equals PIL's; along the edge this blends the outside with
      `fill` where PIL repeats the edge pixel.
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
    # PIL interpolates in double precision and truncates. In float32 a value
    # PIL computes as an exact integer (between equal neighbours, say) can land
    # a hair below it; 1e-3 (far above float32's error on 0-255, far below the
    # grid's step) keeps the truncation on PIL's side.
    return _to_uint8(moved + (fill + 1e-3))


def geometric_matrices(
    name: str, images: tf.Tensor, signs: tf.Tensor, magnitude, ranges: OpRanges = RANDAUGMENT_RANGES
):
    """float32 [batch, 6]: PIL's `affine` matrices of a geometric op, one per image.

    Rotate is PIL's `Image.rotate` (counter-clockwise about the centre); ShearX
    moves row y left by shear * y, ShearY column x up by shear * x (about the
    top-left corner, as timm and torchvision); TranslateX and -Y move the
    content left and up by a fraction of the size, or with `ranges` in pixels,
    right and down (torchvision's). `magnitude` is M, or float32 [batch], one
    per image (`ranges.arguments`).
    """
    arguments = ranges.arguments(magnitude)
    signs = tf.cast(signs, tf.float32)
    one, zero = tf.ones_like(signs), tf.zeros_like(signs)
    height, width = tf.unstack(tf.cast(tf.shape(images)[1:3], tf.float32))
    if name == "Rotate":
        angle = -signs * arguments["degrees"] * (math.pi / 180)
        cos, sin = tf.cos(angle), tf.sin(angle)
        cx, cy = width / 2, height / 2
        entries = (cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy)
    else:
        shear = signs * arguments["shear"]
        if ranges.translate_pixels is not None:  # torchvision's: + moves right and down.
            size = width if name == "TranslateX" else height
            move_x = move_y = -signs * ranges.translate_pixels(magnitude, size)
        else:  # timm's: a fraction of the size; + moves it left and up.
            move = signs * arguments["translate"]
            move_x, move_y = move * width, move * height
        entries = {
            "ShearX": (one, shear, zero, zero, one, zero),
            "ShearY": (one, zero, zero, shear, one, zero),
            "TranslateX": (one, zero, move_x, zero, one, zero),
            "TranslateY": (one, zero, zero, zero, one, move_y),
        }[name]
    return tf.stack(entries, axis=1)


# -- the policy ------------------------------------------------------------------


def apply_op(
    name: str,
    images: tf.Tensor,
    signs: tf.Tensor,
    magnitude,
    fill,
    ranges: OpRanges = RANDAUGMENT_RANGES,
):
    """Op `name` at `magnitude` on a batch, each image's signed arguments times its sign.

    Args:
      name: one of `ranges.ops`.
      images: uint8 [batch, H, W, 3].
      signs: float32 [batch], +1 or -1.
      magnitude: M (a number), or float32 [batch], one per image.
      fill: the RGB colour geometric ops fill with.
      ranges: the policy's arguments at `magnitude` and its sampling.
    """
    if name in WITHOUT_MAGNITUDE:
        return WITHOUT_MAGNITUDE[name](images)
    if name in GEOMETRIC:
        matrices = geometric_matrices(name, images, signs, magnitude, ranges)
        return affine(images, matrices, fill, ranges.interpolation)
    arguments = ranges.arguments(magnitude)
    if name in BLENDS:
        # 1 +- factor in double, then one rounding to float32: PIL's arithmetic.
        factor = 1.0 + tf.cast(signs, tf.float64) * arguments["factor"]
        if ranges.min_factor is not None:
            factor = tf.maximum(tf.constant(ranges.min_factor, tf.float64), factor)
        return BLENDS[name](images, tf.cast(factor, tf.float32))
    if name == "Solarize":
        return solarize(images, arguments["threshold"])
    return posterize(images, arguments["bits"])


def choose_ops(seed: tf.Tensor, num_ops: int) -> tuple[tf.Tensor, tf.Tensor]:
    """One example's ops: (int32 [num_ops] indices into `OPS`, float32 [num_ops] signs).

    Args:
      seed: int64 [2], the example's RandAugment seed (`sub_seed(seed, RANDAUGMENT_STREAM)`).
      num_ops: ops to draw.
    """
    draws = tf.random.stateless_uniform([2, num_ops], seed)
    indices = tf.cast(tf.floor(draws[0] * len(OPS)), tf.int32)
    return indices, tf.where(draws[1] < 0.5, -1.0, 1.0)


def keep_ops(seed: tf.Tensor, num_ops: int, probability: float) -> tf.Tensor:
    """bool [num_ops]: which of an example's ops apply, each with `probability` (timm's p).

    Args:
      seed: int64 [2], the example's seed for these draws (`sub_seed(seed, KEEP_STREAM)`).
      num_ops: the example's ops.
      probability: the chance each op applies.
    """
    # timm applies an op when random() <= p, random() in [0, 1): the same chance.
    return tf.random.stateless_uniform([num_ops], seed) < probability


def skip_ops(indices: tf.Tensor, keep: tf.Tensor) -> tf.Tensor:
    """`indices` with each op not kept replaced by the Identity (what skipping it does)."""
    return tf.where(keep, indices, tf.constant(OPS.index("Identity"), indices.dtype))


def invert(images: tf.Tensor) -> tf.Tensor:
    """255 - x (PIL's `invert`; AutoAugment's op, not one of RandAugment's 14)."""
    return tf.bitwise.invert(images)


WITHOUT_MAGNITUDE = {
    "Identity": tf.identity,
    "AutoContrast": auto_contrast,
    "Equalize": equalize,
    "Invert": invert,
}
BLENDS = {"Color": color, "Contrast": contrast, "Brightness": brightness, "Sharpness": sharpness}
GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY")


def randaugment(
    image: tf.Tensor,
    indices: tf.Tensor,
    signs: tf.Tensor,
    magnitude,
    fill: Sequence[int],
    ranges: OpRanges = RANDAUGMENT_RANGES,
) -> tf.Tensor:
    """RandAugment on one image (`randaugment_batch` does a batch).

    Args:
      image: uint8 [H, W, 3].
      indices: int32 [num_ops], the image's `choose_ops`, applied in turn.
      signs: float32 [num_ops], their signs.
      magnitude: M, 0-30; or float32 [num_ops], each op's (`noisy_magnitudes`).
      fill: the RGB colour geometric ops fill with.
      ranges: the policy's arguments and sampling (TrivialAugment's, say).

    Returns:
      uint8 [H, W, 3].
    """
    images, indices = image[None], tf.convert_to_tensor(indices, tf.int32)
    signs = tf.convert_to_tensor(signs, tf.float32)
    for step in range(indices.shape[0]):
        step_signs = signs[step : step + 1]
        step_magnitude = magnitudes.step_magnitudes(magnitude, step)
        ops = [
            functools.partial(apply_op, name, images, step_signs, step_magnitude, fill, ranges)
            for name in ranges.ops
        ]
        images = tf.ensure_shape(tf.switch_case(indices[step], ops), images.shape)
    return images[0]


def randaugment_batch(
    images: tf.Tensor,
    indices: tf.Tensor,
    signs: tf.Tensor,
    magnitude,
    fill: Sequence[int],
    ranges: OpRanges = RANDAUGMENT_RANGES,
) -> tf.Tensor:
    """RandAugment on a batch, each image with its own ops: `randaugment` of each image.

    Args:
      images: uint8 [batch, H, W, 3].
      indices: int32 [batch, num_ops], each image's `choose_ops`.
      signs: float32 [batch, num_ops], their signs.
      magnitude: M, 0-30; or float32 [batch, num_ops], each image's and op's.
      fill: the RGB colour geometric ops fill with.
      ranges: the policy's arguments and sampling (TrivialAugment's, say).

    Returns:
      uint8 [batch, H, W, 3].
    """
    positions = tf.range(tf.shape(images)[0])
    for step in range(indices.shape[1]):
        # Each op runs once, on the images that drew it.
        groups = tf.dynamic_partition(positions, indices[:, step], len(ranges.ops))
        outputs = [
            apply_op(
                name,
                tf.gather(images, group),
                tf.gather(signs[:, step], group),
                magnitudes.step_magnitudes(magnitude, step, group),
                fill,
                ranges,
            )
            for name, group in zip(ranges.ops, groups)
        ]
        images = tf.ensure_shape(tf.dynamic_stitch(groups, outputs), images.shape)
    return images


# -- random erasing --------------------------------------------------------------
#
# Per example, only the draws (one op) and the noise: the box arithmetic runs
# on whole batches, which matters with few cores.


def erase_draws(seed: tf.Tensor) -> tf.Tensor:
    """float32 [ERASE_DRAWS] for `erase_boxes`, from an example's erasing seed."""
    return tf.random.stateless_uniform([ERASE_DRAWS], seed)


def erase_boxes(
    draws: tf.Tensor,
    height: int,
    width: int,
    probability: float,
    area_range: Sequence[float],
    aspect_range: Sequence[float],
) -> tf.Tensor:
    """The box each example erases: int32 [batch, 4] (top, left, height, width), 0s for none.

    Of the `ERASE_ATTEMPTS` boxes `draws` ([batch, ERASE_DRAWS]) give, the
    first that fits (at least a pixel; height < `height`, width < `width`) is
    placed uniformly; if none fits, nothing is erased.

    Args:
      draws: float32 [batch, ERASE_DRAWS] from `erase_draws`.
      height: the images' height.
      width: the images' width.
      probability: the chance an example is erased at all.
      area_range: the box's area as a fraction of the image's.
      aspect_range: the box's height / width, drawn log-uniformly.
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


def erase_noise(seed: tf.Tensor, draws: tf.Tensor, probability: float, shape) -> tf.Tensor:
    """float32 `shape` [H, W, 3] of N(0, 1) noise if `draws` (the example's,
    from its erasing `seed`) may erase it, else zeros."""
    noise_seed = tf.random.experimental.stateless_fold_in(seed, 1)
    return tf.cond(
        draws[0] < probability,
        lambda: tf.random.stateless_normal(shape, noise_seed),
        lambda: tf.zeros(shape),
    )


def erase_batch(images: tf.Tensor, boxes: tf.Tensor, noise: tf.Tensor) -> tf.Tensor:
    """Replaces each image's box with its noise.

    Args:
      images: float32 [batch, H, W, 3], normalized.
      boxes: int32 [batch, 4] from `erase_boxes`.
      noise: float32 [batch, H, W, 3] from `erase_noise`.

    Returns:
      float32 [batch, H, W, 3].
    """
    top, left, height, width = tf.unstack(boxes, axis=1)
    rows = tf.range(tf.shape(images)[1])[None, :]
    columns = tf.range(tf.shape(images)[2])[None, :]
    in_rows = (rows >= top[:, None]) & (rows < (top + height)[:, None])
    in_columns = (columns >= left[:, None]) & (columns < (left + width)[:, None])
    inside = tf.cast(in_rows[:, :, None, None] & in_columns[:, None, :, None], tf.float32)
    # Exact, 0s and 1s: the noise inside, the image outside.
    return images * (1.0 - inside) + noise * inside
