"""Small image-file splits decoded once into memory, then read as in-memory pixels are.

A split of encoded images already held in memory (a folder's, a table's or a Hugging Face
dataset's) is decoded at start-up when the CIFAR recipe takes its images as they are: every
image `size` square, and all the pixels within `PIXEL_LIMIT_BYTES`. Each epoch then gathers
pixels instead of decoding every file again (on 2 cores every decode competes with the
step), and the batch-wise reading of `batches.py` applies. The pixels are the ones the
general pipeline decodes (`preprocessing.decode_image`), so the batches are the same bit
for bit.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from resnet_app.data import options, preprocessing
from resnet_app.data.sources import Split

PIXEL_LIMIT_BYTES = 1 << 30
BATCH = 1024  # Images decoded per step of the decoding pipeline.


def decoded(split: Split, size: int, channels: int) -> tuple[Split, str | None]:
    """(the split with its pixels in memory, or as it was; why not, None when decoded)."""
    if split.stream is not None:
        return split, "streamed from its files"
    if split.contents is None:
        return split, "files larger than data.in_memory_mb, read from disk"
    if split.num_examples * size * size * channels > PIXEL_LIMIT_BYTES:
        return split, f"pixels over {PIXEL_LIMIT_BYTES >> 20} MB"

    def decode(content):  # A blank in place of an image of another size, and its shape.
        image = preprocessing.decode_image(content, channels)
        shape = tf.shape(image)
        fits = tf.reduce_all(tf.equal(shape[:2], size))
        blank = tf.zeros([size, size, channels], tf.uint8)
        return tf.cond(fits, lambda: tf.reshape(image, tf.shape(blank)), lambda: blank), shape

    contents = tf.data.Dataset.from_tensor_slices(tf.constant(split.contents, tf.string))
    pixels = contents.map(decode, num_parallel_calls=options.parallel_calls(), deterministic=True)
    images, start = np.empty((split.num_examples, size, size, channels), np.uint8), 0
    try:
        for batch, shapes in pixels.batch(BATCH).as_numpy_iterator():
            other = np.flatnonzero((shapes[:, :2] != size).any(axis=1))
            if len(other):
                height, width = shapes[other[0], :2]
                return split, f"an image of {width}x{height} px, not {size}"
            images[start : start + len(batch)] = batch
            start += len(batch)
    except tf.errors.InvalidArgumentError:  # Skipped one at a time by the general pipeline.
        return split, "a file that does not decode"
    return dataclasses.replace(split, images=images, files=None, contents=None), None
