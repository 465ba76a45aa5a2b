"""What every source gives the pipeline: class names and splits, read by index or streamed.

A `Split` is read one of two ways:
- by index: `lookup()` maps an example index to its (raw image, label). The
  images are decoded uint8 pixels in memory (`images`: CIFAR-size tfds
  datasets, `shapes`) or encoded files (`files`, with their bytes in memory
  when small: image folders, CSV tables). The training order is a stateless
  permutation of the indices.
- streamed: `stream` is a `RecordStream` (tfds record files, TFRecord shards)
  that reads its records in an order of its own, with the images left encoded
  so that JPEG crops can be decoded partially.

Labels are int64 [N] class ids, or, for multi-label data, uint8 [N, classes]
multi-hot rows.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

import numpy as np

from resnet_app.common.errors import ConfigError

HOLDOUT_SPLIT = "holdout"
# The splits a source may evaluate on, in the order they are preferred.
EVAL_SPLITS = (HOLDOUT_SPLIT, "validation", "val", "test")
# Which training examples are held out; fixed, so it never follows the run's seed.
HOLDOUT_SEED = 20151210


class RecordStream(Protocol):
    """A streamed split's records: {"image": encoded bytes, "label", "id"} examples.

    Every example has an "id", its index in the split, so that its augmentation
    and its evaluation are its own whatever order the records come in.
    """

    def slice(self, start: int | None, stop: int | None) -> RecordStream:
        """Examples [start:stop] of the split (Python slice semantics), ids from 0."""

    def training(
        self, seed: int, start_example: int, num_shards: int, shard_index: int, buffer: int
    ):
        """The infinite training stream of pipeline `shard_index`, entered at `start_example`.

        A tf.data.Dataset of (epoch, id, image, label); its order is a function
        of (seed, epoch, position) only.
        """

    def evaluation(self, num_shards: int, shard_index: int):
        """Pipeline `shard_index`'s share of the split, every example once, as examples."""

    def shard_sizes(self, num_shards: int) -> list[int]:
        """How many examples each of `num_shards` evaluation pipelines reads."""


@dataclasses.dataclass
class Split:
    """One split of a source.

    Attributes:
      name: the split's name ("train", "test", "holdout", ...).
      num_examples: how many examples it holds.
      labels: int64 [num_examples] class ids, or uint8 [num_examples, classes]
        multi-hot rows for multi-label data; None when a stream does not know
        them.
      images: decoded uint8 [num_examples, H, W, C] pixels, C = 1 (greyscale) or 3.
      files: the image paths.
      contents: with `files`, small sets: the files' bytes, read once.
      stream: a streamed split's `RecordStream`.
    """

    name: str
    num_examples: int
    labels: np.ndarray | None = None
    images: np.ndarray | None = None
    files: np.ndarray | None = None
    contents: np.ndarray | None = None
    stream: RecordStream | None = None

    @property
    def indexed(self) -> bool:
        """Whether examples are read by index (else streamed)."""
        return self.stream is None

    @property
    def encoded(self) -> bool:
        """Whether images are encoded bytes (files, records) rather than pixels."""
        return self.images is None

    @property
    def multi_label(self) -> bool:
        return self.labels is not None and self.labels.ndim == 2

    def lookup(self):
        """Indexed splits: a function from example index to (raw image, label) tensors."""
        import tensorflow as tf

        labels = tf.constant(self.labels)
        if self.images is not None:
            images = tf.constant(self.images)
            return lambda i: (tf.gather(images, i), tf.gather(labels, i))
        if self.contents is not None:
            contents = tf.constant(self.contents, tf.string)
            return lambda i: (tf.gather(contents, i), tf.gather(labels, i))
        files = tf.constant(self.files, tf.string)
        return lambda i: (tf.io.read_file(tf.gather(files, i)), tf.gather(labels, i))

    def shard_sizes(self, num_shards: int) -> list[int]:
        """How many examples each of `num_shards` evaluation pipelines reads."""
        if self.stream is not None:
            return self.stream.shard_sizes(num_shards)
        return [len(range(i, self.num_examples, num_shards)) for i in range(num_shards)]

    def slice(self, start: int | None, stop: int | None, name: str | None = None) -> Split:
        """Examples [start:stop] (Python slice semantics)."""
        if self.stream is not None:
            part = range(self.num_examples)[start:stop]
            labels = None if self.labels is None else self.labels[start:stop]
            return Split(
                name or self.name, len(part), labels=labels, stream=self.stream.slice(start, stop)
            )
        return self.subset(np.arange(self.num_examples)[start:stop], name)

    def subset(self, indices: np.ndarray, name: str | None = None) -> Split:
        """The examples at `indices` (indexed splits only)."""

        def take(values: np.ndarray | None) -> np.ndarray | None:
            return None if values is None else values[indices]

        return Split(
            name=name or self.name,
            num_examples=len(indices),
            labels=take(self.labels),
            images=take(self.images),
            files=take(self.files),
            contents=take(self.contents),
        )

    def class_counts(self, num_classes: int) -> np.ndarray | None:
        """Training examples per class (None when the labels are unknown)."""
        if self.labels is None:
            return None
        if self.multi_label:
            return self.labels.sum(axis=0, dtype=np.int64)
        return np.bincount(self.labels, minlength=num_classes).astype(np.int64)


@dataclasses.dataclass
class Source:
    """A dataset: class names, native image size and splits.

    Attributes:
      name: the `--dataset` value.
      class_names: label names, indexed by label.
      image_size: the images' fixed size, or None when it varies.
      splits: every split by name; "train" is always there.
    """

    name: str
    class_names: list[str]
    image_size: int | None
    splits: dict[str, Split]

    @property
    def multi_label(self) -> bool:
        return self.splits["train"].multi_label

    def split(self, name: str) -> Split:
        if name not in self.splits:
            raise ConfigError(
                f"dataset {self.name!r} has no split {name!r}; it has {', '.join(self.splits)}"
            )
        return self.splits[name]

    def default_eval_split(self) -> str:
        for name in EVAL_SPLITS:
            if name in self.splits:
                return name
        raise ConfigError(
            f"dataset {self.name!r} has no split to evaluate on (only "
            f"{', '.join(self.splits)}); use --validation_split=N to hold out N examples"
        )


def hold_out(source: Source, count: int) -> Source:
    """Moves `count` training examples into a new "holdout" split.

    The held-out examples are drawn at random with their own fixed seed, so the
    same examples are held out whatever the training seed (He et al. hold out
    5,000 of CIFAR-10's 50,000 this way). Streamed splits hold out their last
    `count` examples.

    Args:
      source: the source; its "train" split is replaced.
      count: examples to hold out; 0 leaves the source unchanged.

    Returns:
      The source with "train" reduced and "holdout" added.
    """
    if count <= 0:
        return source
    train = source.splits["train"]
    if count >= train.num_examples:
        raise ConfigError(
            f"--validation_split={count} leaves no training examples; "
            f"the training split has {train.num_examples}"
        )
    splits = dict(source.splits)
    if not train.indexed:
        splits["train"] = train.slice(None, -count)
        splits[HOLDOUT_SPLIT] = train.slice(-count, None, HOLDOUT_SPLIT)
    else:
        order = np.random.default_rng(HOLDOUT_SEED).permutation(train.num_examples)
        splits["train"] = train.subset(np.sort(order[count:]))
        splits[HOLDOUT_SPLIT] = train.subset(np.sort(order[:count]), HOLDOUT_SPLIT)
    return dataclasses.replace(source, splits=splits)


def eval_batches(sizes: list[int], batch_size: int, multiple_of: int = 1) -> int:
    """Evaluation batches per pipeline: enough for the largest share, a multiple of `multiple_of`.

    Every pipeline yields this many, padded, so no replica ever steps alone.
    """
    return math.ceil(max(sizes) / batch_size / multiple_of) * multiple_of
