"""The built-in `shapes` dataset: deterministic, cached, balanced and not linear."""

import logging
import os

import numpy as np
import pytest

from resnet_app.data import shapes


@pytest.fixture(scope="module")
def small():
    return shapes.generate("train", 1200, seed=0)


def test_shapes_and_dtypes(small):
    images, labels = small
    assert images.shape == (1200, 32, 32, 3) and images.dtype == np.uint8
    assert labels.shape == (1200,) and labels.dtype == np.int64
    assert set(labels.tolist()) == set(range(len(shapes.CLASS_NAMES)))
    # Roughly balanced: every class within 40% of its share.
    counts = np.bincount(labels, minlength=10)
    assert counts.min() > 0.6 * 120 and counts.max() < 1.4 * 120


def test_deterministic_given_the_seed(small):
    again = shapes.generate("train", 1200, seed=0)
    np.testing.assert_array_equal(small[0], again[0])
    np.testing.assert_array_equal(small[1], again[1])
    other = shapes.generate("train", 1200, seed=1)
    assert not np.array_equal(small[0], other[0])


def test_prefix_does_not_depend_on_the_total(small):
    # 1200 crosses the generator's chunk boundary at 1000.
    prefix = shapes.generate("train", 1100, seed=0)
    np.testing.assert_array_equal(small[0][:1100], prefix[0])
    # A split shorter than a chunk draws only its own images, the same ones.
    few = shapes.generate("train", 37, seed=0)
    np.testing.assert_array_equal(small[0][:37], few[0])
    np.testing.assert_array_equal(small[1][:37], few[1])


def test_splits_differ():
    train, _ = shapes.generate("train", 50)
    test, _ = shapes.generate("test", 50)
    assert not np.array_equal(train, test)


def test_images_are_not_trivial(small):
    images, _ = small
    # Random colours, gradients and noise: the pixels use the whole range and
    # no two images are alike.
    assert images.min() == 0 and images.max() == 255
    assert images.reshape(len(images), -1).std(axis=1).min() > 5
    assert len({image.tobytes() for image in images}) == len(images)


def test_a_linear_classifier_stays_far_below_90_percent():
    # Ridge regression on raw pixels to one-hot targets, solved in closed form.
    train_x, train_y = shapes.generate("train", 4000)
    test_x, test_y = shapes.generate("test", 1000)

    def features(x):
        flat = x.reshape(len(x), -1).astype(np.float64) / 255
        return np.concatenate([flat, np.ones((len(x), 1))], axis=1)

    design = features(train_x)
    weights = np.linalg.solve(
        design.T @ design + 10 * np.eye(design.shape[1]), design.T @ np.eye(10)[train_y]
    )
    train_accuracy = np.mean(np.argmax(design @ weights, 1) == train_y)
    test_accuracy = np.mean(np.argmax(features(test_x) @ weights, 1) == test_y)
    assert train_accuracy > 0.5  # The solver works: it fits the training set.
    assert test_accuracy < 0.3


def test_cache_round_trip_and_corrupt_cache(tmp_path):
    images, labels = shapes.load("test", 30, cache_dir=str(tmp_path))
    files = [name for name in os.listdir(tmp_path) if name.endswith(".npz")]
    assert len(files) == 1
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
    cached = shapes.load("test", 30, cache_dir=str(tmp_path))
    np.testing.assert_array_equal(images, cached[0])
    # A damaged cache file is regenerated, not trusted.
    path = tmp_path / files[0]
    path.write_bytes(b"garbage")
    again = shapes.load("test", 30, cache_dir=str(tmp_path))
    np.testing.assert_array_equal(images, again[0])
    np.testing.assert_array_equal(labels, again[1])


def _damage(path, how):
    """The .npz at `path` cut in half, or one byte of its images flipped (a bad CRC)."""
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[len(data) // 3] ^= 0xFF
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "bad checksum"])
def test_a_damaged_cache_is_one_warning_and_rebuilt(tmp_path, caplog, how):
    images, labels = shapes.load("test", 30, seed=4, cache_dir=str(tmp_path))
    (path,) = tmp_path.glob("*.npz")
    good = path.read_bytes()
    _damage(path, how)
    with caplog.at_level(logging.WARNING):
        again = shapes.load("test", 30, seed=4, cache_dir=str(tmp_path))
    (warning,) = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert warning.startswith(f"The cache file {path} is damaged (") and "rebuilding" in warning
    np.testing.assert_array_equal(again[0], images)
    np.testing.assert_array_equal(again[1], labels)
    assert path.read_bytes() == good  # Rebuilt: the next run reads it without a word.
