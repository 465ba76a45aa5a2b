"""`--dataset=tfrecord:DIR`: ImageNet-style TFRecord shards, streamed.

The layout of TF's `build_imagenet_data.py`: shards `DIR/train-*`, `DIR/validation-*` (and
`DIR/test-*`) of `tf.train.Example`s with the encoded image, an int64 label and optionally
the class's name (`data.records.*_key`; ImageNet's labels start at 1:
`data.records.label_offset=1`). Counts and labels are scanned once and cached
(`record_index.py`); an example's id is its position in the sorted shards.

Training: with S pipelines (workers) and at least S shards, pipeline s reads only shards
s, s + S, ...; each epoch takes them in an order drawn from (seed, epoch), in groups of
`CYCLE_SHARDS` interleaved and shuffled by a buffer seeded by (seed, epoch, group). Entering
at an example opens only its group: nothing before is decoded. A run resumes exactly with
the number of workers it started with. With fewer shards than pipelines, every pipeline
reads every shard and keeps its own positions, as for tfds.
"""

from __future__ import annotations

import dataclasses
import glob
import os

import numpy as np
from absl import logging

import resnet_app.data.sources.record_index as record_index
from resnet_app.common.errors import ConfigError
from resnet_app.data.sources.base import (
    RecordStream,
    Source,
    Split,
    clear_graph_seed,
    round_robin,
)
from resnet_app.data.sources.registry import register_check, register_source

PREFIX = "tfrecord:"
SPLIT_PREFIXES = ("train", "validation", "test")  # A split's shards: "{split}-*".
CYCLE_SHARDS = 16  # Shards interleaved and shuffled together in the training stream.
READ_BUFFER_BYTES = 8 << 20


@dataclasses.dataclass(eq=False)
class TFRecordStream(RecordStream):
    """One split's shards (`paths`, sorted; `counts` records each), ids [begin, end) kept;
    `label_offset` is subtracted from every label."""

    paths: np.ndarray
    counts: np.ndarray
    image_key: str
    label_key: str
    label_offset: int

    def __post_init__(self):
        self.paths, self.counts = np.asarray(self.paths), np.asarray(self.counts, np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
        # Records of each shard inside [begin, end), and the shards that have any.
        begin, end, counts = self.begin, self.end, self.counts
        self.kept = np.clip(end - self.offsets, 0, counts) - np.clip(
            begin - self.offsets, 0, counts
        )
        self.used = np.flatnonzero(self.kept > 0)

    def _lane(self, num_shards: int, shard_index: int) -> tuple[np.ndarray, bool]:
        """(the shards pipeline `shard_index` reads, whether they are its own)."""
        if len(self.used) >= num_shards:
            return self.used[shard_index::num_shards], True
        return self.used, False

    def shard_sizes(self, num_shards: int) -> list[int]:
        if len(self.used) >= num_shards:
            return [int(self.kept[self.used[i::num_shards]].sum()) for i in range(num_shards)]
        return round_robin(self.end - self.begin, num_shards)

    def _read(self, shards):
        """Records of `shards` (an int tensor of shard numbers) interleaved, as (id, record)."""
        import tensorflow as tf

        from resnet_app.data import options

        paths = tf.gather(tf.constant(self.paths), shards)
        offsets = tf.gather(tf.constant(self.offsets), shards)

        def records(path, offset):
            file = tf.data.TFRecordDataset(path, buffer_size=READ_BUFFER_BYTES)
            return file.enumerate().map(lambda i, record: (offset + i, record))

        stream = tf.data.Dataset.from_tensor_slices((paths, offsets)).interleave(
            records,
            cycle_length=CYCLE_SHARDS,
            block_length=1,
            num_parallel_calls=min(CYCLE_SHARDS, options.parallel_calls()),
            deterministic=True,
        )
        if self.begin > 0 or self.end < int(self.counts.sum()):
            begin, end = self.begin, self.end
            stream = stream.filter(lambda i, _: (i >= begin) & (i < end))
        return stream

    def _example(self, example_id, record):
        import tensorflow as tf

        features = tf.io.parse_single_example(
            record,
            {
                self.image_key: tf.io.FixedLenFeature([], tf.string),
                self.label_key: tf.io.FixedLenFeature([], tf.int64),
            },
        )
        label = features[self.label_key] - self.label_offset
        return example_id - self.begin, features[self.image_key], label

    def training(self, seed, start_example, num_shards, shard_index, buffer):
        import tensorflow as tf

        from resnet_app.data import options, seeds

        lane, own = self._lane(num_shards, shard_index)
        position = start_example // num_shards if own else start_example
        epoch_size = int(self.kept[lane].sum())
        groups = -(-len(lane) // CYCLE_SHARDS)
        first_epoch, within = divmod(position, epoch_size)
        # The group that holds example `within` of the first epoch, and where in it.
        order = lane[_shard_order(len(lane), seed, first_epoch).numpy()]
        group_sizes = np.add.reduceat(self.kept[order], np.arange(0, len(lane), CYCLE_SHARDS))
        first_group = int(np.searchsorted(np.cumsum(group_sizes), within, side="right"))
        skip = within - int(group_sizes[:first_group].sum())
        first_unit = first_epoch * groups + first_group
        lane_tensor = tf.constant(lane, tf.int64)

        def group_records(unit):
            clear_graph_seed()
            epoch, group = unit // groups, unit % groups
            shards = tf.gather(lane_tensor, _shard_order(len(lane), seed, epoch))
            shards = shards[group * CYCLE_SHARDS : (group + 1) * CYCLE_SHARDS]
            group_key = tf.random.experimental.stateless_fold_in(
                seeds.stream_seed(seed, seeds.RECORDS, epoch), group
            )
            buffer_seed = tf.random.stateless_uniform(
                [], group_key, minval=None, maxval=None, dtype=tf.int64
            )
            records = self._read(shards).shuffle(buffer, seed=buffer_seed)
            records = records.skip(
                tf.where(tf.equal(unit, first_unit), tf.constant(skip, tf.int64), 0)
            )
            return records.map(lambda i, record: (epoch, i, record))

        group_records = tf.autograph.experimental.do_not_convert(group_records)
        stream = tf.data.Dataset.range(first_unit, 1 << 62).flat_map(group_records)
        stream = stream.map(
            lambda epoch, i, record: (epoch, *self._example(i, record)),
            num_parallel_calls=options.parallel_calls(),
        )
        return stream if own else stream.shard(num_shards, shard_index)

    def evaluation(self, num_shards, shard_index):
        import tensorflow as tf

        from resnet_app.data import options

        lane, own = self._lane(num_shards, shard_index)

        def example(i, record):
            example_id, image, label = self._example(i, record)
            return {"id": example_id, "image": image, "label": label}

        # One shard after another, in file order.
        records = tf.data.Dataset.from_tensor_slices(lane).flat_map(
            lambda shard: self._read(tf.reshape(shard, [1]))
        )
        stream = records.map(example, num_parallel_calls=options.parallel_calls())
        return stream if own else stream.shard(num_shards, shard_index)


def _shard_order(count: int, seed: int, epoch):
    import tensorflow as tf

    from resnet_app.data import seeds

    order_seed = seeds.stream_seed(seed, seeds.RECORDS, epoch)
    return tf.random.experimental.stateless_shuffle(tf.range(count, dtype=tf.int64), order_seed)


def _check_keys(path: str, config) -> str | None:
    """The text key to read (None when absent); refuses missing image or label keys."""
    keys = record_index.first_example_keys(path)
    listing = ", ".join(f"{key} ({kind})" for key, kind in sorted(keys.items()))
    for setting, key, kind in (
        ("data.records.image_key", config.records.image_key, "bytes"),
        ("data.records.label_key", config.records.label_key, "int64"),
    ):
        if keys.get(key) != kind:
            problem = "has no feature" if key not in keys else f"has {keys[key]}, not {kind}, in"
            raise ConfigError(
                f"{path} {problem} {key!r}; its features are {listing}: set {setting} to one "
                f"of them"
            )
    text_key = config.records.text_key
    return text_key if text_key and keys.get(text_key) == "bytes" else None


def _class_names(dataset: str, labels: np.ndarray, texts: dict, config) -> list[str]:
    """The classes: the text feature's names, else `data.class_names`, else the ids; refuses
    a label that, after `data.records.label_offset`, is not a class."""
    offset = config.records.label_offset
    low, high = int(labels.min()), int(labels.max())
    if texts:
        # Classes a split has no example of may have no text: named by their id.
        top = max(high, max(texts))
        names = {label - offset: texts.get(label, str(label - offset)) for label in range(top + 1)}
        names = {label: text for label, text in names.items() if label >= 0}
        count, why = top - offset + 1, "classes (the highest class text's label)"
    elif config.class_names:
        names = dict(enumerate(config.class_names))
        count, why = len(names), "names in data.class_names"
    else:
        names, count, why = None, high - offset + 1, "classes"
    unnamed_zero = texts and offset not in texts and low > offset
    if low - offset < 0 or high - offset >= count or unnamed_zero:
        fits = high - low < count
        fix = f"set data.records.label_offset={low}" if fits else "check data.records.label_key"
        problem = f"outside [0, {count}) for {count} {why}"
        problem = f"and no class text or example has label {offset}" if unnamed_zero else problem
        raise ConfigError(
            f"--dataset={dataset}: labels run from {low} to {high}; with data.records.label_offset="
            f"{offset} that is {low - offset} to {high - offset}, {problem}: {fix}"
        )
    if names is None and low - offset > 0:
        logging.warning(
            "%s: no example has label %d; if the labels start at %d (ImageNet's files "
            "start at 1), set data.records.label_offset=%d",
            dataset,
            offset,
            low,
            low,
        )
    return [str(i) if names is None else names[i] for i in range(count)]


@register_check("tfrecord")
def check(root: str, config=None) -> dict[str, list[str]]:
    """The shard files by split; refuses a directory without `train-*` shards."""
    name = PREFIX + root
    if not os.path.isdir(root):
        raise ConfigError(f"--dataset={name}: {root} is not a directory")
    found = {}
    for split in SPLIT_PREFIXES:
        paths = sorted(p for p in glob.glob(os.path.join(root, f"{split}-*")) if os.path.isfile(p))
        if paths:
            found[split] = paths
    if "train" not in found:
        raise ConfigError(
            f"--dataset={name}: no train-* shards in {root}; expected the layout of "
            "build_imagenet_data.py: train-00000-of-01024, ..., validation-00000-of-00128, ..."
        )
    return found


@register_source("tfrecord", usage="tfrecord:DIR")
def load(root: str, config) -> Source:
    """The shards in `root`, indexed (cached), as streamed splits."""
    name = PREFIX + root
    found = check(root)
    text_key = _check_keys(found["train"][0], config)
    indexes = {
        split: record_index.load(paths, config.records.label_key, text_key, config.data_dir)
        for split, paths in found.items()
    }
    texts = {label: text for index in indexes.values() for label, text in index.texts.items()}
    records = config.records
    train_labels = indexes["train"].labels
    if not len(train_labels):
        raise ConfigError(f"--dataset={name}: the train-* shards in {root} hold no records")
    class_names = _class_names(name, train_labels, texts, config)
    features = (records.image_key, records.label_key, records.label_offset)
    splits = {}
    for split, index in indexes.items():
        labels = index.labels - records.label_offset
        if len(labels) and (labels.min() < 0 or labels.max() >= len(class_names)):
            raise ConfigError(
                f"--dataset={name}: the {split}-* shards have labels {index.labels.min()} to "
                f"{index.labels.max()}, outside the {len(class_names)} classes of train-* "
                f"(data.records.label_offset={records.label_offset})"
            )
        total = int(index.counts.sum())
        stream = TFRecordStream(0, total, index.paths, index.counts, *features)
        splits[split] = Split(split, total, labels=labels, stream=stream)
    return Source(name, class_names, None, splits)
