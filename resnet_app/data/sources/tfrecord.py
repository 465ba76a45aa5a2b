"""`--dataset=tfrecord:DIR`: ImageNet-style TFRecord shards, streamed.

The layout of TF's `build_imagenet_data.py`: shards `DIR/train-*`, `DIR/validation-*` (and
`DIR/test-*`) of `tf.train.Example`s with the encoded image, an int64 label and optionally
the class's name (`data.records.*_key`; ImageNet's labels start at 1:
`data.records.label_offset=1`). Counts and labels are scanned once and cached
(`record_index.py`); they stream as `sharded_stream.py` says, a file a shard.
"""

from __future__ import annotations

import dataclasses
import glob
import os

import numpy as np
from absl import logging

import resnet_app.data.sources.record_index as record_index
from resnet_app.common.errors import ConfigError
from resnet_app.data.sources.base import Source, Split
from resnet_app.data.sources.registry import register_check, register_source
from resnet_app.data.sources.sharded_stream import ShardedStream

PREFIX = "tfrecord:"
SPLIT_PREFIXES = ("train", "validation", "test")  # A split's shards: "{split}-*".
READ_BUFFER_BYTES = 8 << 20


@dataclasses.dataclass(eq=False)
class TFRecordStream(ShardedStream):
    """One split's shards (`paths`, sorted); `label_offset` is subtracted from every label."""

    paths: np.ndarray
    image_key: str
    label_key: str
    label_offset: int

    def _records(self, shard, offset):
        import tensorflow as tf

        path = tf.gather(tf.constant(np.asarray(self.paths)), shard)
        file = tf.data.TFRecordDataset(path, buffer_size=READ_BUFFER_BYTES)
        return file.enumerate().map(lambda i, record: (offset + i, record))

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
        stream = TFRecordStream(0, total, index.counts, index.paths, *features)
        splits[split] = Split(split, total, labels=labels, stream=stream)
    return Source(name, class_names, None, splits)
