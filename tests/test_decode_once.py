"""Small image-file splits decoded once: the same batches, bit for bit, as decoding each file
as it is read; the files kept encoded where the recipe would resize them or one fails."""

import numpy as np
import pytest
from absl import logging as absl_logging

from resnet_app.data import batches, decode_once, input_pipeline, shapes
from resnet_app.data.settings import data_config
from tests import own_data
from tests.test_batches import assert_same, batches_of, spy


def write_folder(root, sizes=None):
    """class folders of PNGs under root/train and root/test; 40 and 14 images of 28 px (or
    `sizes` per image, in order)."""
    images, labels = shapes.generate("train", 54, seed=6)
    for index, (image, label) in enumerate(zip(images, labels, strict=True)):
        split = "train" if index < 40 else "test"
        size = 28 if sizes is None else sizes[index]
        pixels = np.resize(image, (size, size, 3)).astype(np.uint8)
        folder = root / split / shapes.CLASS_NAMES[label]
        own_data.write_pngs(str(folder), pixels[None], prefix=f"{index}_")
    return f"folder:{root}"


def both(dataset, monkeypatch, **data):
    """(batches decoded once, batches decoded as read): 12 training batches (past an epoch
    of 40) and the test split's padded batches."""
    found = []
    for limit in (decode_once.PIXEL_LIMIT_BYTES, 0):
        monkeypatch.setattr(decode_once, "PIXEL_LIMIT_BYTES", limit)
        pipeline = input_pipeline.create_pipeline(data_config(dataset=dataset, seed=4, **data))
        train = batches_of(pipeline.train_dataset(8, start_example=4), 12)
        found.append((pipeline, train, batches_of(pipeline.eval_dataset(6), 99)))
    return found


@pytest.mark.parametrize("channels", [1, 3])
def test_the_batches_are_those_of_files_decoded_as_read(tmp_path, monkeypatch, channels):
    dataset = write_folder(tmp_path)
    read = []
    monkeypatch.setattr(batches, "training", spy(batches.training, read))
    found = both(dataset, monkeypatch, channels=channels)
    (fast, train, test), (slow, train_read, test_read) = found
    assert len(read) == 1  # Pixels in memory: read a batch at a time; files: one by one.
    assert fast.train_split.images is not None and fast.eval_split().images is not None
    assert fast.train_split.images.shape == (40, 28, 28, channels)
    assert slow.train_split.encoded and slow.eval_split().encoded
    assert_same(train, train_read)
    assert_same(test, test_read)


def test_files_the_recipe_would_resize_stay_encoded(tmp_path, monkeypatch):
    sizes = [28] * 30 + [32] * 24  # The test split's images are not the training size.
    dataset = write_folder(tmp_path, sizes)
    messages = []
    monkeypatch.setattr(absl_logging, "info", lambda text, *args: messages.append(text % args))
    (fast, train, test), (_, train_read, test_read) = both(
        dataset, monkeypatch, image_size=28, preprocessing="cifar"
    )
    assert fast.eval_split().encoded
    assert any("decoded as it is read (an image of 32x32 px, not 28)" in m for m in messages)
    assert_same(train, train_read)
    assert_same(test, test_read)
