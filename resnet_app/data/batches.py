"""What every example carries, and pixels held in memory read a batch at a time.

The general pipeline maps a function over each example (the lookup of its pixels, then its
draws), which costs tens of microseconds of tf.data work per example, taken from the step.
When the pixels are in memory, the CIFAR recipe applies, no resize is needed and nothing
is drawn per example but the crop and the flip, `training` and `evaluation` batch the
example indices first: one gather reads a batch's pixels, and `philox.uniform_rows` draws
its crops and flips from each example's own seed. The batches are the general pipeline's,
bit for bit (`tests/test_batches.py`).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from resnet_app.data import augmentations, options, preprocessing, sources


def example(features: dict, label: tf.Tensor, example_id: tf.Tensor) -> dict:
    """A real (mask 1) example, or a batch of them: image features, label (a class id as
    int32, a multi-hot row, one dimension more than the id, as float32) and id."""
    multi_hot = label.shape.rank > example_id.shape.rank
    return {
        **features,
        "label": tf.cast(label, tf.float32 if multi_hot else tf.int32),
        "id": example_id,
        "mask": tf.ones_like(example_id, tf.float32),
    }


def applies(split: sources.Split | None, config: preprocessing.Preprocessing, resize: bool) -> bool:
    """Whether `split` can be read a batch at a time under `config`."""
    if split is None or not split.indexed or split.encoded or resize:
        return False
    return config.family == "cifar" and not augmentations.active(config.augment)


def training(
    indexed: tf.data.Dataset,
    batch_size: int,
    lookup,
    config: preprocessing.Preprocessing,
    copies: bool,
) -> tf.data.Dataset:
    """Batches of the examples `indexed` names ((augmentation key, index, copy) each), as
    the general pipeline batches them before its batch-wise augmentation: "image" (uint8
    pixels from `lookup`), "choices", "copy" (with `copies`), "label", "id", "mask"."""

    def read(keys, indices, copy):
        images, labels = lookup(indices)
        seeds = tf.stack([keys, indices], axis=1)
        features = {"image": images, "choices": preprocessing.cifar_choices_rows(seeds, config)}
        if copies:
            features["copy"] = copy
        return example(features, labels, indices)

    stream = indexed.batch(batch_size, drop_remainder=True)
    return stream.map(read, num_parallel_calls=options.parallel_calls())


def evaluation(
    indices: np.ndarray,
    batch_size: int,
    num_batches: int,
    lookup,
    config: preprocessing.Preprocessing,
) -> tf.data.Dataset:
    """`num_batches` batches of the examples `indices`, normalized, then masked blanks as
    the general pipeline's: zero image, label 0 (or a zero row), id -1, mask 0."""

    def read(batch_ids):
        real = batch_ids >= 0
        images, labels = lookup(tf.maximum(batch_ids, 0))
        normalized = preprocessing.normalize(images, config)
        images = tf.where(real[:, None, None, None], normalized, tf.zeros_like(normalized))
        size = config.eval_size
        images = tf.ensure_shape(images, [None, size, size, config.channels])
        label_mask = tf.reshape(real, [-1] + [1] * (labels.shape.rank - 1))
        batch = example({"image": tf.cast(images, config.dtype)}, labels, batch_ids)
        batch["label"] = tf.where(label_mask, batch["label"], tf.zeros_like(batch["label"]))
        return {**batch, "mask": tf.cast(real, tf.float32)}

    stream = tf.data.Dataset.from_tensor_slices(padded_ids(indices, batch_size, num_batches))
    return stream.map(read, num_parallel_calls=options.parallel_calls())


def padded_ids(indices: np.ndarray, batch_size: int, num_batches: int) -> np.ndarray:
    """int64 [num_batches, batch_size]: `indices`, then -1 (padding)."""
    ids = np.full(num_batches * batch_size, -1, np.int64)
    ids[: len(indices)] = indices
    return ids.reshape(num_batches, batch_size)
