"""The CIFAR and ImageNet recipes, each random choice a stateless op of the example's
seed (`data/seeds.py`), so a resumed run redraws what the interrupted one drew.

- CIFAR (He et al. 2015): normalize; in training pad 4 pixels (the mean
  colour), crop at random and flip; drawn per example, applied per batch.
- ImageNet (Szegedy et al. 2015 crops): in training a random crop of 8-100%
  of the area, aspect 3/4-4/3, resized, flipped (JPEG decoded inside the
  window only); in evaluation the shorter side to S / 0.875 and the centre
  (or also the corners, `--tta=crops`).

The optional augmentations (`data/augmentations.py`) apply at one site,
`_train_batch`, the per-example paths as a batch of one: the op policies on
uint8 pixels (CIFAR: before the pad-crop-flip, AutoAugment's order; ImageNet:
on the rounded crop after the flip, timm's), Cutout and erasing after
normalization.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import tensorflow as tf

from resnet_app.data import augmentations, philox
from resnet_app.data import channels as image_channels
from resnet_app.data.settings import AugmentSettings

# ImageNet's per-channel statistics on the 0-255 scale, the usual constants.
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)
# Evaluation resizes an image whole up to this aspect ratio (256 x 1024 floats,
# 3 MB); beyond it, only the crops' windows of the resized image are computed.
MAX_WHOLE_RESIZE_ASPECT = 4


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """Resolved preprocessing parameters (`InputPipeline` fills them from the config):
    the family ("cifar" or "imagenet"), output size, per-channel mean and std on the
    0-255 scale, output dtype, ImageNet's evaluation resize and crop size (None: the
    training size), and the config's `data.augment`."""

    family: str
    image_size: int
    mean: Sequence[float]
    std: Sequence[float]
    dtype: str = "float32"
    eval_resize: int = 256
    eval_image_size: int | None = None
    augment: AugmentSettings = AugmentSettings()

    @property
    def channels(self) -> int:
        """The images' channels: 1 (greyscale) or 3 (RGB), one statistic each."""
        return len(self.mean)

    @property
    def eval_size(self) -> int:
        """The height and width of evaluation images (and of served ones)."""
        return self.eval_image_size or self.image_size


def normalize(image: tf.Tensor, config: Preprocessing) -> tf.Tensor:
    """uint8 pixels [..., channels] as float32 (pixel - mean) / std."""
    mean, std = (tf.constant(values, tf.float32) for values in (config.mean, config.std))
    return (tf.cast(image, tf.float32) - mean) / std


def _finish(image: tf.Tensor, config: Preprocessing, size: int | None = None) -> tf.Tensor:
    """The image checked to be `size` (default: the training size) square, in the output dtype."""
    size = size or config.image_size
    image = tf.ensure_shape(image, [size, size, config.channels])
    return tf.cast(image, config.dtype)


def decode_image(encoded: tf.Tensor, channels: int | None = image_channels.RGB) -> tf.Tensor:
    """JPEG, PNG, BMP or GIF (first frame) bytes, the format read from the bytes, as uint8
    pixels of `channels` (`data/channels.py` converts; None: the file's own)."""
    rgb = channels == image_channels.RGB
    image = tf.io.decode_image(encoded, channels=3 if rgb else 0, expand_animations=False)
    image = tf.ensure_shape(image, [None, None, 3 if rgb else None])
    return image if rgb or channels is None else image_channels.convert(image, channels)


def _resize(image: tf.Tensor, height: tf.Tensor, width: tf.Tensor) -> tf.Tensor:
    return tf.image.resize(tf.cast(image, tf.float32), tf.stack([height, width]))


def cifar_choices_rows(seeds: tf.Tensor, config: Preprocessing) -> tf.Tensor:
    """`cifar_augment`'s "choices" of a batch of seeds (int64 [batch, 2]) at once:
    int32 [batch, 3], each row what `stateless_uniform` of its seed gives."""
    return _choices_of(philox.uniform_rows(seeds, 3), config)


def _choices_of(uniform: tf.Tensor, config: Preprocessing) -> tf.Tensor:
    """One example's CIFAR draws from its uniforms: the crop's top and left in the padded
    image (0 to 2 * padding) and whether to flip (0 or 1; 0 without flips)."""
    positions = 2 * config.augment.crop_padding + 1
    scale = tf.constant([positions, positions, 2 if config.augment.flip else 1], tf.float32)
    return tf.cast(tf.floor(uniform * scale), tf.int32)


def _on_pixels(augmentation, images: tf.Tensor, draws: dict, config: Preprocessing) -> tf.Tensor:
    """An augmentation on uint8 pixels, filling with the mean colour. Greyscale goes
    through as RGB and comes back as its first channel: every op treats the three
    alike (Color's blend with the luma is the identity on grey)."""
    fill = tuple(min(255, max(0, round(value))) for value in config.mean)
    if images.shape[-1] == image_channels.RGB:
        return augmentation.apply(images, draws, config, fill)
    rgb = image_channels.convert(images, image_channels.RGB)
    return augmentation.apply(rgb, draws, config, fill * 3)[..., :1]


def _train_batch(images: tf.Tensor, draws: dict, config: Preprocessing, normalized: Callable):
    """The training augmentations of a batch, each image by its draws: the one site.

    Args:
      images: [batch, H, W, C] uint8 pixels, or float32 (ImageNet's crops,
        rounded for the augmentations on pixels; AugMix's plain view keeps them).
      draws: each augmentation's batched draws by its name, and what
        `normalized` reads.
      config: the parameters.
      normalized: (images, draws) -> the recipe's normalized float32 images.

    Returns:
      float32 [batch, size, size, C]; with AugMix's views [batch, views, ...].
    """
    active, views = augmentations.active(config.augment), config.augment.views
    on_pixels = [augmentation for augmentation in active if augmentation.pixels]
    if on_pixels:
        pixels = images
        if images.dtype != tf.uint8:
            pixels = tf.cast(tf.clip_by_value(tf.round(images), 0, 255), tf.uint8)
        for augmentation in on_pixels:
            pixels = _on_pixels(augmentation, pixels, draws[augmentation.name], config)
        pixels = tf.cast(pixels, images.dtype)
        # With AugMix's views, the plain view first: the image as it came.
        images = pixels if views == 1 else tf.concat([images[:, None], pixels], axis=1)
    later = {key: value for key, value in draws.items() if key not in {a.name for a in on_pixels}}
    if views > 1:  # The views as a batch, each example's draws repeated: augmented alike.
        images = tf.reshape(images, tf.concat([[-1], tf.shape(images)[2:]], axis=0))
        later = tf.nest.map_structure(lambda value: tf.repeat(value, views, axis=0), later)
    images = normalized(images, later)
    for augmentation in (a for a in active if not a.pixels):
        images = augmentation.apply(images, later[augmentation.name], config, None)
    if views > 1:
        images = tf.reshape(images, tf.concat([[-1, views], tf.shape(images)[1:]], axis=0))
    return images


def cifar_augment(image: tf.Tensor, seed: tf.Tensor, config: Preprocessing) -> dict:
    """One example's part of the CIFAR recipe: {"image", "choices"} and, if an augmentation
    is on, "draws" (`augmentations.draws`); batched, `cifar_train_batch`'s arguments."""
    choices = _choices_of(tf.random.stateless_uniform([3], seed), config)
    features = {"image": image, "choices": choices}
    if augmentations.active(config.augment):
        features["draws"] = augmentations.draws(seed, config)
    return features


def cifar_train_batch(
    images: tf.Tensor, choices: tf.Tensor, config: Preprocessing, draws: dict | None = None
) -> tf.Tensor:
    """The CIFAR recipe on a batch, each image by its draws (`cifar_augment`'s), in
    `config.dtype`: per example only draws, which matters with few cores."""

    def crop(images, draws):
        return _crop_normalized(images, draws["choices"], config)

    images = _train_batch(images, {"choices": choices, **(draws or {})}, config, crop)
    return tf.cast(images, config.dtype)


def _crop_normalized(images: tf.Tensor, choices: tf.Tensor, config: Preprocessing) -> tf.Tensor:
    """Each image's crop of itself padded by `crop_padding`, flipped by its choice,
    normalized: float32 [batch, size, size, channels]. Cropped as uint8 (a quarter of
    the bytes), then normalized; the padding is set to 0, the normalized mean colour."""
    size, pad = config.image_size, config.augment.crop_padding
    top, left, flip = tf.unstack(choices, axis=1)
    window = tf.range(size, dtype=tf.int32)
    rows = top[:, None] + window[None, :] - pad
    columns = left[:, None] + window[None, :] - pad
    # Flipping reverses the columns taken.
    columns = tf.where(flip[:, None] > 0, tf.reverse(columns, axis=[1]), columns)
    height, width = tf.shape(images)[1], tf.shape(images)[2]
    crops = tf.gather(images, tf.clip_by_value(rows, 0, height - 1), axis=1, batch_dims=1)
    # Columns gathered as rows: a gather of whole rows is several times faster
    # than one of single pixels (greyscale), transposes included.
    crops = tf.transpose(crops, [0, 2, 1, 3])
    crops = tf.gather(crops, tf.clip_by_value(columns, 0, width - 1), axis=1, batch_dims=1)
    crops = tf.transpose(crops, [0, 2, 1, 3])
    inside_rows = (rows >= 0) & (rows < height)
    inside_columns = (columns >= 0) & (columns < width)
    inside = inside_rows[:, :, None, None] & inside_columns[:, None, :, None]
    normalized = normalize(crops, config)
    crops = tf.where(inside, normalized, tf.zeros_like(normalized))
    return tf.ensure_shape(crops, [None, size, size, config.channels])


def _one(features):
    """One example's features as a batch of one."""
    return tf.nest.map_structure(lambda value: value[None], features)


def cifar_train(image: tf.Tensor, seed: tf.Tensor, config: Preprocessing) -> tf.Tensor:
    """The CIFAR training recipe on one decoded image (uint8 [size, size, C]): the
    pipeline's per-example and batched parts on a batch of one. With AugMix's
    consistency loss, [views, size, size, C]."""
    one = _one(cifar_augment(image, seed, config))
    return cifar_train_batch(one["image"], one["choices"], config, one.get("draws"))[0]


def cifar_eval(image: tf.Tensor, config: Preprocessing) -> tf.Tensor:
    """Normalize one decoded image (no augmentation)."""
    return _finish(normalize(image, config), config)


def _crop_window(shape: tf.Tensor, seed: tf.Tensor, config: Preprocessing) -> tf.Tensor:
    # The Inception crop: sample_distorted_bounding_box with the whole image as
    # the object, so only the area and aspect ranges constrain it. After 10
    # failed attempts it returns the whole image.
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=seed,
        min_object_covered=0.0,
        aspect_ratio_range=config.augment.aspect_ratio_range,
        area_range=config.augment.area_range,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return tf.stack([begin[0], begin[1], size[0], size[1]])


def _random_crop_pixels(image: tf.Tensor, seed: tf.Tensor, config: Preprocessing) -> tf.Tensor:
    top, left, height, width = tf.unstack(_crop_window(tf.shape(image), seed, config))
    return image[top : top + height, left : left + width]


def imagenet_train(
    image: tf.Tensor, seed: tf.Tensor, config: Preprocessing, encoded: bool = False
) -> tf.Tensor:
    """Random-resized crop and flip of one image (uint8 [H, W, C], or encoded bytes when
    `encoded`), then the augmentations on a batch of one: [size, size, C] in
    `config.dtype`, with AugMix's views [views, size, size, C]."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    if encoded:

        def fused_jpeg() -> tf.Tensor:
            window = _crop_window(tf.image.extract_jpeg_shape(image), crop_seed, config)
            crop = tf.image.decode_and_crop_jpeg(image, window, channels=3)
            return image_channels.convert(crop, config.channels)

        def other_formats() -> tf.Tensor:
            return _random_crop_pixels(decode_image(image, config.channels), crop_seed, config)

        crop = tf.cond(tf.io.is_jpeg(image), fused_jpeg, other_formats)
    else:
        crop = _random_crop_pixels(image, crop_seed, config)
    size = config.image_size
    crop = _resize(crop, size, size)
    if config.augment.flip:
        crop = tf.image.stateless_random_flip_left_right(crop, seed=flip_seed)
    draws = _one(augmentations.draws(seed, config))
    images = _train_batch(crop[None], draws, config, lambda images, _: normalize(images, config))
    views = config.augment.views  # One, or AugMix's three.
    shape = [size, size, config.channels] if views == 1 else [views, size, size, config.channels]
    return tf.cast(tf.ensure_shape(images[0], shape), config.dtype)


def _resized_shape(image: tf.Tensor, shorter_side: int) -> list[tf.Tensor]:
    """int32 [height, width] of `image` resized so that its shorter side is `shorter_side`;
    a longer side is capped at 2**30 (int32 sizes would overflow): squeezed, not refused."""
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = shorter_side / tf.reduce_min(shape)
    return tf.unstack(tf.cast(tf.minimum(tf.round(shape * scale), 2.0**30), tf.int32))


def _interpolation(out_indices: tf.Tensor, in_size: tf.Tensor, out_size: tf.Tensor):
    """Bilinear resizing's (lower, upper, fraction) source pixels along one axis, for some
    output pixels: `ResizeBilinear`'s half-pixel arithmetic op for op in float32."""
    scale = tf.cast(in_size, tf.float32) / tf.cast(out_size, tf.float32)
    position = (tf.cast(out_indices, tf.float32) + 0.5) * scale - 0.5
    floor = tf.floor(position)
    # Clamped on both sides: float32 can round a position of a side longer
    # than 2**24 up to the side itself.
    lower = tf.clip_by_value(tf.cast(floor, tf.int32), 0, in_size - 1)
    upper = tf.minimum(tf.cast(tf.math.ceil(position), tf.int32), in_size - 1)
    return lower, upper, position - floor


def _resized_window(image: tf.Tensor, height, width, top, left, size: int) -> tf.Tensor:
    """`_resize(image, height, width)[top:top + size, left:left + size]`, computed without
    the rest of the resized image: each output pixel reads its 4 source pixels."""
    in_height, in_width = tf.unstack(tf.shape(image)[:2])
    offsets = tf.range(size)
    row_lower, row_upper, row_fraction = _interpolation(top + offsets, in_height, height)
    column_lower, column_upper, column_fraction = _interpolation(left + offsets, in_width, width)

    def pixels(rows: tf.Tensor, columns: tf.Tensor) -> tf.Tensor:
        grid = tf.stack(tf.meshgrid(rows, columns, indexing="ij"), axis=-1)
        return tf.cast(tf.gather_nd(image, grid), tf.float32)

    top_left, top_right = pixels(row_lower, column_lower), pixels(row_lower, column_upper)
    bottom_left = pixels(row_upper, column_lower)
    bottom_right = pixels(row_upper, column_upper)
    # ResizeBilinear's `compute_lerp`, in its order: rows first, then columns.
    column_fraction = column_fraction[None, :, None]
    upper_row = top_left + (top_right - top_left) * column_fraction
    lower_row = bottom_left + (bottom_right - bottom_left) * column_fraction
    return upper_row + (lower_row - upper_row) * row_fraction[:, None, None]


def resized_crops(image: tf.Tensor, shorter_side: int, size: int, corners: bool = False):
    """float32 [1, size, size, C], the centre of `image` resized (bilinear) to a shorter
    side of `shorter_side`; with `corners` [5, ...], then top-left, top-right,
    bottom-left, bottom-right. An image longer than `MAX_WHOLE_RESIZE_ASPECT` (a
    1x4000 strip would resize to 3 GB) has only its crops' windows computed."""
    height, width = _resized_shape(image, shorter_side)
    bottom, right = height - size, width - size
    origins = [(bottom // 2, right // 2)]
    if corners:
        origins += [(0, 0), (0, right), (bottom, 0), (bottom, right)]

    def whole() -> tf.Tensor:
        resized = _resize(image, height, width)
        crops = [resized[top : top + size, left : left + size] for top, left in origins]
        return tf.ensure_shape(tf.stack(crops), [len(origins), size, size, image.shape[-1]])

    def windows() -> tf.Tensor:
        crops = [_resized_window(image, height, width, *origin, size) for origin in origins]
        return tf.ensure_shape(tf.stack(crops), [len(origins), size, size, image.shape[-1]])

    ordinary = tf.maximum(height, width) <= MAX_WHOLE_RESIZE_ASPECT * tf.minimum(height, width)
    return tf.cond(ordinary, whole, windows)


def imagenet_eval(
    image: tf.Tensor, config: Preprocessing, encoded: bool = False, corners: bool = False
) -> tf.Tensor:
    """The central crop of an image (pixels, or bytes when `encoded`) resized to a shorter
    side of `eval_resize`, in `config.dtype`; with `corners` also the corners."""
    if encoded:
        image = decode_image(image, config.channels)
    size = config.eval_size
    crops = resized_crops(image, config.eval_resize, size, corners)
    crops = [_finish(normalize(crop, config), config, size) for crop in tf.unstack(crops)]
    return tf.stack(crops) if corners else crops[0]


def imagenet_eval_crops(image: tf.Tensor, config: Preprocessing, encoded: bool = False):
    """Multi-crop evaluation's five crops (`imagenet_eval` with corners); with the flips
    the evaluation step adds, Krizhevsky et al. 2012's 10 crops."""
    return imagenet_eval(image, config, encoded, corners=True)


def resize_only(image: tf.Tensor, config: Preprocessing, encoded: bool = False) -> tf.Tensor:
    """A CIFAR-family file's image (decoded if `encoded`) at the output size: resized
    (bilinear) if it differs, rounded to uint8 pixels."""
    if encoded:
        image = decode_image(image, config.channels)
    size = config.image_size
    shape = tf.shape(image)
    same = tf.logical_and(tf.equal(shape[0], size), tf.equal(shape[1], size))
    resized = tf.cond(same, lambda: tf.cast(image, tf.float32), lambda: _resize(image, size, size))
    # Round back to the 0-255 grid so that both branches give the same dtype.
    return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)
