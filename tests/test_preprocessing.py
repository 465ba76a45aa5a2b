"""Augmentations against NumPy and closed forms: shapes, ranges, windows, dtypes."""

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.data import families, preprocessing
from resnet_app.data.preprocessing import Preprocessing

MEAN, STD = (120.0, 110.0, 100.0), (60.0, 50.0, 40.0)
CIFAR = Preprocessing("cifar", 32, MEAN, STD)
IMAGENET = Preprocessing("imagenet", 224, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))


def random_image(height=32, width=32, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def smooth_image(height, width):
    # Smooth content, so that JPEG round trips stay close to the original.
    y, x = np.mgrid[0:height, 0:width]
    channels = [128 + 100 * np.sin(x / 17.0 + c) * np.cos(y / 23.0 - c) for c in range(3)]
    return np.stack(channels, -1).astype(np.uint8)


def seed(i):
    return tf.constant([7, i], tf.int64)


def test_cifar_train_is_a_window_of_the_padded_image_maybe_flipped():
    image = random_image()
    normalized = (image - np.array(MEAN)) / np.array(STD)
    padded = np.pad(normalized, ((4, 4), (4, 4), (0, 0)))
    offsets, flips = set(), set()
    for i in range(40):
        out = preprocessing.cifar_train(tf.constant(image), seed(i), CIFAR).numpy()
        assert out.shape == (32, 32, 3) and out.dtype == np.float32
        matches = [
            (top, left, flipped)
            for top in range(9)
            for left in range(9)
            for flipped in (False, True)
            if np.allclose(
                out,
                padded[top : top + 32, left : left + 32][:, ::-1]
                if flipped
                else padded[top : top + 32, left : left + 32],
                atol=1e-5,
            )
        ]
        assert len(matches) == 1, "not a window of the padded image"
        offsets.add(matches[0][:2])
        flips.add(matches[0][2])
    assert flips == {False, True}
    assert len(offsets) > 10  # The crop position really varies.


@pytest.mark.parametrize("channels, size, pad", [(1, 28, 2), (3, 32, 4), (3, 8, 3)])
def test_cifar_train_batch_crops_every_window_and_flip_as_numpy(channels, size, pad):
    """Every (top, left, flip) of a batch, bit for bit: the window of the image
    padded by the mean colour (0 once normalized), normalized in float32."""
    import dataclasses

    mean, std = MEAN[:channels], STD[:channels]
    config = Preprocessing("cifar", size, mean, std)
    augment = dataclasses.replace(config.augment, crop_padding=pad)
    config = dataclasses.replace(config, augment=augment)
    offsets = range(2 * pad + 1)
    choices = np.array([(t, s, f) for t in offsets for s in offsets for f in (0, 1)], np.int32)
    rng = np.random.default_rng(channels)
    images = rng.integers(0, 256, (len(choices), size, size, channels), dtype=np.uint8)
    out = preprocessing.cifar_train_batch(tf.constant(images), tf.constant(choices), config)
    normalized = (images.astype(np.float32) - np.float32(mean)) / np.float32(std)
    padded = np.pad(normalized, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    for image, (top, left, flip), actual in zip(padded, choices, out.numpy()):
        window = image[top : top + size, left : left + size]
        np.testing.assert_array_equal(actual, window[:, ::-1] if flip else window)


def test_cifar_train_is_a_function_of_the_seed():
    image = tf.constant(random_image())
    first = preprocessing.cifar_train(image, seed(3), CIFAR)
    again = preprocessing.cifar_train(image, seed(3), CIFAR)
    np.testing.assert_array_equal(first.numpy(), again.numpy())
    others = [preprocessing.cifar_train(image, seed(i), CIFAR).numpy() for i in range(4, 10)]
    assert any(not np.array_equal(first.numpy(), other) for other in others)


def test_cifar_eval_normalizes_per_channel():
    image = random_image()
    out = preprocessing.cifar_eval(tf.constant(image), CIFAR).numpy()
    np.testing.assert_allclose(out, (image - np.array(MEAN)) / np.array(STD), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_output_dtype_follows_the_precision(dtype):
    import dataclasses

    config = dataclasses.replace(CIFAR, dtype=dtype)
    out = preprocessing.cifar_train(tf.constant(random_image()), seed(0), config)
    assert out.dtype == tf.as_dtype(dtype)
    config = dataclasses.replace(IMAGENET, dtype=dtype)
    out = preprocessing.imagenet_eval(tf.constant(random_image(300, 260)), config)
    assert out.dtype == tf.as_dtype(dtype) and out.shape == (224, 224, 3)


def test_inception_crop_windows_respect_area_and_aspect_ranges():
    shape = tf.constant([480, 640, 3])
    areas, aspects = [], []
    for i in range(300):
        top, left, height, width = preprocessing._crop_window(shape, seed(i), IMAGENET).numpy()
        assert top >= 0 and top + height <= 480 and left >= 0 and left + width <= 640
        areas.append(height * width / (480 * 640))
        aspects.append(width / height)
    areas, aspects = np.array(areas), np.array(aspects)
    # Integer rounding of the window moves the ratios by about a pixel's worth.
    assert areas.min() >= 0.08 - 0.01 and areas.max() <= 1.0
    assert aspects.min() >= 0.75 - 0.03 and aspects.max() <= 4 / 3 + 0.03
    assert areas.min() < 0.2 and areas.max() > 0.8  # The whole range is used.


def test_imagenet_train_output_and_range():
    image = tf.constant(random_image(300, 400))
    out = preprocessing.imagenet_train(image, seed(1), IMAGENET).numpy()
    assert out.shape == (224, 224, 3)
    # Bilinear resizing of 0-255 pixels stays within 0-255 (mean 0, std 1 here).
    assert out.min() >= 0 and out.max() <= 255


def test_fused_jpeg_crop_equals_decoding_then_cropping():
    encoded = tf.io.encode_jpeg(tf.constant(smooth_image(240, 320)), quality=95)
    decoded = tf.io.decode_jpeg(encoded, channels=3)
    for i in range(5):
        fused = preprocessing.imagenet_train(encoded, seed(i), IMAGENET, encoded=True)
        plain = preprocessing.imagenet_train(decoded, seed(i), IMAGENET, encoded=False)
        # Same window; libjpeg's chroma upsampling differs slightly at the window's
        # edges only, so a few edge pixels move by a few levels.
        difference = np.abs(fused.numpy() - plain.numpy())
        assert difference.max() <= 8 and difference.mean() < 0.05


def test_png_bytes_take_the_generic_decoder():
    image = random_image(64, 48)
    encoded = tf.io.encode_png(tf.constant(image))
    fused = preprocessing.imagenet_train(encoded, seed(2), IMAGENET, encoded=True)
    plain = preprocessing.imagenet_train(tf.constant(image), seed(2), IMAGENET)
    np.testing.assert_array_equal(fused.numpy(), plain.numpy())


def test_imagenet_eval_matches_the_closed_form_on_a_ramp():
    # Pixel value = column index / 2 (a uint8 ramp from 0 to 199.5, rounded).
    # Bilinear resizing with half-pixel centres interpolates linearly between
    # source pixels, so every output pixel has a closed form: np.interp.
    height, width = 300, 400
    values = np.round(np.arange(width) / 2)
    image = np.broadcast_to(values[None, :, None], (height, width, 3)).astype(np.uint8)
    out = preprocessing.imagenet_eval(tf.constant(image), IMAGENET).numpy()
    assert out.shape == (224, 224, 3)
    new_width = round(width * 256 / height)  # shorter side 300 -> 256: 341
    left = (new_width - 224) // 2
    source_x = (np.arange(224) + left + 0.5) * width / new_width - 0.5
    expected = np.interp(source_x, np.arange(width), values)
    np.testing.assert_allclose(out[112, :, 0], expected, atol=1e-3)
    np.testing.assert_allclose(out[:, 100, 1], expected[100], atol=1e-3)


def test_decode_image_gives_rgb_for_color_and_grayscale_png():
    image = random_image(20, 30)
    png = tf.io.encode_png(tf.constant(image))
    np.testing.assert_array_equal(preprocessing.decode_image(png).numpy(), image)
    gray = tf.io.encode_png(tf.constant(image[..., :1]))
    assert preprocessing.decode_image(gray).shape == (20, 30, 3)


def bilinear(image, height, width):
    """NumPy bilinear resize with half-pixel centres (TensorFlow's convention)."""

    def axis(out_size, in_size):
        source = np.clip((np.arange(out_size) + 0.5) * in_size / out_size - 0.5, 0, in_size - 1)
        low = np.floor(source).astype(int)
        return low, np.minimum(low + 1, in_size - 1), source - low

    top, bottom, dy = axis(height, image.shape[0])
    left, right, dx = axis(width, image.shape[1])
    image = image.astype(np.float64)
    rows = image[top] * (1 - dy)[:, None, None] + image[bottom] * dy[:, None, None]
    return rows[:, left] * (1 - dx)[None, :, None] + rows[:, right] * dx[None, :, None]


@pytest.mark.parametrize("size", [(40, 48), (20, 27), (32, 32)])
def test_cifar_eval_of_another_size_is_bilinear_resize_rounded_then_normalized(size):
    """What serving and folder evaluation give an image of another size."""
    image = random_image(*size, seed=3)
    out = families.of(CIFAR).evaluate(tf.constant(image), CIFAR, encoded=False).numpy()
    pixels = np.clip(np.round(bilinear(image, 32, 32)), 0, 255)
    expected = (pixels - np.array(MEAN)) / np.array(STD)
    # Rounding may differ at exact halves in float32: at most one grey level, rarely.
    difference = np.abs(out - expected) * np.array(STD)
    assert difference.max() <= 1 + 1e-3
    assert np.mean(difference > 1e-3) < 0.01
    if size == (32, 32):
        np.testing.assert_allclose(out, (image - np.array(MEAN)) / np.array(STD), rtol=1e-6)
