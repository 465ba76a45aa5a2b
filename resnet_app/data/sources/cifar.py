"""`--dataset=cifar:PATH`: the CIFAR-10 and CIFAR-100 archives as their authors distribute them.

PATH is a tarball as downloaded (`cifar-10-binary.tar.gz`, ...), its extracted directory,
or a directory holding one; which of the four it is comes from the files inside, and a
tarball is read in memory. Binary files hold records of label bytes (CIFAR-100: coarse,
fine) and 3072 pixel bytes, the red, green and blue planes; python ones dicts pickled by
Python 2, read by an unpickler that runs no code (`array_pickle.py`). Images come out uint8
[N, 32, 32, 3] in "train" and "test"; `data.coarse_labels` takes CIFAR-100's 20
superclasses. `find_archive` also serves tfds's `cifar10` and `cifar100` offline.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import tarfile
import zlib

import numpy as np

import resnet_app.data.sources.array_pickle as array_pickle
from resnet_app.common.errors import ConfigError, first_line
from resnet_app.data.sources.base import Source, Split
from resnet_app.data.sources.registry import register_check, register_source

PREFIX = "cifar:"
PIXELS = 3 * 32 * 32
COARSE_CLASSES = 20
TFDS_NAMES = {"cifar10": 10, "cifar100": 100}  # The tfds names this stands in for: classes.
_TAR_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error)


@dataclasses.dataclass(frozen=True)
class Layout:
    """One of the four archives: its (fine) classes, label bytes before each binary record's
    pixels (0: pickles), the directory its tarball extracts to, the training files in order,
    the test file and the class-name files (CIFAR-100 binary: fine, then coarse)."""

    classes: int
    label_bytes: int
    directory: str
    train: tuple[str, ...]
    test: str
    meta: tuple[str, ...]

    @property
    def binary(self) -> bool:
        return self.label_bytes > 0

    @property
    def title(self) -> str:
        return f"CIFAR-{self.classes} {'binary' if self.binary else 'python'}"

    @property
    def tarball(self) -> str:
        return f"cifar-{self.classes}-{'binary' if self.binary else 'python'}.tar.gz"

    @property
    def record_bytes(self) -> int:
        return self.label_bytes + PIXELS

    @property
    def files(self) -> tuple[str, ...]:
        return (*self.train, self.test, *self.meta)


_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
_BINARY_BATCHES = tuple(f"{name}.bin" for name in _BATCHES)
_NAMES_100 = ("fine_label_names.txt", "coarse_label_names.txt")
LAYOUTS = (
    Layout(10, 1, "cifar-10-batches-bin", _BINARY_BATCHES, "test_batch.bin", ("batches.meta.txt",)),
    Layout(10, 0, "cifar-10-batches-py", _BATCHES, "test_batch", ("batches.meta",)),
    Layout(100, 2, "cifar-100-binary", ("train.bin",), "test.bin", _NAMES_100),
    Layout(100, 0, "cifar-100-python", ("train",), "test", ("meta",)),
)
EXPECTED = (
    f"expected a CIFAR tarball ({', '.join(layout.tarball for layout in LAYOUTS)}), "
    f"its extracted directory ({', '.join(layout.directory for layout in LAYOUTS)}) "
    "or a directory holding one"
)


@dataclasses.dataclass(frozen=True)
class Archive:
    """A located archive: its layout, and a tarball or a directory of its files."""

    layout: Layout
    path: str
    tarball: bool


def _refuse(argument: str, text: str) -> ConfigError:
    return ConfigError(f"--dataset={PREFIX}{argument}: {text}")


def _unreadable(argument: str, path: str, error: BaseException) -> ConfigError:
    return _refuse(
        argument, f"{path} is not a readable tar archive ({first_line(error)}); download it again"
    )


def _missing(argument: str, archive: Archive, name: str) -> ConfigError:
    files = ", ".join(archive.layout.files)
    return _refuse(
        argument,
        f"{archive.path} has no {name}: {archive.layout.title} holds {files}; download it again",
    )


def _layout_of_member(name: str) -> Layout | None:
    """The layout a tarball member's name shows: its directory's, or a file only it has."""
    parts = [part for part in name.split("/") if part not in ("", ".")]
    for layout in LAYOUTS:
        if layout.directory in parts[:-1] or (parts and parts[-1] == layout.directory):
            return layout
    for layout in LAYOUTS:
        if parts and parts[-1] in (layout.train[0], *layout.meta) and parts[-1] != "train":
            return layout
    return None


def _tarball_layout(argument: str, path: str) -> Layout:
    """The layout of a tarball, from its first members (the real ones start with the directory)."""
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                layout = _layout_of_member(member.name)
                if layout is not None:
                    return layout
    except _TAR_ERRORS as error:
        raise _unreadable(argument, path, error) from None
    raise _refuse(argument, f"{path} holds no CIFAR files; {EXPECTED}")


def _directory_layout(directory: str) -> Layout | None:
    """The layout of an extracted directory: its first training and its test file are there."""
    for layout in LAYOUTS:
        names = (layout.train[0], layout.test)
        if all(os.path.isfile(os.path.join(directory, name)) for name in names):
            return layout
    return None


def _candidates(directory: str) -> list[Archive]:
    """The archives a directory holds by their distributed names: extracted first, binary
    first. A tarball's layout is its name's, until `_read_layout`."""
    ordered = sorted(LAYOUTS, key=lambda layout: not layout.binary)
    found = []
    for layout in ordered:
        inner = os.path.join(directory, layout.directory)
        if os.path.isdir(inner) and _directory_layout(inner) is layout:
            found.append(Archive(layout, inner, tarball=False))
    for layout in ordered:
        tarball = os.path.join(directory, layout.tarball)
        if os.path.isfile(tarball):
            found.append(Archive(layout, tarball, tarball=True))
    return found


def _read_layout(argument: str, archive: Archive) -> Archive:
    """A candidate with a tarball's layout as its members show it."""
    if not archive.tarball:
        return archive
    return Archive(_tarball_layout(argument, archive.path), archive.path, tarball=True)


def _archives(argument: str, path: str) -> list[Archive]:
    """The archives at `path`: a tarball, an extracted directory, or a directory's
    `_candidates`."""
    if os.path.isfile(path):
        return [Archive(_tarball_layout(argument, path), path, tarball=True)]
    layout = _directory_layout(path)
    return [Archive(layout, path, tarball=False)] if layout else _candidates(path)


def locate(argument: str) -> Archive:
    """The archive `cifar:PATH` names: a tarball, an extracted directory, or a directory of
    one (not of both CIFAR-10 and CIFAR-100)."""
    path = argument
    if not (os.path.isfile(path) or os.path.isdir(path)):
        raise _refuse(argument, f"{path} does not exist; {EXPECTED}")
    found = _archives(argument, path)
    if not found:
        raise _refuse(argument, f"{path} holds no CIFAR archive; {EXPECTED}")
    if len({archive.layout.classes for archive in found}) > 1:
        raise _refuse(
            argument,
            f"{path} holds both CIFAR-10 and CIFAR-100; name one, e.g. "
            f"--dataset={PREFIX}{found[0].path}",
        )
    return _read_layout(argument, found[0])


def _check_coarse(argument: str, layout: Layout, config) -> None:
    if config.coarse_labels and layout.classes != 100:
        raise _refuse(
            argument, f"data.coarse_labels needs CIFAR-100, and this is {layout.title}; drop it"
        )


def _check_size(argument: str, path: str, size: int, layout: Layout) -> None:
    if size == 0 or size % layout.record_bytes:
        raise _refuse(
            argument,
            f"{path} is cut short: {size} bytes is not a whole number of "
            f"{layout.record_bytes}-byte records; download it again",
        )


@register_check("cifar")
def check(argument: str, config) -> Archive:
    """The archive, checked without reading its files: an extracted directory's are there
    (binary ones whole records); a tarball's first member gives its layout."""
    archive = locate(argument)
    layout = archive.layout
    _check_coarse(argument, layout, config)
    if archive.tarball:
        return archive
    for name in layout.files:
        path = os.path.join(archive.path, name)
        if not os.path.isfile(path):
            raise _missing(argument, archive, name)
        if layout.binary and name not in layout.meta:
            _check_size(argument, path, os.path.getsize(path), layout)
    return archive


def _read_files(argument: str, archive: Archive) -> dict[str, bytes]:
    """{file name: bytes} of every file of the layout, from the directory or the tarball."""
    names, contents = archive.layout.files, {}
    if not archive.tarball:
        return {name: pathlib.Path(archive.path, name).read_bytes() for name in names}
    try:
        with tarfile.open(archive.path, "r:*") as tar:
            for member in tar:
                name = os.path.basename(member.name)
                if member.isfile() and name in names and name not in contents:
                    contents[name] = tar.extractfile(member).read()
    except _TAR_ERRORS as error:
        raise _unreadable(argument, archive.path, error) from None
    missing = [name for name in names if name not in contents]
    if missing:
        raise _missing(argument, archive, missing[0])
    return contents


def read_pickle(argument: str, name: str, data: bytes) -> dict:
    """The dict a CIFAR pickle holds, keys as str, loaded without running code."""
    try:
        loaded = array_pickle.load_arrays(data)
    except array_pickle.RefusedGlobalError as refused:
        raise _refuse(
            argument,
            f"{name} is not a CIFAR archive's pickle: it asks for {refused}, and CIFAR "
            "files are read without running code; download the archive again",
        ) from None
    except Exception as error:  # A damaged pickle raises anything from its opcodes.
        raise _refuse(
            argument, f"{name} is not a readable pickle ({first_line(error)}); download it again"
        ) from None
    if not isinstance(loaded, dict):
        raise _refuse(argument, f"{name} holds a {type(loaded).__name__}, not a CIFAR dict")
    return {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in loaded.items()}


def _check_range(argument: str, name: str, labels: np.ndarray, classes: int) -> None:
    if len(labels) and (labels.min() < 0 or labels.max() >= classes):
        bad = labels.max() if labels.max() >= classes else labels.min()
        raise _refuse(
            argument,
            f"{name} has label {bad}, outside the {classes} classes 0 to {classes - 1}; "
            "download it again",
        )


def _pickled_batch(argument: str, name: str, data: bytes, label_key: str, classes: int):
    """(uint8 [N, 3072] pixels, int64 labels) of a pickled batch, checked."""
    batch = read_pickle(argument, name, data)
    pixels = batch.get("data")
    array = isinstance(pixels, np.ndarray)
    if not (array and pixels.dtype == np.uint8 and pixels.ndim == 2 and pixels.shape[1] == PIXELS):
        what = f"a {pixels.dtype} array of shape {pixels.shape}" if array else type(pixels).__name__
        raise _refuse(argument, f"{name}'s data is {what}, not uint8 images of {PIXELS} bytes")
    if label_key not in batch:
        raise _refuse(argument, f"{name} has no {label_key}; keys: {', '.join(map(str, batch))}")
    values = batch[label_key]
    if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype.kind in "iu":
        labels = values.astype(np.int64)
    elif isinstance(values, list) and all(type(value) is int for value in values):
        labels = np.array(values, np.int64).reshape(-1)
    else:
        raise _refuse(argument, f"{name}'s labels are not a list of integers")
    if len(labels) != len(pixels):
        raise _refuse(argument, f"{name} holds {len(pixels)} images but {len(labels)} labels")
    _check_range(argument, name, labels, classes)
    return pixels, labels


def _binary_batch(argument: str, name: str, data: bytes, layout: Layout, coarse: bool):
    _check_size(argument, name, len(data), layout)
    records = np.frombuffer(data, np.uint8).reshape(-1, layout.record_bytes)
    # CIFAR-100's records start with the coarse label, then the fine one.
    column, classes = (0, COARSE_CLASSES) if coarse else (layout.label_bytes - 1, layout.classes)
    labels = records[:, column].astype(np.int64)
    _check_range(argument, name, labels, classes)
    return records[:, layout.label_bytes :], labels


def _names(argument: str, name: str, values, count: int) -> list[str]:
    """`count` class names from a text file's lines or a pickled list."""
    if isinstance(values, (bytes, str)):
        values = values.decode("utf-8", "replace") if isinstance(values, bytes) else values
        values = [line.strip() for line in values.splitlines() if line.strip()]
    if not isinstance(values, list) or not all(isinstance(v, (bytes, str)) for v in values):
        raise _refuse(argument, f"{name}'s class names are not a list of names")
    names = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in values]
    if len(names) != count:
        raise _refuse(argument, f"{name} names {len(names)} classes, not {count}")
    return names


def _class_names(argument: str, layout: Layout, contents: dict, coarse: bool) -> list[str]:
    count = COARSE_CLASSES if coarse else layout.classes
    if layout.binary:
        name = layout.meta[1 if coarse else 0]
        return _names(argument, name, contents[name], count)
    meta = read_pickle(argument, layout.meta[0], contents[layout.meta[0]])
    key = "label_names" if layout.classes == 10 else f"{'coarse' if coarse else 'fine'}_label_names"
    if key not in meta:
        raise _refuse(argument, f"{layout.meta[0]} has no {key}")
    return _names(argument, layout.meta[0], meta[key], count)


def _split(argument: str, layout: Layout, name: str, files, contents, coarse: bool) -> Split:
    key = "coarse_labels" if coarse else "fine_labels" if layout.classes == 100 else "labels"
    classes = COARSE_CLASSES if coarse else layout.classes
    parts = [
        _binary_batch(argument, file, contents[file], layout, coarse)
        if layout.binary
        else _pickled_batch(argument, file, contents[file], key, classes)
        for file in files
    ]
    pixels, labels = (np.concatenate(column) for column in zip(*parts))
    # [N, 3072] channel planes to [N, 32, 32, 3].
    images = np.ascontiguousarray(pixels.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    return Split(name, len(labels), labels=labels, images=images)


def load_archive(argument: str, archive: Archive, config, name: str | None = None) -> Source:
    """The source of a located archive (`argument` names it in messages, `name` the source;
    default `cifar:PATH`): "train" and "test", uint8 [N, 32, 32, 3], int64 labels."""
    layout = archive.layout
    _check_coarse(argument, layout, config)
    coarse = bool(config.coarse_labels)
    contents = _read_files(argument, archive)
    classes = _class_names(argument, layout, contents, coarse)
    if config.class_names:
        if len(config.class_names) != len(classes):
            raise _refuse(
                argument,
                f"data.class_names lists {len(config.class_names)} names, and "
                f"{layout.title} has {len(classes)} classes"
                + ("" if coarse or layout.classes == 10 else " (data.coarse_labels: 20)"),
            )
        classes = list(config.class_names)
    files = {"train": layout.train, "test": (layout.test,)}
    splits = {s: _split(argument, layout, s, names, contents, coarse) for s, names in files.items()}
    return Source(name or PREFIX + argument, classes, 32, splits)


@register_source("cifar", usage="cifar:PATH")
def load(argument: str, config) -> Source:
    """The CIFAR-10 or CIFAR-100 archive at `argument` (a tarball or a directory) in memory."""
    return load_archive(argument, check(argument, config), config)


def _keras_datasets() -> str:
    """Keras's download cache, as `keras.utils.get_file` finds it ($KERAS_HOME, else ~/.keras)."""
    home = os.environ.get("KERAS_HOME") or os.path.join("~", ".keras")
    return os.path.join(os.path.expanduser(home), "datasets")


def usual_places(data_dir: str | None, tfds_dir: str) -> list[str]:
    """Where a user copies a CIFAR archive for tfds's name: --data_dir, tfds's manual
    directory (`tfds_dir`/downloads/manual) and Keras's cache, ~/.keras/datasets."""
    places = [data_dir] if data_dir else []
    return [*places, os.path.join(tfds_dir, "downloads", "manual"), _keras_datasets()]


def archive_places(data_dir: str | None, tfds_dir: str) -> list[str]:
    """`usual_places`, then where Keras 3's `keras.datasets.cifar10` leaves the python
    archives: `cifar-10-batches-py-target/` beside `cifar-10-batches-py-target_archive`
    (Keras 2's names are in `usual_places`)."""
    python = [layout.directory for layout in LAYOUTS if not layout.binary]
    keras = [f"{name}-target{end}" for name in python for end in ("", "_archive")]
    return usual_places(data_dir, tfds_dir) + [os.path.join(_keras_datasets(), n) for n in keras]


def find_archive(classes: int, places: list[str]) -> Archive | None:
    """The first CIFAR-`classes` archive in `places` (directories, or tarballs), without
    TensorFlow; a damaged tarball found there is one line (ConfigError), not skipped."""
    for place in places:
        for archive in _archives(place, place):
            if archive.layout.classes == classes:
                archive = _read_layout(archive.path, archive)
                if archive.layout.classes == classes:
                    return archive
    return None
