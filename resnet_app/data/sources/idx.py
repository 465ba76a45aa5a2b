"""`--dataset=idx:DIR`: the MNIST family's IDX files (MNIST, Fashion-MNIST, KMNIST, EMNIST).

DIR holds `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`
and `t10k-labels-idx1-ubyte`, gzipped (`.gz`) or not; any file whose name ends so counts
(EMNIST's `emnist-balanced-train-images-idx3-ubyte.gz`, `test` for `t10k`), and a directory
of several sets is named with the set's prefix: `idx:DIR/emnist-balanced`. A file is a
4-byte magic number (two zero bytes, type 0x08 for unsigned bytes, the number of
dimensions), big-endian int32 sizes, then the bytes.

Images are greyscale uint8 [N, H, W, 1] (EMNIST's, stored transposed, read upright).
Classes: `data.class_names`, else Fashion-MNIST's names when "fashion" is in the
directory's or files' names, else the ids 0 to `data.num_classes` - 1.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib

import numpy as np
from absl import logging

from resnet_app.common.errors import ConfigError, first_line
from resnet_app.data.sources.base import Source, Split
from resnet_app.data.sources.registry import register_check, register_source

DEBIAN_DATASETS = "/usr/share/datasets/"  # Where dataset-fashion-mnist puts its files.
PREFIX = "idx:"
# (split, what) -> the endings a file's name may have, without ".gz".
ROLES = {
    ("train", "images"): ("train-images-idx3-ubyte",),
    ("train", "labels"): ("train-labels-idx1-ubyte",),
    ("test", "images"): ("t10k-images-idx3-ubyte", "test-images-idx3-ubyte"),
    ("test", "labels"): ("t10k-labels-idx1-ubyte", "test-labels-idx1-ubyte"),
}
DIMENSIONS = {"images": 3, "labels": 1}
UBYTE = 0x08
FASHION_CLASSES = (
    *("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat"),
    *("Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
)


def _listing(argument: str, directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError as error:
        raise ConfigError(
            f"--dataset={PREFIX}{argument}: {directory} cannot be listed ({first_line(error)})"
        ) from None


def _locate(argument: str) -> tuple[str, str]:
    """(the directory, the files' name prefix) of `idx:DIR` or `idx:DIR/PREFIX`."""
    if os.path.isdir(argument):
        return argument, ""
    directory, prefix = os.path.split(argument.rstrip("/"))
    directory = directory or "."
    if (
        prefix
        and os.path.isdir(directory)
        and any(name.startswith(prefix) for name in _listing(argument, directory))
    ):
        return directory, prefix
    hint = ""
    if os.path.abspath(argument).startswith(DEBIAN_DATASETS):
        hint = f"; Debian's packages put them in {DEBIAN_DATASETS}: apt-get install " + (
            "dataset-fashion-mnist for Fashion-MNIST"
        )
    raise ConfigError(
        f"--dataset={PREFIX}{argument}: {argument} is not a directory (nor the name prefix "
        "of IDX files in one); give the directory of the IDX files "
        f"(train-images-idx3-ubyte[.gz] and the others){hint}"
    )


def _pick(argument: str, directory: str, names: list[str], endings: tuple[str, ...]) -> str:
    """The one file among `names` for a role; a plain file is preferred to its `.gz`."""
    plain = {name.removesuffix(".gz") for name in names}
    stems = sorted(stem for stem in plain if stem.endswith(endings))
    if len(stems) > 1:
        sets = [stem[: -len(next(e for e in endings if stem.endswith(e)))] for stem in stems]
        example = next((s.rstrip("-") for s in sets if s.rstrip("-")), "PREFIX")
        raise ConfigError(
            f"--dataset={PREFIX}{argument}: {directory} holds {len(stems)} sets of IDX files "
            f"({', '.join(stems)}); pick one by its name's prefix, e.g. "
            f"--dataset={PREFIX}{os.path.join(directory, example)}"
        )
    if not stems:
        raise ConfigError(
            f"--dataset={PREFIX}{argument}: no {endings[0]} (or .gz) in {directory}; "
            "it needs train-images-idx3-ubyte, train-labels-idx1-ubyte, "
            "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, gzipped or not"
        )
    return os.path.join(directory, stems[0] if stems[0] in names else stems[0] + ".gz")


def _read(argument: str, path: str, size: int = -1) -> bytes:
    """The first `size` bytes of a file (all: -1), gunzipped when its name ends in .gz."""
    gzipped = path.endswith(".gz")
    try:
        with (gzip.open if gzipped else open)(path, "rb") as file:
            return file.read(size)
    except (OSError, EOFError, zlib.error) as error:
        raise ConfigError(
            f"--dataset={PREFIX}{argument}: {path} is not "
            f"{'a readable gzip file' if gzipped else 'readable'} ({first_line(error)}); "
            "download it again"
        ) from None


def _check_header(argument: str, path: str, header: bytes, what: str) -> tuple[int, ...]:
    """The sizes an IDX header gives; refuses a wrong magic number, type or rank."""
    ndim = DIMENSIONS[what]
    if len(header) < 4 or header[:2] != b"\0\0":
        raise ConfigError(
            f"--dataset={PREFIX}{argument}: {path} is not an IDX file (its first bytes are "
            f"{header[:4].hex() or 'missing'}, not 0000080{ndim}); download it again"
        )
    if header[2] != UBYTE or header[3] != ndim:
        raise ConfigError(
            f"--dataset={PREFIX}{argument}: {path} holds type 0x{header[2]:02x} in "
            f"{header[3]} dimensions; {what} need unsigned bytes (0x08) in {ndim}"
        )
    if len(header) < 4 + 4 * ndim:
        raise ConfigError(f"--dataset={PREFIX}{argument}: {path} is cut short in its header")
    # Big-endian 32-bit sizes, read unsigned: a damaged one is too large, never negative.
    return tuple(int(n) for n in np.frombuffer(header, ">u4", ndim, 4))


@register_check("idx")
def check(argument: str, config=None) -> dict[tuple[str, str], str]:
    """The four files by (split, "images" or "labels"), each header checked (only the first
    bytes are read): refuses a missing file, several sets for a role, a wrong header."""
    directory, prefix = _locate(argument)
    names = [name for name in _listing(argument, directory) if name.startswith(prefix)]
    files = {role: _pick(argument, directory, names, ends) for role, ends in ROLES.items()}
    for (_, what), path in files.items():
        _check_header(argument, path, _read(argument, path, 4 + 4 * DIMENSIONS[what]), what)
    return files


def read_idx(argument: str, path: str, what: str) -> np.ndarray:
    """The array of one IDX file of `what` ("images", N x H x W, or "labels", N), gzipped
    or not, its header and size checked."""
    data = _read(argument, path)
    shape = _check_header(argument, path, data, what)
    start = 4 + 4 * len(shape)
    expected = start + math.prod(shape)
    if len(data) != expected:
        short = len(data) < expected
        raise ConfigError(
            f"--dataset={PREFIX}{argument}: {path} is {'cut short' if short else 'too long'}: "
            f"{len(data)} bytes where its header ({' x '.join(map(str, shape))}) needs "
            f"{expected}; download it again"
        )
    return np.frombuffer(data, np.uint8, offset=start).reshape(shape)


def _class_names(directory: str, files: dict, config) -> list[str]:
    if config.class_names:
        return list(config.class_names)
    named = [os.path.basename(os.path.abspath(directory))]
    named += [os.path.basename(path) for path in files.values()]
    if any("fashion" in name.lower() for name in named):
        return list(FASHION_CLASSES)
    return [str(i) for i in range(config.num_classes)]


def _split(argument: str, name: str, files: dict, classes: list[str]) -> Split:
    image_path, label_path = files[(name, "images")], files[(name, "labels")]
    images = read_idx(argument, image_path, "images")
    labels = read_idx(argument, label_path, "labels").astype(np.int64)
    if len(images) != len(labels):
        raise ConfigError(
            f"--dataset={PREFIX}{argument}: {image_path} holds {len(images)} images but "
            f"{label_path} {len(labels)} labels; the two must come from one download"
        )
    if len(labels) and labels.max() >= len(classes):
        raise ConfigError(
            f"--dataset={PREFIX}{argument}: {label_path} has label {labels.max()}, outside "
            f"the {len(classes)} classes 0 to {len(classes) - 1}: set data.num_classes="
            f"{labels.max() + 1} or list the names in data.class_names"
        )
    if os.path.basename(image_path).lower().startswith("emnist"):
        images = images.transpose(0, 2, 1)  # EMNIST stores its images transposed.
    images = images[..., None]  # One channel: greyscale.
    return Split(name, len(labels), labels=labels, images=images)


@register_source("idx", usage="idx:DIR")
def load(argument: str, config) -> Source:
    """The IDX files of `DIR` or `DIR/PREFIX` as in-memory "train" and "test"."""
    files = check(argument, config)
    for path in files.values():
        if not path.endswith(".gz") and os.path.exists(path + ".gz"):
            logging.info("%s: reading %s, not its gzipped copy .gz", PREFIX + argument, path)
    classes = _class_names(_locate(argument)[0], files, config)
    splits = {name: _split(argument, name, files, classes) for name in ("train", "test")}
    sizes = {split.images.shape[1:3] for split in splits.values()}
    if len(sizes) > 1:
        raise ConfigError(
            f"--dataset={PREFIX}{argument}: the train and test images differ in size "
            f"({' and '.join('x'.join(map(str, s)) for s in sorted(sizes))})"
        )
    height, width = sizes.pop()
    return Source(PREFIX + argument, classes, height if height == width else None, splits)
