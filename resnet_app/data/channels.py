"""Greyscale or RGB: images brought to the network's number of input channels.

A run's images have one channel count (`data.channels`; by default 1 when every training
image is greyscale). Other images are converted the same way wherever they come from:
grey to RGB repeats the grey value; RGB to grey is the ITU-R 601-2 luma in PIL's
fixed-point arithmetic ((19595 R + 38470 G + 7471 B + 2**15) >> 16), which is what PIL's
`convert("L")` and torchvision's `Grayscale` give and maps a grey image converted to RGB
back to itself; an alpha channel is dropped. `convert` takes tensors, `convert_array`
NumPy arrays. No TensorFlow at module level.
"""

from __future__ import annotations

import numpy as np

GREY, RGB = 1, 3
LUMA_WEIGHTS = (19595, 38470, 7471)
_LUMA_SHIFT = 16


def name(channels: int) -> str:
    """ "greyscale" or "RGB", for messages and model_info.json."""
    return "greyscale" if channels == GREY else "RGB"


def native(channel_count: int) -> int:
    """The kind of an image with `channel_count` channels: GREY (1 or 2) or RGB (3 or 4)."""
    return GREY if channel_count <= 2 else RGB


def convert_array(images: np.ndarray, channels: int) -> np.ndarray:
    """uint8 [..., c] pixels (c from 1 to 4) as [..., channels]."""
    have = images.shape[-1]
    if native(have) == GREY:
        grey = images[..., :1]
        return grey if channels == GREY else np.repeat(grey, RGB, axis=-1)
    rgb = images[..., :3]
    if channels == RGB:
        return rgb
    weighted = rgb.astype(np.uint32) @ np.asarray(LUMA_WEIGHTS, np.uint32)
    return ((weighted + (1 << (_LUMA_SHIFT - 1))) >> _LUMA_SHIFT).astype(np.uint8)[..., None]


def convert(image, channels: int):
    """uint8 [..., c] tensor pixels (c from 1 to 4, known or not) as [..., channels]."""
    import tensorflow as tf

    image = tf.convert_to_tensor(image)
    have = image.shape[-1]
    if have == channels:
        return image

    def from_grey():
        grey = image[..., :1]
        return grey if channels == GREY else tf.repeat(grey, RGB, axis=-1)

    def from_rgb():
        rgb = image[..., :3]
        if channels == RGB:
            return rgb
        weighted = tf.reduce_sum(
            tf.cast(rgb, tf.int32) * tf.constant(LUMA_WEIGHTS, tf.int32), axis=-1, keepdims=True
        )
        shifted = tf.bitwise.right_shift(weighted + (1 << (_LUMA_SHIFT - 1)), _LUMA_SHIFT)
        return tf.cast(shifted, tf.uint8)

    if have is not None:
        converted = from_grey() if native(have) == GREY else from_rgb()
    else:
        converted = tf.cond(tf.shape(image)[-1] <= 2, from_grey, from_rgb)
    shape = image.shape[:-1].concatenate([channels])
    return tf.ensure_shape(converted, shape)
