"""tfds datasets: `--dataset=NAME` (cifar10, imagenet2012, imagenette/320px-v2, ...).

Splits whose decoded images fit in memory are held there as arrays, larger ones streamed
from tfds's record files (`TfdsStream`). A dataset not prepared is downloaded and
prepared; a failure a user can fix (an unknown name, no network, a manual download not
done) is one line, where tfds would retry a download for minutes when offline.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import os
import re
import socket
from typing import Any

import numpy as np
from absl import logging

import resnet_app.data.sources.cifar as cifar
from resnet_app.common.errors import ConfigError, first_line
from resnet_app.data.sources.base import RecordStream, Source, Split, clear_graph_seed
from resnet_app.data.sources.registry import (
    TFDS_SCHEME,
    register_check,
    register_source,
    scheme_names,
    usages,
)

IN_MEMORY_LIMIT_BYTES = 4 << 30  # A split whose decoded images fit is held in memory.
# Probed before asking tfds to download (host:port; tests point it at a closed port).
NETWORK_PROBE_ENV = "RESNET_APP_NETWORK_PROBE"
DEFAULT_NETWORK_PROBE = "storage.googleapis.com:443"


def network_available(timeout: float = 3.0) -> bool:
    """Whether the download host answers, within `timeout` seconds."""
    host, _, port = os.environ.get(NETWORK_PROBE_ENV, DEFAULT_NETWORK_PROBE).rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except (OSError, ValueError):
        return False
    return True


def tfds_data_dir(data_dir: str | None) -> str:
    """The tfds data directory: --data_dir, $TFDS_DATA_DIR or ~/tensorflow_datasets."""
    default = os.path.join(os.path.expanduser("~"), "tensorflow_datasets")
    return data_dir or os.environ.get("TFDS_DATA_DIR") or default


def _offline(
    name: str, data_dir: str, manual: str | None = None, places: list[str] | None = None
) -> ConfigError:
    """The offline refusal, naming where a manual download's files go (`manual`) or where
    CIFAR's archive would be read from (`places`)."""
    if places:
        classes = cifar.TFDS_NAMES[name]
        tarballs = f"cifar-{classes}-python.tar.gz or cifar-{classes}-binary.tar.gz"
        where = f"; or put its archive ({tarballs}) in {' or '.join(places)}; or"
    elif manual:
        where = f"; for a manual download (imagenet2012), put its files in {manual}; or"
    else:
        where = ", or"
    return ConfigError(
        f"dataset {name!r} is not prepared in {data_dir} and there is no network to "
        f"download it: prepare it on a machine online (tfds build {name} "
        f"--data_dir=DIR), copy DIR here and pass --data_dir=DIR{where} use --dataset=shapes"
    )


# tfds's rule for a builder's name from its class name (`naming.camelcase_to_snakecase`).
_FIRST_CAP = re.compile(r"(.)([A-Z][a-z0-9]+)")
_ALL_CAP = re.compile(r"([a-z0-9])([A-Z])")
_CLASS = re.compile(r"^class (\w+)\(", re.MULTILINE)
_VERSION = re.compile(r"\d+(\.\d+)*")
_NOT_DATASETS = ("__pycache__", "core", "scripts", "testing")


@functools.cache
def known_names() -> frozenset[str]:
    """Every name a tfds dataset may have, from the installed package's files (empty
    without tfds): folder, module and checksum file names, and class names turned into
    builder names as tfds does. A superset of `tfds.list_builders`, which imports TensorFlow.
    """
    spec = importlib.util.find_spec("tensorflow_datasets")
    if spec is None or not spec.origin:
        return frozenset()
    names = set()
    for folder, subfolders, files in os.walk(os.path.dirname(spec.origin)):
        subfolders[:] = [d for d in subfolders if d not in _NOT_DATASETS]
        names.update(subfolders)
        for file in files:
            stem, extension = os.path.splitext(file)
            names.add(stem)
            if extension == ".py" and not stem.endswith("_test"):
                with open(os.path.join(folder, file), encoding="utf-8", errors="replace") as f:
                    for cls in _CLASS.findall(f.read()):
                        names.add(_ALL_CAP.sub(r"\1_\2", _FIRST_CAP.sub(r"\1_\2", cls)).lower())
    return frozenset(names)


@register_check(TFDS_SCHEME)
def check(name: str, config) -> None:
    """Refuses, without TensorFlow, a tfds name that is unknown (naming the nearest) or
    cannot be downloaded. A dataset in the data directory or with manual-download files, a
    name's config and version ("imagenette/320px-v2", "cifar10:3.0.2") and community names
    ("huggingface:mnist") are left to tfds.
    """
    base, colon, version = name.partition(":")
    if colon and not _VERSION.fullmatch(version):
        return
    if name in cifar.TFDS_NAMES:
        archive = cifar_archive(name, config)
        if archive is not None:
            cifar.check(archive.path, config)
        return
    dataset = base.split("/")[0]
    data_dir = tfds_data_dir(config.data_dir)
    if os.path.isdir(os.path.join(data_dir, dataset)):
        return
    known = known_names()
    if known and dataset not in known:
        close = difflib.get_close_matches(dataset, [*known, *scheme_names()], n=3)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise ConfigError(f"unknown dataset {name!r}{hint}: use {usages()}")
    manual = os.path.join(data_dir, "downloads", "manual")
    if colon or "/" in base or (os.path.isdir(manual) and os.listdir(manual)):
        return  # A config or version, or manual files: tfds checks those.
    if not network_available():
        raise _offline(name, data_dir, manual)


def cifar_archive(name: str, config) -> cifar.Archive | None:
    """CIFAR's own archive for tfds's `cifar10` or `cifar100`, or None when tfds has or can
    prepare the dataset. Looked for where a user copies it (`cifar.archive_places`) when
    tfds has not prepared it and there is no network, or `data.coarse_labels` asks for the
    archive's labels; the same answer serves the check before TensorFlow and the load.

    Raises:
      ConfigError: offline with no archive there, naming where to put one.
    """
    data_dir = tfds_data_dir(config.data_dir)
    folder = os.path.join(data_dir, name)  # Prepared: a version's dataset_info.json there.
    prepared = os.path.isdir(folder) and any(
        os.path.isfile(os.path.join(folder, version, "dataset_info.json"))
        for version in os.listdir(folder)
    )
    if not config.coarse_labels and (prepared or network_available()):
        return None
    places = cifar.archive_places(config.data_dir, data_dir)
    found = cifar.find_archive(cifar.TFDS_NAMES[name], places)
    usual = cifar.usual_places(config.data_dir, data_dir)
    if found is None and config.coarse_labels:
        raise ConfigError(
            f"data.coarse_labels reads CIFAR-100's archive, and there is none in "
            f"{' or '.join(usual)}: put cifar-100-python.tar.gz or cifar-100-binary.tar.gz "
            "there, or pass --dataset=cifar:PATH"
        )
    if found is None:
        raise _offline(name, data_dir, places=usual)
    return found


_DOWNLOAD_ERROR_MODULES = ("requests", "urllib3", "tensorflow_datasets")


def _prepare(builder, name: str, data_dir: str) -> None:
    """Downloads and prepares a tfds dataset, or explains why it cannot."""
    import tensorflow_datasets as tfds

    if builder.MANUAL_DOWNLOAD_INSTRUCTIONS:
        manual_dir = os.path.join(data_dir, "downloads", "manual")
        if not (os.path.isdir(manual_dir) and os.listdir(manual_dir)):
            hint = " ".join(str(builder.MANUAL_DOWNLOAD_INSTRUCTIONS).split())
            if len(hint) > 300:
                hint = hint[:297] + "..."
            raise ConfigError(
                f"dataset {name!r} is not prepared in {data_dir} and needs a manual download: "
                f"put its files in {manual_dir} ({hint}), or pass --data_dir=DIR where it is "
                f"prepared"
            )
    elif not network_available():
        raise _offline(name, data_dir)
    logging.info("Downloading and preparing %s into %s", name, data_dir)
    try:
        builder.download_and_prepare()
    except (OSError, ConnectionError, tfds.core.DatasetNotFoundError) as error:
        raise ConfigError(f"preparing dataset {name!r} in {data_dir} failed: {error}") from None
    except Exception as error:  # requests' and tfds's download errors have no common base.
        if type(error).__module__.split(".")[0] not in _DOWNLOAD_ERROR_MODULES:
            raise
        raise ConfigError(
            f"downloading dataset {name!r} failed ({type(error).__name__}: {error}); check "
            f"the network or prepare it elsewhere and pass --data_dir=DIR"
        ) from None


@dataclasses.dataclass(eq=False)
class TfdsStream(RecordStream):
    """Examples [begin, end) of one tfds split, images left encoded; `shard_offsets` are
    the ids of each record file's first example."""

    builder: Any
    split: str
    image_key: str
    label_key: str
    shard_offsets: np.ndarray

    def records(self, shuffle_seed):
        """The examples, file order shuffled by the seed tensor (None: stored order)."""
        import tensorflow as tf
        import tensorflow_datasets as tfds

        read_config = tfds.ReadConfig(
            shuffle_seed=shuffle_seed,
            add_tfds_id=True,
            interleave_cycle_length=16,
            enable_ordering_guard=False,
        )
        dataset = self.builder.as_dataset(
            split=f"{self.split}[{self.begin}:{self.end}]",
            shuffle_files=shuffle_seed is not None,
            read_config=read_config,
            decoders={self.image_key: tfds.decode.SkipDecoding()},
        )
        offsets = tf.constant(self.shard_offsets, tf.int64)

        def to_example(example):
            # A tfds id "cifar10-train.tfrecord-00003-of-00016__1234" is record 1234 of shard 3.
            tfds_id = example["tfds_id"]
            shard = tf.strings.regex_replace(tfds_id, r"^.*-(\d+)-of-\d+__\d+$", r"\1")
            shard = tf.strings.to_number(shard, tf.int64)
            index = tf.strings.regex_replace(tfds_id, r"^.*__(\d+)$", r"\1")
            position = tf.gather(offsets, shard) + tf.strings.to_number(index, tf.int64)
            return {
                "image": example[self.image_key],
                "label": tf.cast(example[self.label_key], tf.int64),
                "id": position - self.begin,
            }

        return dataset.map(tf.autograph.experimental.do_not_convert(to_example))

    def training(self, seed, start_example, num_shards, shard_index, buffer):
        """Each epoch: tfds's file shuffle and a shuffle buffer, both seeded by (seed, epoch).

        Every pipeline reads every record and keeps the positions congruent to `shard_index`
        modulo `num_shards`, so the pipelines' batches of a step are the one batch a single
        pipeline makes. Entering mid-epoch skips encoded records: nothing before is decoded.
        """
        import tensorflow as tf

        from resnet_app.data import seeds

        first_epoch, offset = divmod(start_example, self.end - self.begin)

        def epoch_records(epoch):
            clear_graph_seed()
            file_seed, buffer_seed = tf.unstack(seeds.stream_seed(seed, seeds.RECORDS, epoch))
            records = self.records(file_seed).shuffle(buffer, seed=buffer_seed)
            return records.map(lambda x: (epoch, x["id"], x["image"], x["label"]))

        # tfds builds its reader inside flat_map; autograph has nothing to do there.
        epoch_records = tf.autograph.experimental.do_not_convert(epoch_records)
        stream = tf.data.Dataset.range(first_epoch, 1 << 62).flat_map(epoch_records)
        return stream.skip(offset).shard(num_shards, shard_index)

    def evaluation(self, num_shards, shard_index):
        return self.records(None).shard(num_shards, shard_index)


def _image_and_label_keys(info) -> tuple[str | None, str | None]:
    """The image and label features: the supervised keys, else the only pair."""
    import tensorflow_datasets as tfds

    features = info.features
    keys = info.supervised_keys
    if keys and len(keys) == 2 and all(isinstance(key, str) for key in keys):
        image, label = (features[key] for key in keys)
        if isinstance(image, tfds.features.Image) and isinstance(label, tfds.features.ClassLabel):
            return keys
    if not isinstance(features, tfds.features.FeaturesDict):
        return None, None
    images = [k for k, f in features.items() if isinstance(f, tfds.features.Image)]
    labels = [k for k, f in features.items() if isinstance(f, tfds.features.ClassLabel)]
    if len(images) == 1 and len(labels) == 1:
        return images[0], labels[0]
    return None, None


@register_source(TFDS_SCHEME, usage="a tfds name (cifar10, imagenet2012, ...)")
def load(name: str, config) -> Source:
    """A tfds image-classification dataset ("cifar10", "imagenette/320px-v2"), downloaded
    and prepared if needed (CIFAR's own archive when tfds cannot give it)."""
    archive = cifar_archive(name, config) if name in cifar.TFDS_NAMES else None
    if archive is not None:
        why = f"not prepared in {tfds_data_dir(config.data_dir)}, and no network"
        why = "data.coarse_labels" if config.coarse_labels else why
        logging.info("%s: reading CIFAR's own archive %s (%s)", name, archive.path, why)
        return cifar.load_archive(archive.path, archive, config, name=name)
    import tensorflow_datasets as tfds

    data_dir = tfds_data_dir(config.data_dir)
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise ConfigError(f"unknown dataset {name!r}: use {usages()}") from None
    except (ValueError, AssertionError, KeyError) as error:
        # A bad config or version: "cifar10/nope", "cifar10:9.9.9".
        raise ConfigError(
            f"cannot load tfds dataset {name!r} ({first_line(error, with_type=True)}); "
            f"check the name's config and version, e.g. cifar10 or imagenette/320px-v2"
        ) from None
    info = builder.info
    image_key, label_key = _image_and_label_keys(info)
    if image_key is None:
        raise ConfigError(f"dataset {name!r} is not an image-classification dataset in tfds")
    if not builder.is_prepared():
        _prepare(builder, name, data_dir)
        info = builder.info
    image_feature, label_feature = info.features[image_key], info.features[label_key]
    shape = tuple(image_feature.shape)
    static = None not in shape and shape[0] == shape[1]

    splits = {}
    for split_name, split_info in info.splits.items():
        if static and split_info.num_examples * int(np.prod(shape)) <= IN_MEMORY_LIMIT_BYTES:
            data = tfds.as_numpy(builder.as_dataset(split=split_name, batch_size=-1))
            labels = data[label_key].astype(np.int64)
            splits[split_name] = Split(split_name, len(labels), labels, data[image_key])
        else:
            lengths = split_info.shard_lengths or [split_info.num_examples]
            offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
            stream = TfdsStream(
                0, split_info.num_examples, builder, split_name, image_key, label_key, offsets
            )
            splits[split_name] = Split(split_name, split_info.num_examples, stream=stream)
    if "train" not in splits:
        raise ConfigError(f"dataset {name!r} has no train split (it has {', '.join(splits)})")
    class_names = list(label_feature.names) if hasattr(label_feature, "names") else []
    class_names = class_names or [str(i) for i in range(label_feature.num_classes)]
    return Source(name, class_names, shape[0] if static else None, splits)
