"""Grad-CAM (Selvaraju et al. 2017): which parts of an image a class's score came from.

The map is ReLU(sum_k alpha_k A_k): A is the last stage's output (the model's
last hidden state) and alpha_k the mean over positions of d score / d A_k,
scaled to [0, 1] per image. Behind ResNet's global average pool and one dense
layer, alpha_k is the class's weight of channel k over the number of
positions, so the map is also the class activation map of Zhou et al. 2016.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from resnet_app.evaluation.gallery import resized

# A blue-cyan-yellow-red scale for the heat, from 0 to 1.
_COLORS = np.array([[0, 0, 140], [0, 90, 255], [0, 230, 230], [250, 240, 0], [230, 20, 0]], float)


def activations_and_gradients(
    model: tf.keras.Model, images: np.ndarray, classes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """float32 [batch, h, w, channels] each: the last stage's output and the gradient of
    each image's logit of its class in `classes` with respect to it."""
    with tf.GradientTape() as tape:
        logits, hidden = model(tf.constant(images), training=False, return_hidden=True)
        score = tf.reduce_sum(tf.gather(tf.cast(logits, tf.float32), classes, batch_dims=1))
    gradients = tape.gradient(score, hidden[-1])
    return hidden[-1].numpy().astype(np.float32), gradients.numpy().astype(np.float32)


def maps(activations: np.ndarray, gradients: np.ndarray) -> np.ndarray:
    """float64 [batch, h, w] in [0, 1]: Grad-CAM of each image (0 where no channel counts)."""
    weights = gradients.astype(np.float64).mean(axis=(1, 2))
    heat = np.maximum(np.einsum("bhwk,bk->bhw", activations.astype(np.float64), weights), 0.0)
    peak = heat.max(axis=(1, 2), keepdims=True)
    return np.divide(heat, peak, out=np.zeros_like(heat), where=peak > 0)


def overlay(pixels: np.ndarray, heat: np.ndarray, size: int) -> np.ndarray:
    """uint8 [batch, size, size, 3]: each image (grey shown as grey) half covered by its
    heat map, smoothly scaled up from the last stage's resolution."""
    images = resized(pixels, size)
    if images.shape[-1] == 1:
        images = np.repeat(images, 3, axis=-1)
    heat = tf.image.resize(heat[..., None], [size, size], method="bilinear").numpy()[..., 0]
    anchors = np.linspace(0.0, 1.0, len(_COLORS))
    color = np.stack([np.interp(heat, anchors, _COLORS[:, c]) for c in range(3)], axis=-1)
    return np.clip(np.rint(0.5 * images + 0.5 * color), 0, 255).astype(np.uint8)
