"""Test-time augmentation: a prediction averaged over several views of each image.

- "flip": the image and its horizontal mirror (2 views);
- "crops": the centre and four corner crops (made by the pipeline,
  `InputPipeline.eval_dataset(crops=True)`) and their mirrors, 10 views
  (Krizhevsky et al. 2012, section 4.1).

The views are averaged as probabilities, not logits, and handed on as
log mean softmax: logits whose softmax, arg-max and cross-entropy are those of
the average. The names and `check_mode` need no TensorFlow (a command checks
`--tta` before importing it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tensorflow as tf

FLIP = "flip"
CROPS = "crops"
MODES = (FLIP, CROPS)
CROPS_PER_IMAGE = 5  # Centre and four corners; `preprocessing.imagenet_eval_crops`.


def check_mode(tta: str | None) -> str | None:
    """`tta` when it is None or one of `MODES`; ValueError otherwise."""
    if tta is not None and tta not in MODES:
        raise ValueError(f"unknown test-time augmentation {tta!r}; use one of {MODES}")
    return tta


def view_logits(model: tf.keras.Model, images: tf.Tensor, tta: str | None) -> tf.Tensor:
    """float32 [views, batch, classes]: the model's logits on every view, in one call.

    `images` is [batch, size, size, 3], for "crops" [batch, 5, size, size, 3].
    """
    import tensorflow as tf

    if tta is None:
        return tf.cast(model(images, training=False), tf.float32)[None]
    if tta == CROPS:
        # [batch, 5, ...] -> [5 * batch, ...], crop-major: logits reshape to [views, batch, ...].
        images = tf.reshape(tf.transpose(images, [1, 0, 2, 3, 4]), [-1, *images.shape[2:]])
    # NHWC: axis 2 is the width; reversing it mirrors left and right.
    both = tf.concat([images, tf.reverse(images, axis=[2])], axis=0)
    logits = tf.cast(model(both, training=False), tf.float32)
    views = 2 * CROPS_PER_IMAGE if tta == CROPS else 2  # Flip: the image and its mirror.
    return tf.reshape(logits, [views, -1, logits.shape[-1]])


def mean_probability_logits(logits: tf.Tensor, temperature: float = 1.0) -> tf.Tensor:
    """[batch, classes]: log of the mean over views of softmax(`view_logits` / temperature).

    A single view is returned as its logits / T, unchanged at T = 1 (so the
    trainer's evaluation is exactly that of the plain model).
    """
    import tensorflow as tf

    views = logits.shape[0]
    if temperature != 1.0:
        logits = logits / temperature
    if views == 1:
        return logits[0]
    log_probabilities = tf.nn.log_softmax(logits, axis=-1)
    return tf.reduce_logsumexp(log_probabilities, axis=0) - math.log(views)
