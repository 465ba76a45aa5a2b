"""What a training split's images are: their size, kind and channel statistics, measured.

Data held as pixels (cifar10, idx, shapes) is measured whole. Data held as
encoded images (folders, CSV tables, TFRecords) is measured on a fixed
sample: `SAMPLE_IMAGES` images drawn with `SAMPLE_SEED` (the same images
whatever the run's seed, so the statistics are the dataset's, not the
run's), decoded as the pipeline decodes them. That takes about a second for
small images and a few for ImageNet's, however many files the split holds.
A split whose sampled images all have one square size has that size: the
pipeline still resizes any other image it meets, so a sample's claim cannot
break a run. Likewise a split whose sampled images are all greyscale is
greyscale (`data/channels.py`): a colour image met later is converted.
The statistics are those of the images as the run's channels give them
(grey repeated to RGB, or RGB as its luma).

`Facts.describe` says what was measured and on how many images, for the
start line; `run_pipeline` records the result in data_info.json, and a
resumed run reuses it rather than measuring again.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from resnet_app.common.errors import ConfigError
from resnet_app.data import channels as image_channels

SAMPLE_IMAGES = 1000
SAMPLE_SEED = 0
# Pixels per chunk of the in-memory measurement (memory-bounded float64 passes).
_CHUNK = 1 << 22


@dataclasses.dataclass(frozen=True)
class Facts:
    """A split's measured size and channel statistics.

    Attributes:
      size: the images' one square size, or None when they differ (or are
        not square).
      channels: the images' own kind: 1 when all are greyscale, else 3.
      mean: per-channel mean of the pixel values (0-255), at the channels
        asked for (default: `channels`).
      std: per-channel standard deviation over all pixels.
      measured: how many images were measured.
      total: how many the split holds.
      sizes: (smallest, largest) side seen, for the message when they vary.
    """

    size: int | None
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    measured: int
    total: int
    sizes: tuple[int, int]

    def describe(self) -> str:
        """E.g. "measured on 1,000 of 60,000 training images (a fixed sample)"."""
        if self.measured == self.total:
            return f"measured on all {self.total:,} training images"
        return f"measured on {self.measured:,} of {self.total:,} training images (a fixed sample)"


def channel_stats(
    images: np.ndarray, channels: int | None = None
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) per channel of uint8 [N, H, W, C] pixels, in float64.

    With `channels` (1 or 3), of the pixels converted to that many
    (`data/channels.py`), a chunk at a time: no converted copy of the whole.
    """
    pixels = images.reshape(-1, images.shape[-1])
    channels = channels or pixels.shape[1]

    def chunks():
        for start in range(0, len(pixels), _CHUNK):
            yield image_channels.convert_array(pixels[start : start + _CHUNK], channels)

    total = np.zeros(channels)
    for chunk in chunks():
        total += chunk.sum(axis=0, dtype=np.float64)
    mean = total / len(pixels)
    squares = np.zeros(channels)
    for chunk in chunks():
        centred = chunk.astype(np.float64) - mean
        squares += (centred * centred).sum(axis=0)
    return tuple(mean.tolist()), tuple(np.sqrt(squares / len(pixels)).tolist())


def measure(split, decode, channels: int | None = None) -> Facts:
    """The facts of a training split: whole when in memory, else on a fixed sample.

    Args:
      split: a `sources.Split`.
      decode: (encoded bytes, channels) -> uint8 [H, W, C] tensor (the
        pipeline's decoder); channels None keeps the file's own.
      channels: the statistics' channels, 1 or 3 (None: the images' own).

    Returns:
      The `Facts`.
    """
    if not split.encoded:
        images = split.images
        height, width = images.shape[1:3]
        kind = image_channels.native(images.shape[-1])
        mean, std = channel_stats(images, channels or kind)
        size = height if height == width else None
        return Facts(size, kind, mean, std, len(images), len(images), (min(height, width),) * 2)
    images = list(_sampled_images(split, lambda encoded: decode(encoded, None)))
    if not images:
        raise ConfigError(
            f"none of the sampled training images of split {split.name!r} decodes; check "
            "the files (JPEG, PNG, BMP or GIF)"
        )
    kinds = {image_channels.native(image.shape[-1]) for image in images}
    kind = image_channels.RGB if image_channels.RGB in kinds else image_channels.GREY
    converted = [image_channels.convert_array(image, channels or kind) for image in images]
    return _summarize(converted, kind, split.num_examples)


def _summarize(images: list[np.ndarray], kind: int, total: int) -> Facts:
    """The facts of decoded images of any sizes: statistics over all their pixels."""
    channels = images[0].shape[-1]
    sums, squares, count = np.zeros(channels), np.zeros(channels), 0
    for image in images:
        pixels = image.reshape(-1, channels).astype(np.float64)
        sums += pixels.sum(axis=0)
        squares += (pixels * pixels).sum(axis=0)
        count += len(pixels)
    mean = sums / count
    std = np.sqrt(np.maximum(squares / count - mean * mean, 0.0))
    shapes = {image.shape[:2] for image in images}
    sides = [side for shape in shapes for side in shape]
    (height, width), *others = sorted(shapes)
    size = height if not others and height == width else None
    return Facts(
        size,
        kind,
        tuple(mean.tolist()),
        tuple(std.tolist()),
        len(images),
        total,
        (min(sides), max(sides)),
    )


def _sampled_images(split, decode):
    """The decoded images of the fixed sample, as NumPy arrays."""
    import tensorflow as tf

    from resnet_app.data import options

    count = min(SAMPLE_IMAGES, split.num_examples)
    if split.indexed:
        chosen = np.random.default_rng(SAMPLE_SEED).permutation(split.num_examples)[:count]
        lookup = split.lookup()
        encoded = tf.data.Dataset.from_tensor_slices(np.sort(chosen)).map(
            lambda i: lookup(i)[0], num_parallel_calls=options.parallel_calls()
        )
    else:  # A stream: the first images of its seeded first epoch.
        stream = split.stream.training(SAMPLE_SEED, 0, 1, 0, buffer=SAMPLE_IMAGES)
        encoded = stream.take(count).map(lambda epoch, i, image, label: image)
    # An image that does not decode is skipped here as training skips it.
    images = encoded.map(decode, num_parallel_calls=options.parallel_calls()).ignore_errors()
    yield from images.as_numpy_iterator()
