"""What a set of TFRecord shards holds, found once and cached: counts, labels and class texts.

Scanning reads every record (for ImageNet, most of 140 GB), so the result is kept in an
.npz file under the cache directory, keyed by the shards' names, sizes and modification
times and the feature keys, written atomically; a damaged or stale one is scanned again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np
from absl import logging

from resnet_app.common import files
from resnet_app.common.errors import ConfigError, first_line
from resnet_app.data import shapes

INDEX_VERSION = 1
SCAN_BATCH = 1024


@dataclasses.dataclass(frozen=True)
class ShardIndex:
    """The records of one split's shards (sorted), in file order: int64 `counts` per shard,
    int64 `labels` as stored (no offset), and {label: class text} from the text feature."""

    paths: tuple[str, ...]
    counts: np.ndarray
    labels: np.ndarray
    texts: dict[int, str]


def first_example_keys(path: str) -> dict[str, str]:
    """{feature key: kind} of the first record of a shard ("bytes", "int64" or "float").

    Raises:
      ConfigError: when the file is empty or not a TFRecord file of tf.train.Example.
    """
    import tensorflow as tf

    try:
        records = list(tf.data.TFRecordDataset(path).take(1).as_numpy_iterator())
        if not records:
            raise ConfigError(f"{path} holds no records; remove it or write it again")
        example = tf.train.Example.FromString(records[0])
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
        raise ConfigError(
            f"{path} is not a readable TFRecord file ({first_line(error)}); "
            "remove it or write it again"
        ) from None
    except Exception as error:  # protobuf's DecodeError: not a tf.train.Example.
        if type(error).__name__ != "DecodeError":
            raise
        raise ConfigError(f"{path} holds records that are not tf.train.Example protos") from None
    return {
        key: feature.WhichOneof("kind").replace("_list", "")
        for key, feature in example.features.feature.items()
    }


def _scan(paths: list[str], label_key: str, text_key: str | None) -> ShardIndex:
    import tensorflow as tf

    from resnet_app.data import options

    spec = {label_key: tf.io.FixedLenFeature([], tf.int64)}
    if text_key:
        spec[text_key] = tf.io.FixedLenFeature([], tf.string, default_value="")

    def read(index, path):
        def parse(batch):
            features = tf.io.parse_example(batch, spec)
            text = features[text_key] if text_key else tf.fill(tf.shape(batch), "")
            return index, features[label_key], text, False

        batches = tf.data.TFRecordDataset(path, buffer_size=8 << 20).batch(SCAN_BATCH)
        # A last element says the shard was read to its end: a failure is in one that was not.
        end = tf.data.Dataset.from_tensors(
            (index, tf.zeros([0], tf.int64), tf.zeros([0], tf.string), True)
        )
        return batches.map(parse).concatenate(end)

    def interleaved(indices):
        names = tf.data.Dataset.from_tensor_slices((indices, [paths[i] for i in indices]))
        return names.interleave(
            read, cycle_length=cycle, num_parallel_calls=cycle, deterministic=True
        )

    cycle = options.parallel_calls() * 2
    labels = [[] for _ in paths]
    texts: dict[int, str] = {}
    finished = set()
    try:
        for index, label, text, end in interleaved(np.arange(len(paths))).as_numpy_iterator():
            if end:
                finished.add(int(index))
                continue
            labels[index].append(label)
            if text_key:
                pairs = np.unique(np.stack([label.astype(str), text.astype(str)], 1), axis=0)
                for value, name in pairs:
                    previous = texts.setdefault(int(value), name)
                    if previous != name:
                        raise ConfigError(
                            f"{paths[index]}: label {value} has two class texts in "
                            f"{text_key!r}, {previous!r} and {name!r}; one label, one class"
                        )
    except tf.errors.OpError as error:
        # Interleaved, the error does not say whose it is: one of the first `cycle`
        # unfinished shards, each read again alone until one fails.
        suspects = [i for i in range(len(paths)) if i not in finished][:cycle]
        where = f"one of the TFRecord shards {', '.join(paths[i] for i in suspects)}"
        cause: Exception = error
        for i in suspects:
            try:
                for _ in interleaved(np.array([i])).as_numpy_iterator():
                    pass
            except tf.errors.OpError as failure:
                where, cause = f"the TFRecord shard {paths[i]}", failure
                break
        raise ConfigError(
            f"{where} cannot be read ({first_line(cause)}): it is corrupt, or its label "
            "feature is not one int64 per record; remove it or write it again"
        ) from None
    per_file = [np.concatenate(chunks) if chunks else np.zeros(0, np.int64) for chunks in labels]
    counts = np.array([len(values) for values in per_file], np.int64)
    texts = {label: text for label, text in texts.items() if text}
    return ShardIndex(tuple(paths), counts, np.concatenate(per_file).astype(np.int64), texts)


def load(
    paths: list[str], label_key: str, text_key: str | None, cache_dir: str | None = None
) -> ShardIndex:
    """The index of one split's sorted shards, from the cache when it is current, else
    scanned (and cached in `cache_dir`, default resnet_app's cache directory)."""
    keys = {"label": label_key, "text": text_key}
    stats = [(os.path.basename(path), os.stat(path)) for path in paths]
    shards = [[name, stat.st_size, stat.st_mtime_ns] for name, stat in stats]
    fingerprint = {"version": INDEX_VERSION, "keys": keys, "files": shards}
    fingerprint = json.dumps(fingerprint, sort_keys=True)
    key = json.dumps([os.path.abspath(paths[0]), len(paths), keys], sort_keys=True)
    name = f"{hashlib.sha1(key.encode()).hexdigest()[:16]}.npz"
    cache = os.path.join(cache_dir or shapes.default_cache_dir(), "tfrecord-index", name)

    def read(cached) -> ShardIndex | None:
        if str(cached["fingerprint"]) != fingerprint:
            return None  # Stale: the shards changed.
        texts = {int(label): text for label, text in json.loads(str(cached["texts"])).items()}
        return ShardIndex(tuple(paths), cached["counts"], cached["labels"], texts)

    index = files.read_cache(cache, read)
    if index is not None:
        return index
    logging.info(
        "Scanning %d TFRecord shards from %s (once; cached in %s)", len(paths), paths[0], cache
    )
    index = _scan(paths, label_key, text_key)
    texts = json.dumps({str(k): v for k, v in index.texts.items()})
    try:
        shapes.write_cache(
            cache, fingerprint=fingerprint, counts=index.counts, labels=index.labels, texts=texts
        )
    except OSError as error:
        logging.warning("Could not cache the TFRecord index in %s: %s", cache, error)
    return index
