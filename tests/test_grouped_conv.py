"""Grouped convolutions: every formulation is the same function as a NumPy grouped conv.

References: `torchvision_reference.conv2d(..., groups=)` (NumPy, written from
PyTorch's definition) for the outputs, and TF's dense convolution with the
block-diagonal kernel built in NumPy for the gradients (a dense conv's
gradient is TF's own, the one every other layer here trains with).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from resnet_app.nets import grouped_conv, layers
from resnet_app.nets.resnet import create_model
from tests.torchvision_reference import conv2d as numpy_conv2d

# Every formulation production may pick: each must be exact.
EVERY = grouped_conv.FORMULATIONS

# native needs oneDNN for its gradient.
TRAINABLE = [name for name in EVERY if name != "native"]


# 16 groups of 2 input channels each (32 channels).
def _case(channels=32, out=48, groups=16, size=9, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, size, size, channels)).astype("float32")
    kernel = rng.normal(size=(3, 3, channels // groups, out)).astype("float32")
    return x, kernel


def _numpy_grouped(x, kernel, groups, stride, padding):
    """NHWC in and out, through the NCHW NumPy reference; SAME padded as TF pads."""
    if padding == "SAME":  # TF's: the odd pixel of padding at the bottom and right.
        total = max((-(-x.shape[1] // stride) - 1) * stride + 3 - x.shape[1], 0)
        edge = (total // 2, total - total // 2)
        x = np.pad(x, [(0, 0), edge, edge, (0, 0)])
    weight = kernel.transpose(3, 2, 0, 1)  # HWIO -> OIHW.
    out = numpy_conv2d(x.transpose(0, 3, 1, 2).astype(np.float64), weight, stride, groups=groups)
    return out.transpose(0, 2, 3, 1)


def _block_diagonal(kernel, groups):
    kh, kw, per_group, out = kernel.shape
    dense = np.zeros((kh, kw, per_group * groups, out), kernel.dtype)
    out_per_group = out // groups
    for g in range(groups):
        rows, cols = (
            slice(g * per_group, (g + 1) * per_group),
            slice(g * out_per_group, (g + 1) * out_per_group),
        )
        dense[:, :, rows, cols] = kernel[:, :, :, cols]
    return dense


@pytest.mark.parametrize("name", list(EVERY))
@pytest.mark.parametrize("stride,padding", [(1, "SAME"), (2, "SAME"), (2, "VALID")])
def test_every_formulation_computes_the_grouped_convolution(name, stride, padding):
    x, kernel = _case()
    expected = _numpy_grouped(x, kernel, 16, stride, padding)
    ours = EVERY[name](tf.constant(x), tf.constant(kernel), 16, stride, padding)
    np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", TRAINABLE)
def test_every_trainable_formulation_has_the_gradients_of_the_block_diagonal_dense_conv(name):
    x, kernel = _case(channels=32, out=32, groups=16, size=8, seed=1)
    upstream = np.random.default_rng(2).normal(size=(2, 4, 4, 32)).astype("float32")
    dense = tf.Variable(_block_diagonal(kernel, 16))
    x_ref = tf.Variable(x)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.conv2d(x_ref, dense, 2, "SAME") * upstream)
    dx_ref, dk_dense = tape.gradient(loss, [x_ref, dense])
    dk_ref = np.stack(
        [dk_dense.numpy()[:, :, g * 2 : (g + 1) * 2, g * 2 : (g + 1) * 2] for g in range(16)],
        axis=3,
    ).reshape(kernel.shape)
    x_var, k_var = tf.Variable(x), tf.Variable(kernel)
    with tf.GradientTape() as tape:
        out = EVERY[name](x_var, k_var, 16, 2, "SAME")
        loss = tf.reduce_sum(out * upstream)
    dx, dk = tape.gradient(loss, [x_var, k_var])
    np.testing.assert_allclose(dx.numpy(), dx_ref.numpy(), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dk.numpy(), dk_ref, rtol=1e-5, atol=1e-4)


def test_the_choice_follows_dtype_xla_and_a_forced_formulation():
    assert grouped_conv.choose(tf.bfloat16) == "split"
    assert grouped_conv.choose(tf.float32) in ("native", "chunked_auto")
    with grouped_conv.forced("split"):
        assert grouped_conv.choose(tf.float32) == "split"
    seen = []

    @tf.function(jit_compile=True)
    def traced(x):
        seen.append(grouped_conv.choose(tf.float32))
        return x

    traced(tf.constant(1.0))
    assert seen == ["chunked_auto"]  # Never native under XLA: its gradient is the slow one.
    with pytest.raises(ValueError, match="unknown formulation"), grouped_conv.forced("fastest"):
        pass


def test_the_layer_holds_kerass_grouped_variables_and_computes_their_conv():
    x, kernel = _case()
    ours = layers.GroupedConv2D(48, 3, groups=16, padding="same", use_bias=False, name="conv")
    theirs = keras.layers.Conv2D(48, 3, groups=16, padding="same", use_bias=False, name="conv")
    ours.build(x.shape)
    theirs.build(x.shape)
    assert [(v.path, v.shape) for v in ours.weights] == [(v.path, v.shape) for v in theirs.weights]
    ours.kernel.assign(kernel)
    np.testing.assert_allclose(
        ours(x).numpy(), _numpy_grouped(x, kernel, 16, 1, "SAME"), rtol=1e-5, atol=1e-4
    )


def test_a_resnext_checkpoint_does_not_depend_on_the_formulation(tmp_path):
    """Trained under one formulation, restored and evaluated under another: the same logits."""
    fields = dict(
        block="bottleneck",
        units=(1, 1),
        widths=(8, 8),
        strides=(1, 2),
        groups=4,
        base_width=16,
        shortcut="projection",
    )
    images = np.random.default_rng(3).normal(size=(2, 16, 16, 3)).astype("float32")
    with grouped_conv.forced("chunked_auto"):
        model = create_model("tiny", **fields)
        model.build((None, 16, 16, 3))
        optimizer = keras.optimizers.SGD(0.1)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(images, training=True) ** 2)
        optimizer.apply_gradients(
            zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        )
        expected = model(images, training=False).numpy()
        path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    with grouped_conv.forced("split"):
        restored = create_model("tiny", **fields)
        restored.build((None, 16, 16, 3))
        tf.train.Checkpoint(model=restored).read(path).assert_existing_objects_matched()
        np.testing.assert_allclose(
            restored(images, training=False).numpy(), expected, rtol=1e-5, atol=1e-5
        )
