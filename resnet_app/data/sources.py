"""Where examples come from: tfds datasets, image folders and `shapes`.

A `Source` holds a dataset's class names and its splits. Each `Split` is one of
three kinds, which decides how the pipeline reads it:
- "array": decoded uint8 images in memory (CIFAR-size tfds datasets, `shapes`).
  Random access by index.
- "files": image files on disk, read by path (or from memory when the folder is
  small). Random access by index.
- "records": a tfds dataset streamed from its record files (ImageNet-size data),
  with the images left encoded so that JPEG crops can be decoded partially.

Every failure a user can fix (an unknown name, a missing folder, no network, a
manual download that has not been done) raises `ConfigError` with one line that
says what to do.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import socket
from collections.abc import Callable

import numpy as np
from absl import logging

from resnet_app.common.errors import ConfigError, first_line
from resnet_app.data import shapes

FOLDER_PREFIX = "folder:"
FOLDER_EVAL_SPLITS = ("val", "validation", "test")
HOLDOUT_SPLIT = "holdout"
# A tfds split whose decoded images fit in this many bytes is held in memory.
IN_MEMORY_LIMIT_BYTES = 4 << 30
# A folder split whose files fit in this many bytes is read into memory once.
FOLDER_MEMORY_LIMIT_BYTES = 512 << 20
# Where to look for a network before asking tfds to download (it retries for
# minutes when offline). host:port; tests point it at a closed local port.
NETWORK_PROBE_ENV = "RESNET_APP_NETWORK_PROBE"
DEFAULT_NETWORK_PROBE = "storage.googleapis.com:443"


@dataclasses.dataclass
class Split:
    """One split of a source.

    Attributes:
      name: the split's name ("train", "test", "holdout", ...).
      num_examples: how many examples it holds.
      labels: int64 [num_examples] for "array" and "files" splits.
      images: "array" kind: uint8 [num_examples, H, W, 3].
      files: "files" kind: the image paths.
      contents: "files" kind, small folders: the files' bytes, read once.
      records: "records" kind: `records(shuffle_seed)` returns a tf.data.Dataset
        of {"image": encoded bytes, "label", "id"}, file order shuffled by the
        seed tensor, or in stored order when it is None.
    """

    name: str
    num_examples: int
    labels: np.ndarray | None = None
    images: np.ndarray | None = None
    files: np.ndarray | None = None
    contents: np.ndarray | None = None
    records: Callable | None = None

    @property
    def encoded(self) -> bool:
        """Whether images are encoded bytes (files, records) rather than pixels."""
        return self.kind != "array"

    @property
    def kind(self) -> str:
        if self.images is not None:
            return "array"
        if self.files is not None:
            return "files"
        return "records"

    def subset(self, indices: np.ndarray, name: str | None = None) -> Split:
        """The examples at `indices` (array and files kinds only)."""

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

    def split(self, name: str) -> Split:
        if name not in self.splits:
            raise ConfigError(
                f"dataset {self.name!r} has no split {name!r}; it has {', '.join(self.splits)}"
            )
        return self.splits[name]

    def default_eval_split(self) -> str:
        for name in (HOLDOUT_SPLIT, "validation", "val", "test"):
            if name in self.splits:
                return name
        raise ConfigError(
            f"dataset {self.name!r} has no split to evaluate on (only "
            f"{', '.join(self.splits)}); use --validation_split=N to hold out N examples"
        )


# Which training examples are held out; fixed, so it never follows the run's seed.
HOLDOUT_SEED = 20151210


def hold_out(source: Source, count: int) -> Source:
    """Moves `count` training examples into a new "holdout" split.

    The held-out examples are drawn at random with their own fixed seed, so the
    same examples are held out whatever the training seed (He et al. hold out
    5,000 of CIFAR-10's 50,000 this way). Stream ("records") splits hold out
    their last `count` examples, through tfds's split slicing.

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
    if train.kind == "records":
        splits["train"] = train.records.slice_split(None, -count)
        splits[HOLDOUT_SPLIT] = train.records.slice_split(-count, None, HOLDOUT_SPLIT)
    else:
        order = np.random.default_rng(HOLDOUT_SEED).permutation(train.num_examples)
        splits["train"] = train.subset(np.sort(order[count:]))
        splits[HOLDOUT_SPLIT] = train.subset(np.sort(order[:count]), HOLDOUT_SPLIT)
    return dataclasses.replace(source, splits=splits)


# ---------------------------------------------------------------------------
# shapes


def load_shapes(
    cache_dir: str | None = None,
    train_examples: int | None = None,
    test_examples: int | None = None,
) -> Source:
    """The built-in `shapes` dataset (see `data/shapes.py`), generated or cached."""
    splits = {}
    for name, count in (("train", train_examples), ("test", test_examples)):
        images, labels = shapes.load(name, count, cache_dir=cache_dir)
        splits[name] = Split(name, len(labels), labels=labels, images=images)
    return Source("shapes", list(shapes.CLASS_NAMES), shapes.IMAGE_SIZE, splits)


# ---------------------------------------------------------------------------
# image folders

_MAGIC = {
    b"\xff\xd8\xff": "jpeg",
    b"\x89PNG\r\n\x1a\n": "png",
    b"GIF87a": "gif",
    b"GIF89a": "gif",
    b"BM": "bmp",
}


def sniff_image(path: str) -> str | None:
    """The format of an image file from its bytes, or None if it is unreadable.

    Looks at the first bytes (the format's magic number, whatever the file's
    extension says) and at the last kilobyte, where a complete JPEG, PNG or GIF
    has its end marker; a BMP must be as long as its header says. This catches
    empty, foreign and truncated files without decoding the image.

    Args:
      path: the file.

    Returns:
      "jpeg", "png", "gif", "bmp", or None.
    """
    return _inspect(path)[0]


def _inspect(path: str) -> tuple[str | None, int]:
    """`sniff_image`'s answer and the file's size in bytes (0 if unreadable)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as file:
            head = file.read(16)
            file.seek(max(0, size - 1024))
            tail = file.read()
    except OSError:
        return None, 0
    kind = next((name for magic, name in _MAGIC.items() if head.startswith(magic)), None)
    complete = {
        "jpeg": b"\xff\xd9" in tail,
        "png": b"IEND" in tail,
        "gif": b";" in tail[-16:],
        "bmp": len(head) >= 6 and size >= int.from_bytes(head[2:6], "little"),
    }
    return (kind if kind and complete[kind] else None), size


def _list_folder_split(root: str, split: str, class_names: list[str]) -> tuple[list, list]:
    paths, labels = [], []
    split_dir = os.path.join(root, split)
    for entry in sorted(os.listdir(split_dir)):
        class_dir = os.path.join(split_dir, entry)
        if entry.startswith(".") or not os.path.isdir(class_dir):
            continue
        if entry not in class_names:
            raise ConfigError(
                f"{class_dir} is a class that train/ does not have; every split of "
                f"folder:{root} must use the classes of train/"
            )
        label = class_names.index(entry)
        for name in sorted(os.listdir(class_dir)):
            path = os.path.join(class_dir, name)
            if not name.startswith(".") and os.path.isfile(path):
                paths.append(path)
                labels.append(label)
    return paths, labels


def load_folder(root: str) -> Source:
    """An image folder in the ImageNet layout: `root/<split>/<class>/<image>`.

    Class names are the sorted directory names of `root/train`. Files that are
    not complete JPEG, PNG, BMP or GIF images are skipped and counted, and the
    count is logged once. A folder small enough is read into memory once.

    Args:
      root: the folder, with a `train` subdirectory and optionally `val`,
        `validation` or `test`.

    Returns:
      The source, with "files" splits.
    """
    name = FOLDER_PREFIX + root
    if not os.path.isdir(root):
        raise ConfigError(f"--dataset={name}: {root} is not a directory")
    split_names = sorted(
        entry for entry in os.listdir(root) if os.path.isdir(os.path.join(root, entry))
    )
    if "train" not in split_names:
        raise ConfigError(
            f"--dataset={name}: no train/ in {root}; expected {root}/train/<class>/<image> "
            f"(and optionally {root}/val/<class>/<image>)"
        )
    train_dir = os.path.join(root, "train")
    class_names = sorted(
        entry
        for entry in os.listdir(train_dir)
        if not entry.startswith(".") and os.path.isdir(os.path.join(train_dir, entry))
    )
    if not class_names:
        raise ConfigError(f"--dataset={name}: {train_dir} has no class subdirectories")

    splits, skipped, total, first_bad = {}, 0, 0, None
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for split in ["train"] + [s for s in FOLDER_EVAL_SPLITS if s in split_names]:
            paths, labels = _list_folder_split(root, split, class_names)
            formats, sizes = zip(*pool.map(_inspect, paths)) if paths else ((), ())
            good = [i for i, kind in enumerate(formats) if kind is not None]
            bad = [paths[i] for i, kind in enumerate(formats) if kind is None]
            skipped, total = skipped + len(bad), total + len(paths)
            first_bad = first_bad or (bad[0] if bad else None)
            if not good:
                raise ConfigError(f"--dataset={name}: no readable images in {root}/{split}")
            files = np.array([paths[i] for i in good])
            contents = None
            if sum(sizes[i] for i in good) <= FOLDER_MEMORY_LIMIT_BYTES:
                contents = np.array(list(pool.map(_read_bytes, files)), dtype=object)
            splits[split] = Split(
                split,
                len(files),
                labels=np.array([labels[i] for i in good], np.int64),
                files=files,
                contents=contents,
            )
    if skipped:
        logging.warning(
            "%s: skipped %d of %d files that are not complete JPEG, PNG, BMP or GIF "
            "images (the first: %s)",
            name,
            skipped,
            total,
            first_bad,
        )
    return Source(name, class_names, None, splits)


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


# ---------------------------------------------------------------------------
# tfds


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


def _prepare(builder, name: str, data_dir: str) -> None:
    """Downloads and prepares a tfds dataset, or explains why it cannot."""
    import tensorflow_datasets as tfds

    if builder.MANUAL_DOWNLOAD_INSTRUCTIONS:
        manual_dir = os.path.join(data_dir, "downloads", "manual")
        present = os.path.isdir(manual_dir) and os.listdir(manual_dir)
        if not present:
            hint = " ".join(str(builder.MANUAL_DOWNLOAD_INSTRUCTIONS).split())
            if len(hint) > 300:
                hint = hint[:297] + "..."
            raise ConfigError(
                f"dataset {name!r} is not prepared in {data_dir} and needs a manual download: "
                f"put its files in {manual_dir} ({hint}), or pass --data_dir=DIR where it is "
                f"prepared"
            )
    elif not network_available():
        raise ConfigError(
            f"dataset {name!r} is not prepared in {data_dir} and there is no network to "
            f"download it: prepare it on a machine online (tfds build {name} "
            f"--data_dir=DIR), copy DIR here and pass --data_dir=DIR, or use --dataset=shapes"
        )
    logging.info("Downloading and preparing %s into %s", name, data_dir)
    try:
        builder.download_and_prepare()
    except (OSError, ConnectionError, tfds.core.DatasetNotFoundError) as error:
        raise ConfigError(f"preparing dataset {name!r} in {data_dir} failed: {error}") from None
    except Exception as error:  # requests' and tfds's download errors have no common base.
        if type(error).__module__.split(".")[0] not in (
            "requests",
            "urllib3",
            "tensorflow_datasets",
        ):
            raise
        raise ConfigError(
            f"downloading dataset {name!r} failed ({type(error).__name__}: {error}); check "
            f"the network or prepare it elsewhere and pass --data_dir=DIR"
        ) from None


class _RecordSplit:
    """Streams examples [begin, end) of one tfds split, images left encoded."""

    def __init__(self, builder, split, image_key, label_key, shard_offsets, begin, end):
        self.builder, self.split = builder, split
        self.image_key, self.label_key = image_key, label_key
        self.shard_offsets = shard_offsets
        self.begin, self.end = begin, end

    def slice_split(self, start: int | None, stop: int | None, name: str | None = None) -> Split:
        """Examples [start:stop] of this range (Python slice semantics), as a Split."""
        part = range(self.begin, self.end)[start:stop]
        piece = _RecordSplit(
            self.builder,
            self.split,
            self.image_key,
            self.label_key,
            self.shard_offsets,
            part.start,
            part.stop,
        )
        return Split(name or self.split, len(part), records=piece)

    def __call__(self, shuffle_seed):
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
            # tfds ids look like "cifar10-train.tfrecord-00003-of-00016__1234":
            # shard 3, record 1234 of that shard.
            tfds_id = example["tfds_id"]
            shard = tf.strings.regex_replace(tfds_id, r"^.*-(\d+)-of-\d+__\d+$", r"\1")
            shard = tf.strings.to_number(shard, tf.int64)
            index = tf.strings.regex_replace(tfds_id, r"^.*__(\d+)$", r"\1")
            # The position in the whole split, then in this range of it.
            position = tf.gather(offsets, shard) + tf.strings.to_number(index, tf.int64)
            return {
                "image": example[self.image_key],
                "label": tf.cast(example[self.label_key], tf.int64),
                "id": position - self.begin,
            }

        return dataset.map(tf.autograph.experimental.do_not_convert(to_example))


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


def load_tfds(name: str, data_dir: str | None = None) -> Source:
    """A tfds image-classification dataset, downloaded and prepared if needed.

    Args:
      name: a tfds name, optionally with config and version ("cifar10",
        "imagenet2012", "imagenette/320px-v2").
      data_dir: the tfds data directory (default: $TFDS_DATA_DIR or
        ~/tensorflow_datasets).

    Returns:
      The source.
    """
    import tensorflow_datasets as tfds

    data_dir = tfds_data_dir(data_dir)
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise ConfigError(
            f"unknown dataset {name!r}: use shapes, synthetic, folder:PATH or a tfds name "
            f"(cifar10, cifar100, imagenet2012, imagenette, ...)"
        ) from None
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
        # Splits whose decoded images fit in memory are held there as arrays;
        # larger ones are streamed.
        if static and split_info.num_examples * int(np.prod(shape)) <= IN_MEMORY_LIMIT_BYTES:
            data = tfds.as_numpy(builder.as_dataset(split=split_name, batch_size=-1))
            images, labels = data[image_key], data[label_key]
            if images.shape[-1] == 1:  # Grayscale (MNIST and friends): to RGB.
                images = np.repeat(images, 3, axis=-1)
            splits[split_name] = Split(
                split_name, len(labels), labels=labels.astype(np.int64), images=images
            )
        else:
            # Example ids of streamed splits come from the shard lengths.
            lengths = split_info.shard_lengths or [split_info.num_examples]
            offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
            records = _RecordSplit(
                builder, split_name, image_key, label_key, offsets, 0, split_info.num_examples
            )
            splits[split_name] = Split(split_name, split_info.num_examples, records=records)
    if "train" not in splits:
        raise ConfigError(f"dataset {name!r} has no train split (it has {', '.join(splits)})")
    class_names = list(label_feature.names) if hasattr(label_feature, "names") else []
    return Source(
        name,
        class_names or [str(i) for i in range(label_feature.num_classes)],
        shape[0] if static else None,
        splits,
    )
