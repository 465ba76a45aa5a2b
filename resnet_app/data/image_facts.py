"""What a training split's images are: their size, kind and channel statistics, measured.

Pixels in memory are measured whole; encoded images on a fixed sample (`SAMPLE_IMAGES`
drawn with `SAMPLE_SEED`, the same whatever the run's seed), decoded as the pipeline
decodes them. A sample whose images all have one square size gives the split that size,
and one whose images are all greyscale makes it greyscale: the pipeline still resizes or
converts any other image it meets. `run_pipeline` records the result in data_info.json,
and a resumed run reuses it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from resnet_app.common.errors import ConfigError
from resnet_app.data import channels as image_channels

SAMPLE_IMAGES = 1000
SAMPLE_SEED = 0
_CHUNK = 1 << 22  # Pixels per float64 pass over in-memory images.


@dataclasses.dataclass(frozen=True)
class Facts:
    """A split's measured facts: the images' one square size (None when they vary), their
    own kind (1 when all are greyscale, else 3), per-channel mean and std (0-255) at the
    channels asked for, images measured of the split's total, and (smallest, largest) side."""

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
    """(mean, std) per channel of uint8 [N, H, W, C] pixels in float64; with `channels`, of
    the pixels converted to that many, a chunk at a time (no converted copy of the whole)."""
    pixels = images.reshape(-1, images.shape[-1])
    channels = channels or pixels.shape[1]

    def chunks():
        for start in range(0, len(pixels), _CHUNK):
            yield image_channels.convert_array(pixels[start : start + _CHUNK], channels)

    zeros = np.zeros(channels)
    mean = sum((chunk.sum(axis=0, dtype=np.float64) for chunk in chunks()), zeros) / len(pixels)
    centred = (chunk.astype(np.float64) - mean for chunk in chunks())
    squares = sum(((values * values).sum(axis=0) for values in centred), zeros)
    return tuple(mean.tolist()), tuple(np.sqrt(squares / len(pixels)).tolist())


def measure(split, decode, channels: int | None = None) -> Facts:
    """The facts of a training split: whole when in memory, else on the fixed sample decoded
    by `decode(encoded, channels)`, the pipeline's decoder; `channels` (1, 3, or None: the
    images' own) are the statistics'."""
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
    stats = (tuple(mean.tolist()), tuple(std.tolist()))
    return Facts(size, kind, *stats, len(images), total, (min(sides), max(sides)))


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
