"""ResNet-9 (Page 2018): its parameter count written out, and its forward pass against NumPy;
Cutout against its definition."""

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common.errors import ConfigError
from resnet_app.nets import presets
from resnet_app.nets.resnet import create_model

# prep, layer1 (conv + 2 residual convs), layer2, layer3 (conv + 2), as (in, out).
CONVS = [(3, 64), (64, 128), (128, 128), (128, 128), (128, 256), (256, 512), (512, 512), (512, 512)]


def test_the_parameter_count_is_the_written_out_sum():
    convs = sum(9 * c_in * c_out for c_in, c_out in CONVS)  # 3x3, no bias.
    norms = sum(2 * c_out for _, c_out in CONVS)  # gamma, beta
    head = 512 * 10  # No bias.
    assert convs == 6_563_520
    model = create_model("resnet9")
    model.build((None, 32, 32, 3))
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    frozen = sum(int(np.prod(v.shape)) for v in model.non_trainable_variables)
    assert trainable == convs + norms + head == 6_573_120
    assert frozen == norms  # Moving mean and variance.
    assert presets.get_config("resnet9").depth == 9


def _conv(x, kernel):
    """3x3, stride 1, "same" zero padding: x [N, H, W, C], kernel [3, 3, C, K]."""
    padded = np.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)])
    height, width = x.shape[1:3]
    out = 0
    for i in range(3):
        for j in range(3):
            out = out + np.einsum(
                "nhwc,ck->nhwk", padded[:, i : i + height, j : j + width], kernel[i, j]
            )
    return out


def _norm(x, layer, epsilon):
    gamma, beta, mean, variance = (v.numpy().astype(np.float64) for v in layer.weights)
    return gamma * (x - mean) / np.sqrt(variance + epsilon) + beta


def _pool(x):
    n, h, w, c = x.shape
    return x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def test_the_forward_pass_is_pages_network_in_numpy():
    model = create_model("resnet9")
    model.build((None, 16, 16, 3))
    rng = np.random.default_rng(0)
    for variable in model.weights:  # Random statistics too, so BatchNorm is not the identity.
        values = rng.normal(0, 0.05, variable.shape)
        if "variance" in variable.path:
            values = rng.uniform(0.5, 1.5, variable.shape)
        elif "gamma" in variable.path:
            values = rng.uniform(0.8, 1.2, variable.shape)
        variable.assign(values.astype(np.float32))
    images = rng.normal(0, 1, (2, 16, 16, 3)).astype(np.float32)
    epsilon = presets.get_config("resnet9").bn_epsilon

    def conv_bn_relu(x, unit, number):
        conv, norm = getattr(unit, f"conv{number}"), getattr(unit, f"bn{number}")
        kernel = conv.kernel.numpy().astype(np.float64)
        return np.maximum(_norm(_conv(x, kernel), norm, epsilon), 0)

    x = images.astype(np.float64)
    stem_conv, stem_norm = model.stem_pairs[0]
    x = np.maximum(
        _norm(_conv(x, stem_conv.kernel.numpy().astype(np.float64)), stem_norm, epsilon), 0
    )
    for stage in model.stages:
        x = _pool(conv_bn_relu(x, stage[0], 1))  # The conv-pool.
        for unit in stage[1:]:
            x = x + conv_bn_relu(conv_bn_relu(x, unit, 1), unit, 2)  # The residual.
    features = x.max(axis=(1, 2))  # Global max-pool.
    expected = 0.125 * features @ model.logits.kernel.numpy().astype(np.float64)
    actual = model(tf.constant(images), training=False).numpy()
    assert [len(stage) for stage in model.stages] == [2, 1, 2]
    np.testing.assert_allclose(actual, expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())


def test_the_conv_pool_pools_before_its_relu_with_the_same_values_and_gradients():
    """The unit takes max-pool(BN(conv)) and then the ReLU (a quarter of the pixels):
    in training, its output and every gradient equal those of Page's order,
    ReLU then max-pool, written here from the same layers."""
    model = create_model("resnet9")
    model.build((None, 16, 16, 3))
    unit = model.stages[0][0]
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(0, 1, (4, 16, 16, unit.in_channels)).astype(np.float32))
    pool = tf.keras.layers.MaxPooling2D(2, 2)
    variables = [unit.conv1.kernel, unit.bn1.gamma, unit.bn1.beta]
    upstream = tf.constant(rng.normal(0, 1, (4, 8, 8, unit.out_channels)).astype(np.float32))

    def gradients(forward):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = forward()
        return y, tape.gradient(y, [x, *variables], output_gradients=upstream)

    ours, ours_grads = gradients(lambda: unit(x, training=True))
    pages, pages_grads = gradients(lambda: pool(tf.nn.relu(unit.bn1(unit.conv1(x), training=True))))
    np.testing.assert_array_equal(ours.numpy(), pages.numpy())
    assert 0.02 < np.mean(ours.numpy() == 0) < 0.5  # The ReLU cuts some windows, not all.
    for mine, theirs in zip(ours_grads, pages_grads):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


def test_options_that_resnet9_has_no_place_for_are_refused():
    with pytest.raises(ConfigError, match="'attention' does not apply to block=conv_pool"):
        presets.get_config("resnet9", attention="se")
    with pytest.raises(ConfigError, match="logit_scale"):
        presets.get_config("resnet9", logit_scale=0)


def test_cutout_zeroes_one_square_wholly_inside_each_image():
    from resnet_app.data.preprocessing import Preprocessing, cifar_train
    from resnet_app.data.settings import AugmentSettings

    plain = AugmentSettings(crop_padding=4, flip=True)
    with_cutout = AugmentSettings(crop_padding=4, flip=True, cutout_size=8)
    rng = np.random.default_rng(1)
    corners = set()
    for index in range(40):
        image = tf.constant(rng.integers(1, 255, (32, 32, 3)), tf.uint8)
        seed = tf.constant([7, index], tf.int64)
        outputs = [
            cifar_train(
                image, seed, Preprocessing("cifar", 32, (0, 0, 0), (1, 1, 1), augment=a)
            ).numpy()
            for a in (plain, with_cutout)
        ]
        changed = np.argwhere((outputs[0] != outputs[1]).any(axis=-1))
        top, left = changed.min(axis=0)
        # The square: 8x8, inside the image, zero (the mean colour); the rest untouched.
        assert len(changed) <= 64
        assert 0 <= top <= 24 and 0 <= left <= 24
        square = outputs[1][top : top + 8, left : left + 8]
        np.testing.assert_array_equal(square, 0)
        outside = np.ones((32, 32), bool)
        outside[top : top + 8, left : left + 8] = False
        np.testing.assert_array_equal(outputs[1][outside], outputs[0][outside])
        corners.add((int(top), int(left)))
    assert len(corners) > 20  # Drawn per example.
