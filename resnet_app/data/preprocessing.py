"""Per-example image preprocessing: the CIFAR and the ImageNet recipes.

Every random choice is a stateless op driven by an explicit `seed` tensor of
shape [2], so that an example's augmentation is a function of (run seed, epoch,
example id) and a resumed run redraws exactly what the interrupted one would
have drawn. The seeds come from `data/seeds.py`, through the input pipeline
(`data/input_pipeline.py`).

Two families:
- CIFAR (He et al. 2015, section 4.2): per-channel mean/std normalization; for
  training, pad 4 pixels (with zeros after normalization, i.e. the mean colour),
  take a random crop of the original size and flip horizontally at random.
- ImageNet (Szegedy et al. 2015 crops, as in every ResNet reference since):
  for training, a random crop of 8-100% of the area with aspect ratio 3/4-4/3,
  resized to the output size, and a random flip; for evaluation, the shorter
  side is resized to 256 and the central 224x224 is kept (for another output
  size S, the shorter side goes to S / 0.875). JPEG bytes are decoded only
  inside the crop window (`decode_and_crop_jpeg`), which is much cheaper.
  Multi-crop evaluation (`evaluate --tta=crops`) takes the centre and the four
  corners of the same resized image (`imagenet_eval_crops`). An image longer
  than 4:1 is not resized whole: only its crops' pixels are computed, by the
  same arithmetic (`resized_crops`), so a 1x4000 strip costs what a square
  image does instead of gigabytes.

Optional, for training only, both off by default (`data/randaugment.py`):
RandAugment, TrivialAugment, AutoAugment or AugMix (`data/trivialaugment.py`,
`data/autoaugment.py`, `data/augmix.py`: the same ops) on the
uint8 pixels (CIFAR: on the whole image, before the pad-crop-flip,
AutoAugment's CIFAR order; ImageNet: on the resized crop after the flip,
rounded to the 0-255 grid, timm's order), and random erasing after
normalization (both: on the final image). Their random choices come from their
own seeds, folded from the example's seed, so the crop and flip draws are the
same with or without them.

Images enter as uint8 (decoded pixels, or encoded bytes for the ImageNet family)
and leave normalized, in the requested dtype.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import tensorflow as tf

from resnet_app.data import augment_draws, augmix, philox, randaugment
from resnet_app.data import channels as image_channels
from resnet_app.data.settings import AugmentSettings

# ImageNet's per-channel statistics on the 0-255 scale, the usual constants.
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)
# Evaluation resizes an image whole, as it always has, up to this aspect ratio
# (longer side over shorter: 256 x 1024 floats, 3 MB, for the usual 256);
# beyond it, only the crops' windows of the resized image are computed.
MAX_WHOLE_RESIZE_ASPECT = 4


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """Resolved preprocessing parameters; `InputPipeline` fills them from the config.

    Attributes:
      family: "cifar" or "imagenet".
      image_size: output height and width.
      mean: per-channel mean on the 0-255 scale.
      std: per-channel standard deviation on the 0-255 scale.
      dtype: output dtype name ("float32", "bfloat16" or "float16").
      eval_resize: ImageNet family: the shorter side before the central crop.
      eval_image_size: ImageNet family: the evaluation's crop size, when it
        differs from `image_size` (None: the same); see `eval_size`.
      augment: the training augmentation, as the config's `data.augment`.
    """

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
    image = tf.cast(image, tf.float32)
    mean = tf.constant(config.mean, tf.float32)
    std = tf.constant(config.std, tf.float32)
    return (image - mean) / std


def _finish(image: tf.Tensor, config: Preprocessing, size: int | None = None) -> tf.Tensor:
    """The image checked to be `size` (default: the training size) square, in the output dtype."""
    size = size or config.image_size
    image = tf.ensure_shape(image, [size, size, config.channels])
    return tf.cast(image, config.dtype)


def decode_image(encoded: tf.Tensor, channels: int | None = image_channels.RGB) -> tf.Tensor:
    """Decodes JPEG, PNG, BMP or GIF (its first frame) bytes to uint8 pixels.

    The format is read from the bytes, never from a file name, so a PNG saved
    as `.jpg` decodes. Images of the other kind are converted to `channels`
    (`data/channels.py`: grey to RGB, RGB to luma, alpha dropped); None
    keeps the file's own channels (1 to 4).
    """
    if channels == image_channels.RGB:
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        return tf.ensure_shape(image, [None, None, 3])
    image = tf.io.decode_image(encoded, channels=0, expand_animations=False)
    if channels is None:
        return tf.ensure_shape(image, [None, None, None])
    return image_channels.convert(tf.ensure_shape(image, [None, None, None]), channels)


def _resize(image: tf.Tensor, height: tf.Tensor, width: tf.Tensor) -> tf.Tensor:
    return tf.image.resize(tf.cast(image, tf.float32), tf.stack([height, width]))


def cifar_choices(seed: tf.Tensor, config: Preprocessing) -> tf.Tensor:
    """One example's random choices for the CIFAR recipe: [top, left, flip].

    Args:
      seed: int [2], this example's stateless seed.
      config: the parameters.

    Returns:
      int32 [3]: the crop's top and left in the padded image (0 to 2 * padding)
      and whether to flip (0 or 1; always 0 without `config.augment.flip`).
    """
    return _choices_of(tf.random.stateless_uniform([3], seed), config)


def cifar_choices_rows(seeds: tf.Tensor, config: Preprocessing) -> tf.Tensor:
    """`cifar_choices` of a batch of seeds (int64 [batch, 2]) at once: int32 [batch, 3]."""
    return _choices_of(philox.uniform_rows(seeds, 3), config)


def _choices_of(uniform: tf.Tensor, config: Preprocessing) -> tf.Tensor:
    positions = 2 * config.augment.crop_padding + 1
    scale = tf.constant([positions, positions, 2 if config.augment.flip else 1], tf.float32)
    return tf.cast(tf.floor(uniform * scale), tf.int32)


def cutout(images: tf.Tensor, corners: tf.Tensor, config: Preprocessing) -> tf.Tensor:
    """Sets each normalized image's Cutout square to 0 (the mean colour).

    Args:
      images: float32 [batch, size, size, 3], normalized.
      corners: int32 [batch, 2], the squares' top and left (`augment_choices`).
      config: the parameters (`augment.cutout_size`, the square's side).
    """
    side = tf.fill(tf.shape(corners[:, :1]), min(config.augment.cutout_size, config.image_size))
    boxes = tf.concat([corners, side, side], axis=1)
    return randaugment.erase_batch(images, boxes, tf.zeros_like(images))


def _in_rgb(augment):
    """`augment` (RandAugment, on RGB pixels [..., 3]) for images of either kind.

    A greyscale image goes through as RGB, its grey in all three channels,
    and comes back as its first channel: every op treats the three alike
    (Color's blend with the luma is the identity on grey), so that is the op
    on the grey image itself.
    """

    def on_pixels(images, *args):
        if images.shape[-1] == image_channels.RGB:
            return augment(images, *args)
        *rest, fill = args
        rgb = augment(image_channels.convert(images, image_channels.RGB), *rest, fill * 3)
        return rgb[..., :1]

    return on_pixels


def _fill(config: Preprocessing) -> tuple[int, ...]:
    # Geometric ops fill with the mean colour: about 0 once normalized.
    return tuple(min(255, max(0, round(value))) for value in config.mean)


def erase_boxes(erase_draws: tf.Tensor, config: Preprocessing) -> tf.Tensor:
    """int32 [batch, 4]: the boxes (top, left, height, width) of `augment_choices`' draws."""
    size, area, aspect = (
        config.image_size,
        config.augment.erase_area_range,
        config.augment.erase_aspect_range,
    )
    return randaugment.erase_boxes(
        erase_draws, size, size, config.augment.erase_probability, area, aspect
    )


def cifar_augment(image: tf.Tensor, seed: tf.Tensor, config: Preprocessing) -> dict:
    """One example's part of the CIFAR recipe, before batching: its draws.

    Args:
      image: uint8 [size, size, 3].
      seed: int [2], this example's stateless seed.
      config: the parameters.

    Returns:
      {"image", "choices": `cifar_choices`} and `augment_choices`: with a batch
      dimension, the arguments of `cifar_train_batch`.
    """
    draws = augment_draws.augment_choices(seed, config)
    return {"image": image, "choices": cifar_choices(seed, config), **draws}


def _op_policy(images: tf.Tensor, augment: dict, config: Preprocessing) -> tf.Tensor:
    """The op policy that is on (RandAugment, TrivialAugment, AutoAugment, AugMix)
    on uint8 [batch, H, W, C] images, by each image's draws; with AugMix's
    consistency loss, [batch, 3, H, W, C] (`augmix.views`)."""
    if config.augment.auto_augment == "augmix":
        draws = {key: augment[key] for key in augmix.FEATURES}
        return augmix.views(images, draws, _fill(config), _in_rgb(augmix.mix))
    if (ranges := augment_draws.op_ranges(config)) is None:
        return images
    return _in_rgb(functools.partial(randaugment.randaugment_batch, ranges=ranges))(
        images,
        augment["op_indices"],
        augment["op_signs"],
        augment.get("op_magnitudes", config.augment.randaugment_magnitude),
        _fill(config),
    )


def _spread_views(images: tf.Tensor, draws: dict, views: int) -> tuple[tf.Tensor, dict]:
    """[batch, views, ...] images as [batch * views, ...], each example's draws repeated
    for its views: every view is cropped, flipped, cut out and erased alike."""
    images = tf.reshape(images, tf.concat([[-1], tf.shape(images)[2:]], axis=0))
    return images, {key: tf.repeat(value, views, axis=0) for key, value in draws.items()}


def _gather_views(images: tf.Tensor, views: int) -> tf.Tensor:
    """[batch * views, ...] back to [batch, views, ...] (one view: as it is)."""
    if views == 1:
        return images
    return tf.reshape(images, tf.concat([[-1, views], tf.shape(images)[1:]], axis=0))


def cifar_train_batch(
    images: tf.Tensor, choices: tf.Tensor, config: Preprocessing, **augment: tf.Tensor
) -> tf.Tensor:
    """The op policy, normalize, pad, crop, flip, erase a batch, each image by its own draws.

    Working on whole batches keeps the per-example work in the input pipeline
    to drawing a few numbers, which matters on machines with few cores.

    Args:
      images: uint8 [batch, size, size, 3].
      choices: int32 [batch, 3] from `cifar_choices`.
      config: the parameters.
      **augment: the batched `augment_choices` of the options that are on.

    Returns:
      [batch, size, size, 3] in `config.dtype`; with AugMix's consistency
      loss, [batch, 3, size, size, 3], each example's views.
    """
    views = config.augment.views
    images = _op_policy(images, augment, config)
    if views > 1:
        per_example = ("cutout_corner", "erase_draws", "erase_noise")
        draws = {key: augment[key] for key in per_example if key in augment}
        images, draws = _spread_views(images, {"choices": choices, **draws}, views)
        choices = draws.pop("choices")
        augment = {**augment, **draws}
    crops = _crop_normalized(images, choices, config)
    if config.augment.cutout_size:
        crops = cutout(crops, augment["cutout_corner"], config)
    if config.augment.erase_probability:
        boxes = erase_boxes(augment["erase_draws"], config)
        crops = randaugment.erase_batch(crops, boxes, augment["erase_noise"])
    return tf.cast(_gather_views(crops, views), config.dtype)


def _crop_normalized(images: tf.Tensor, choices: tf.Tensor, config: Preprocessing) -> tf.Tensor:
    """Each image's crop of itself padded by `crop_padding` with the mean colour, flipped
    by its choice, normalized: float32 [batch, size, size, channels].

    The crop is taken from the pixels as they are (uint8: a quarter of float32's
    bytes) and normalized after; the window's rows and columns outside the
    image read its edge and are then set to 0, which is the normalized mean colour.
    """
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


def cifar_train(image: tf.Tensor, seed: tf.Tensor, config: Preprocessing) -> tf.Tensor:
    """The CIFAR training recipe on one decoded image.

    The same arithmetic as the pipeline's per-example (`cifar_augment`) and
    batched (`cifar_train_batch`) parts, on a batch of one; with AugMix's
    consistency loss, [3, image_size, image_size, 3], the example's views.

    Args:
      image: uint8 [H, W, 3] with H = W = `config.image_size`.
      seed: int [2], this example's stateless seed.
      config: the parameters.

    Returns:
      [image_size, image_size, 3] in `config.dtype`; with AugMix's consistency
      loss, [3, image_size, image_size, 3], the example's views.
    """
    features = {key: value[None] for key, value in cifar_augment(image, seed, config).items()}
    return cifar_train_batch(features.pop("image"), features.pop("choices"), config, **features)[0]


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
    """Random-resized crop and random flip of one image (then RandAugment and erasing, if on).

    Args:
      image: uint8 [H, W, 3] pixels, or a scalar string of encoded bytes when
        `encoded`. JPEG bytes are decoded inside the crop window only.
      seed: int [2], this example's stateless seed.
      config: the parameters.
      encoded: whether `image` holds encoded bytes.

    Returns:
      [image_size, image_size, 3] in `config.dtype`; with AugMix's
      consistency loss, [3, image_size, image_size, 3], the example's views.
    """
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
    augment = augment_draws.augment_choices(seed, config)
    views = config.augment.views  # One, or AugMix's three.
    if augment_draws.op_ranges(config) is not None or config.augment.auto_augment == "augmix":
        pixels = tf.cast(tf.clip_by_value(tf.round(crop), 0, 255), tf.uint8)
        batched = {key: value[None] for key, value in augment.items()}
        augmented = tf.cast(_op_policy(pixels[None], batched, config)[0], tf.float32)
        # AugMix's views: the first is the crop as the recipe without them leaves it.
        crop = augmented if views == 1 else tf.concat([crop[None], augmented[1:]], axis=0)
    # The example's views as a batch.
    images = normalize(crop if views > 1 else crop[None], config)
    if config.augment.cutout_size:
        corners = tf.repeat(augment["cutout_corner"][None], views, axis=0)
        images = cutout(images, corners, config)
    if config.augment.erase_probability:
        boxes = tf.repeat(erase_boxes(augment["erase_draws"][None], config), views, axis=0)
        noise = tf.repeat(augment["erase_noise"][None], views, axis=0)
        images = tf.cond(  # Most images are not erased.
            boxes[0, 2] > 0, lambda: randaugment.erase_batch(images, boxes, noise), lambda: images
        )
    if views == 1:
        return _finish(images[0], config)
    size = config.image_size
    return tf.cast(tf.ensure_shape(images, [views, size, size, config.channels]), config.dtype)


def _resized_shape(image: tf.Tensor, shorter_side: int) -> list[tf.Tensor]:
    """[height, width] (int32) of `image` resized so that its shorter side is `shorter_side`.

    A longer side beyond 2**30 (an image over a million times longer than
    wide, at 256) is capped there, where int32 sizes would overflow: that
    image is squeezed, rather than the evaluation stopped.
    """
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = shorter_side / tf.reduce_min(shape)
    return tf.unstack(tf.cast(tf.minimum(tf.round(shape * scale), 2.0**30), tf.int32))


def _interpolation(
    out_indices: tf.Tensor, in_size: tf.Tensor, out_size: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Bilinear resizing's source pixels and weights along one axis, for some output pixels.

    TensorFlow's own arithmetic (`ResizeBilinear` with half-pixel centres), op
    for op in float32: source position (i + 0.5) * in/out - 0.5, its floor
    and ceiling clamped to the image, and the fraction between them.

    Returns:
      (lower, upper, fraction): int32, int32, float32, shaped like `out_indices`.
    """
    scale = tf.cast(in_size, tf.float32) / tf.cast(out_size, tf.float32)
    position = (tf.cast(out_indices, tf.float32) + 0.5) * scale - 0.5
    floor = tf.floor(position)
    # Clamped on both sides: float32 can round a position of a side longer
    # than 2**24 up to the side itself.
    lower = tf.clip_by_value(tf.cast(floor, tf.int32), 0, in_size - 1)
    upper = tf.minimum(tf.cast(tf.math.ceil(position), tf.int32), in_size - 1)
    return lower, upper, position - floor


def _resized_window(
    image: tf.Tensor,
    height: tf.Tensor,
    width: tf.Tensor,
    top: tf.Tensor,
    left: tf.Tensor,
    size: int,
) -> tf.Tensor:
    """The `size` x `size` window at (top, left) of `image` resized to height x width.

    The same pixels as `_resize(image, height, width)[top:top + size, left:left + size]`,
    computed without the rest of the resized image: each output pixel reads
    its 4 source pixels (`tf.gather_nd`), so memory is a few windows' worth
    whatever the image's shape.
    """
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


def resized_crops(
    image: tf.Tensor, shorter_side: int, size: int, corners: bool = False
) -> tf.Tensor:
    """Crops of `image` resized (bilinear) so that its shorter side is `shorter_side`.

    An image up to `MAX_WHOLE_RESIZE_ASPECT` is resized whole and cropped,
    as evaluation always did; a longer one (a 1x4000 strip resizes to
    256x1,024,000: 3 GB of float32) has only its crops' windows computed,
    pixel for pixel the same arithmetic (`_resized_window`), so its memory is
    that of the crops.

    Args:
      image: uint8 [H, W, 3] pixels.
      shorter_side: the resized image's shorter side (at least `size`).
      size: the crops' height and width.
      corners: also the four corners, after the centre.

    Returns:
      float32 [1, size, size, 3], the central crop; with `corners`, [5, size,
      size, 3]: centre, top-left, top-right, bottom-left, bottom-right.
    """
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


def imagenet_eval(image: tf.Tensor, config: Preprocessing, encoded: bool = False) -> tf.Tensor:
    """Resize the shorter side to `eval_resize`, then crop the centre (`resized_crops`).

    Args:
      image: uint8 [H, W, 3] pixels, or encoded bytes when `encoded`.
      config: the parameters.
      encoded: whether `image` holds encoded bytes.

    Returns:
      [eval_size, eval_size, 3] in `config.dtype`.
    """
    if encoded:
        image = decode_image(image, config.channels)
    size = config.eval_size
    crop = resized_crops(image, config.eval_resize, size)[0]
    return _finish(normalize(crop, config), config, size)


def imagenet_eval_crops(
    image: tf.Tensor, config: Preprocessing, encoded: bool = False
) -> tf.Tensor:
    """The five crops of multi-crop evaluation: the centre, then the four corners.

    The image is resized as for `imagenet_eval` (so the first crop is its
    output); with their horizontal flips, which the evaluation step adds, these
    are the 10 crops of Krizhevsky et al. 2012.

    Args:
      image: uint8 [H, W, 3] pixels, or encoded bytes when `encoded`.
      config: the parameters.
      encoded: whether `image` holds encoded bytes.

    Returns:
      [5, eval_size, eval_size, 3] in `config.dtype`: centre, top-left,
      top-right, bottom-left, bottom-right.
    """
    if encoded:
        image = decode_image(image, config.channels)
    size = config.eval_size
    crops = resized_crops(image, config.eval_resize, size, corners=True)
    return tf.stack([_finish(normalize(crop, config), config, size) for crop in tf.unstack(crops)])


def resize_only(image: tf.Tensor, config: Preprocessing, encoded: bool = False) -> tf.Tensor:
    """Decodes if needed and resizes to the output size, for CIFAR-family files.

    Small images read from files (a folder of 32x32 PNGs, say) may not all have
    the configured size; they are resized, then treated as decoded pixels.
    """
    if encoded:
        image = decode_image(image, config.channels)
    size = config.image_size
    shape = tf.shape(image)
    same = tf.logical_and(tf.equal(shape[0], size), tf.equal(shape[1], size))
    resized = tf.cond(
        same,
        lambda: tf.cast(image, tf.float32),
        lambda: _resize(image, size, size),
    )
    # Round back to the 0-255 grid so that both branches give the same dtype.
    return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)
