"""The fused-kernel BatchNorm against Keras's own layer (the reference)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from resnet_app.nets.batch_norm import BatchNorm
from resnet_app.nets.factory import dtype_policy


def _pair(shape, **kwargs):
    """Our layer and Keras's, built alike, with non-trivial parameters and statistics."""
    layers = [BatchNorm(**kwargs), keras.layers.BatchNormalization(**kwargs)]
    for layer in layers:
        layer.build(shape)
        layer.gamma.assign(np.linspace(0.5, 2.0, shape[-1]))
        layer.beta.assign(np.linspace(-1.0, 1.0, shape[-1]))
        layer.moving_mean.assign(np.linspace(-0.3, 0.3, shape[-1]))
        layer.moving_variance.assign(np.linspace(0.5, 1.5, shape[-1]))
    return layers


def _run(layer, images, training):
    with tf.GradientTape() as tape:
        tape.watch(images)
        outputs = layer(images, training=training)
        loss = tf.reduce_sum(tf.cast(outputs, tf.float32) ** 2)
    grads = tape.gradient(loss, [images, layer.gamma, layer.beta])
    return [tf.cast(t, tf.float32).numpy() for t in (outputs, *grads)], [
        layer.moving_mean.numpy(),
        layer.moving_variance.numpy(),
    ]


@pytest.mark.parametrize("training", [True, False])
def test_matches_keras_in_float32(training):
    images = tf.constant(np.random.default_rng(0).normal(2, 3, (8, 5, 5, 6)), tf.float32)
    ours, keras_layer = _pair(images.shape, momentum=0.9, epsilon=1e-3)
    (outputs, *grads), stats = _run(ours, images, training)
    (expected_outputs, *expected_grads), expected_stats = _run(keras_layer, images, training)
    np.testing.assert_allclose(outputs, expected_outputs, rtol=1e-5, atol=1e-5)
    for grad, expected in zip(grads, expected_grads):
        np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-4)
    # The moving variance follows the biased batch variance, as Keras's does.
    for stat, expected in zip(stats, expected_stats):
        np.testing.assert_allclose(stat, expected, rtol=1e-6, atol=1e-6)
    if training:  # And it moved: the comparison means something.
        assert not np.allclose(stats[1], np.linspace(0.5, 1.5, 6))


def test_matches_keras_in_mixed_bfloat16():
    images = np.random.default_rng(1).normal(2, 3, (8, 5, 5, 6)).astype(np.float32)
    with dtype_policy("mixed_bfloat16"):
        ours, keras_layer = _pair((8, 5, 5, 6), momentum=0.9)
    images = tf.cast(images, tf.bfloat16)
    (outputs, *_), stats = _run(ours, images, True)
    (expected_outputs, *_), expected_stats = _run(keras_layer, images, True)
    assert ours(images, training=True).dtype == tf.bfloat16
    np.testing.assert_allclose(outputs, expected_outputs, rtol=2e-2, atol=2e-2)
    for stat, expected in zip(stats, expected_stats):
        np.testing.assert_allclose(stat, expected, rtol=1e-5, atol=1e-5)


def test_synchronized_statistics_take_keras_path(monkeypatch):
    calls = []
    monkeypatch.setattr(tf.compat.v1.nn, "fused_batch_norm", lambda *a, **k: calls.append(1))
    layer = BatchNorm(synchronized=True)
    layer.build((2, 3, 3, 4))
    layer(tf.ones((2, 3, 3, 4)), training=True)
    assert calls == []


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_inference_is_the_closed_form_on_the_moving_statistics(policy):
    shape, epsilon = (4, 3, 3, 5), 1e-3
    images = np.random.default_rng(2).normal(1, 2, shape).astype(np.float32)
    with dtype_policy(policy):
        ours, _ = _pair(shape, epsilon=epsilon)
    compute = tf.bfloat16 if policy == "mixed_bfloat16" else tf.float32
    inputs = tf.cast(images, compute)
    outputs = ours(inputs, training=False)
    assert outputs.dtype == compute
    x = tf.cast(inputs, tf.float32).numpy().astype(np.float64)  # What the layer was given.
    mean, variance = np.linspace(-0.3, 0.3, 5), np.linspace(0.5, 1.5, 5)
    gamma, beta = np.linspace(0.5, 2.0, 5), np.linspace(-1.0, 1.0, 5)
    expected = (x - mean) / np.sqrt(variance + epsilon) * gamma + beta
    tolerance = 2e-2 if policy == "mixed_bfloat16" else 1e-5
    got = tf.cast(outputs, tf.float32).numpy()
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)
    # A frozen layer in training mode normalizes with the same moving statistics.
    ours.trainable = False
    frozen = tf.cast(ours(inputs, training=True), tf.float32).numpy()
    np.testing.assert_allclose(frozen, expected, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(ours.moving_mean.numpy(), mean, rtol=0, atol=1e-7)


def test_inference_runs_the_fused_kernel(monkeypatch):
    calls = []
    fused = tf.compat.v1.nn.fused_batch_norm

    def spy(*args, **kwargs):
        calls.append(kwargs["is_training"])
        return fused(*args, **kwargs)

    monkeypatch.setattr(tf.compat.v1.nn, "fused_batch_norm", spy)
    layer, _ = _pair((2, 3, 3, 4))
    layer(tf.ones((2, 3, 3, 4)), training=False)
    layer(tf.ones((2, 3, 3, 4)))  # Keras's default: inference.
    assert calls == [False, False]
