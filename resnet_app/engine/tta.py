"""Test-time augmentation: a prediction averaged over several views of each image.

Two kinds, named as `evaluate --tta` takes them:

- "flip": the image and its horizontal mirror (2 views), for any run;
- "crops": multi-crop evaluation (Krizhevsky et al. 2012, "ImageNet
  Classification with Deep Convolutional Neural Networks", section 4.1): the
  centre and the four corner crops of the image resized as for evaluation,
  and their mirrors (10 views). The pipeline makes the 5 crops
  (`InputPipeline.eval_dataset(crops=True)`); the mirrors are added here.

The views are averaged as probabilities, mean over views of softmax(logits),
not as logits. The evaluation step works on logits, so the average is handed
on as its logarithm, log mean softmax: a valid set of logits whose softmax is
the averaged probabilities, whose arg-max is their arg-max and whose
cross-entropy is their negative log-likelihood. Every view of a batch goes
through the model in one call (inference mode: each example is computed on
its own, whatever else is in the batch).

The names and `check_mode` need no TensorFlow (a command checks `--tta`
before paying for its import); the functions on tensors import it.
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
    """`tta` when it is None or one of `MODES`.

    Raises:
      ValueError: for any other value.
    """
    if tta is not None and tta not in MODES:
        raise ValueError(f"unknown test-time augmentation {tta!r}; use one of {MODES}")
    return tta


def num_views(tta: str | None) -> int:
    """Views averaged per example: 1 without TTA, 2 for flip, 10 for crops."""
    return {None: 1, FLIP: 2, CROPS: 2 * CROPS_PER_IMAGE}[check_mode(tta)]


def view_logits(model: tf.keras.Model, images: tf.Tensor, tta: str | None) -> tf.Tensor:
    """The model's float32 logits on every view of each image.

    Args:
      model: maps [n, size, size, 3] images to [n, classes] logits.
      images: [batch, size, size, 3]; for "crops" [batch, 5, size, size, 3].
      tta: None, "flip" or "crops".

    Returns:
      float32 [views, batch, classes].
    """
    import tensorflow as tf

    if tta is None:
        return tf.cast(model(images, training=False), tf.float32)[None]
    if tta == CROPS:
        # [batch, 5, ...] -> [5 * batch, ...], crop-major, so that the logits
        # reshape back to [views, batch, classes].
        images = tf.reshape(tf.transpose(images, [1, 0, 2, 3, 4]), [-1, *images.shape[2:]])
    # NHWC: axis 2 is the width; reversing it mirrors left and right.
    both = tf.concat([images, tf.reverse(images, axis=[2])], axis=0)
    logits = tf.cast(model(both, training=False), tf.float32)
    return tf.reshape(logits, [num_views(tta), -1, logits.shape[-1]])


def mean_probability_logits(logits: tf.Tensor, temperature: float = 1.0) -> tf.Tensor:
    """log of the mean over views of softmax(view logits / temperature).

    Args:
      logits: float32 [views, batch, classes], from `view_logits`.
      temperature: T > 0 dividing each view's logits before its softmax.

    Returns:
      float32 [batch, classes] logits whose softmax is the averaged
      probabilities. A single view is returned as its logits / T, unchanged
      at T = 1 (the trainer's evaluation is exactly what it was).
    """
    import tensorflow as tf

    views = logits.shape[0]
    if temperature != 1.0:
        logits = logits / temperature
    if views == 1:
        return logits[0]
    log_probabilities = tf.nn.log_softmax(logits, axis=-1)
    return tf.reduce_logsumexp(log_probabilities, axis=0) - math.log(views)
