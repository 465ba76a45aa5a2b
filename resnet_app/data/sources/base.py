"""What every source gives the pipeline: class names and splits, read by index or streamed.

An indexed `Split` maps an example index to (raw image, label) with `lookup()`: decoded
uint8 pixels in memory (`images`), or encoded files (`files`, their bytes in `contents`
when small); the training order is a stateless permutation of the indices. A streamed
split's `RecordStream` reads records in an order of its own, images left encoded so that
JPEG crops can be decoded partially. Labels are int64 [N] class ids, or for multi-label
data uint8 [N, classes] multi-hot rows.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from resnet_app.common.errors import ConfigError

HOLDOUT_SPLIT = "holdout"
EVAL_SPLITS = (HOLDOUT_SPLIT, "validation", "val", "test")  # Preferred first.
HOLDOUT_SEED = 20151210  # Fixed: the held-out examples never follow the run's seed.


def round_robin(total: int, num_shards: int) -> list[int]:
    """Examples per pipeline when pipeline i reads examples i, i + num_shards, ..."""
    return [len(range(i, total, num_shards)) for i in range(num_shards)]


def clear_graph_seed() -> None:
    """Inside a flat_map's graph, lets `Dataset.shuffle` take a tensor seed.

    It pairs its seed with the graph's (TF's global seed), and with a global seed of 0
    cannot take a tensor seed at all; our seeds are complete on their own.
    """
    import tensorflow as tf

    if not tf.executing_eagerly():
        tf.compat.v1.get_default_graph().seed = None


@dataclasses.dataclass(eq=False)
class RecordStream:
    """A streamed split: its records with ids [begin, end), as {"image": bytes, "label", "id"}.

    The "id" is the example's index in the split, so its augmentation and evaluation are
    its own whatever order the records come in. Subclasses give `training` and `evaluation`.
    """

    begin: int
    end: int

    def slice(self, start: int | None, stop: int | None) -> RecordStream:
        """Examples [start:stop] (Python slice semantics), ids from 0."""
        part = range(self.begin, self.end)[start:stop]
        return dataclasses.replace(self, begin=part.start, end=part.stop)

    def shard_sizes(self, num_shards: int) -> list[int]:
        """How many examples each of `num_shards` evaluation pipelines reads."""
        return round_robin(self.end - self.begin, num_shards)

    def training(self, seed, start_example, num_shards, shard_index, buffer):
        """Pipeline `shard_index`'s infinite stream of (epoch, id, image, label), entered at
        `start_example`; its order is a function of (seed, epoch, position) only."""
        raise NotImplementedError

    def evaluation(self, num_shards, shard_index):
        """Pipeline `shard_index`'s share of the split, every example once, as examples."""
        raise NotImplementedError


@dataclasses.dataclass
class Split:
    """One split: its name, size and labels (None when a stream does not know them), and
    either `images` (uint8 [N, H, W, C], C 1 or 3), `files` (with `contents`, their bytes,
    for small sets) or a `stream`."""

    name: str
    num_examples: int
    labels: np.ndarray | None = None
    images: np.ndarray | None = None
    files: np.ndarray | None = None
    contents: np.ndarray | None = None
    stream: RecordStream | None = None

    @property
    def indexed(self) -> bool:
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
        if self.stream is not None:
            return self.stream.shard_sizes(num_shards)
        return round_robin(self.num_examples, num_shards)

    def slice(self, start: int | None, stop: int | None, name: str | None = None) -> Split:
        """Examples [start:stop] (Python slice semantics)."""
        if self.stream is None:
            return self.subset(np.arange(self.num_examples)[start:stop], name)
        part = range(self.num_examples)[start:stop]
        labels = None if self.labels is None else self.labels[start:stop]
        stream = self.stream.slice(start, stop)
        return Split(name or self.name, len(part), labels=labels, stream=stream)

    def subset(self, indices: np.ndarray, name: str | None = None) -> Split:
        """The examples at `indices` (indexed splits only)."""

        arrays = (self.labels, self.images, self.files, self.contents)
        taken = [None if values is None else values[indices] for values in arrays]
        return Split(name or self.name, len(indices), *taken)

    def class_counts(self, num_classes: int) -> np.ndarray | None:
        """Training examples per class (None when the labels are unknown)."""
        if self.labels is None:
            return None
        if self.multi_label:
            return self.labels.sum(axis=0, dtype=np.int64)
        return np.bincount(self.labels, minlength=num_classes).astype(np.int64)


@dataclasses.dataclass
class Source:
    """A dataset: its `--dataset` name, class names, fixed image size (None when it varies)
    and splits by name ("train" always among them)."""

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
    """Moves `count` training examples into a new "holdout" split (0: none).

    Indexed splits hold out examples drawn with their own fixed seed, the same whatever
    the training seed (as He et al. hold out 5,000 of CIFAR-10); streamed splits their
    last `count`.
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
    """Evaluation batches per pipeline: enough for the largest share, a multiple of
    `multiple_of`; every pipeline yields this many, padded, so no replica steps alone."""
    return math.ceil(max(sizes) / batch_size / multiple_of) * multiple_of
