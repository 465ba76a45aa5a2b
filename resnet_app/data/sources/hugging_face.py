"""`--dataset=hf:DIR`: a Hugging Face dataset on disk, as the Hub holds it or save_to_disk wrote.

`hf_layout.py` finds the files. The image column is an `Image` feature ({bytes, path}); the
label column a `ClassLabel`, a list of them (multi-label), or with `data.label_column`
plain integer ids or names. A shard is a Parquet row group or an Arrow record batch. Labels
are read alone (one column); a split whose files fit in `data.in_memory_mb` is read into
memory once and indexed like a folder's, a larger one streams by shard
(`sharded_stream.py`), and images stored by path are read as a folder's files.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import numpy as np
from absl import logging

import resnet_app.data.sources.image_files as image_files
from resnet_app.common.errors import ConfigError
from resnet_app.data.sources.base import Source, Split
from resnet_app.data.sources.hf_layout import PREFIX, check
from resnet_app.data.sources.registry import register_source
from resnet_app.data.sources.sharded_stream import ShardedStream

LISTS = ("List", "Sequence", "LargeList")  # Multi-label: a list of ClassLabel.
UNLABELLED = -1  # The Hub's label for an example without one (a test split's).


@dataclasses.dataclass(frozen=True)
class Columns:
    """The image and label columns, the class names (None: from the data) and whether
    multi-label."""

    image: str
    label: str
    names: list[str] | None
    multi_label: bool


@dataclasses.dataclass(eq=False)
class ParquetStream(ShardedStream):
    """A split's shards: shard i is unit `units[i]` of `files[owners[i]]`; `labels` are the
    whole split's, by id."""

    files: tuple[str, ...]
    owners: np.ndarray
    units: np.ndarray
    column: str
    labels: np.ndarray

    def _images(self, shard) -> np.ndarray:
        """Shard `shard`'s encoded images; the pipeline skips one that does not decode."""
        path = self.files[self.owners[shard]]
        images = _image_bytes(path, int(self.units[shard]), self.column)
        return np.array([image or b"" for image in images], dtype=object)

    def _records(self, shard, offset):
        import tensorflow as tf

        images = tf.numpy_function(self._images, [shard], tf.string, stateful=False)
        images = tf.reshape(images, [-1])
        ids = offset + tf.range(tf.size(images, out_type=tf.int64))
        return tf.data.Dataset.from_tensor_slices((ids, images))

    def _example(self, example_id, record):
        import tensorflow as tf

        return example_id - self.begin, record, tf.gather(tf.constant(self.labels), example_id)


def _is_parquet(path: str) -> bool:
    return path.endswith(".parquet")


@functools.lru_cache(maxsize=64)
def _arrow_batches(path: str) -> list:
    """An Arrow stream file's record batches, memory-mapped (read as pages are touched)."""
    import pyarrow as pa

    try:
        return pa.ipc.open_stream(pa.memory_map(path)).read_all().to_batches()
    except pa.ArrowInvalid:  # The IPC file format, as some writers other than datasets use.
        return pa.ipc.open_file(pa.memory_map(path)).read_all().to_batches()


def _schema(path: str):
    import pyarrow.parquet as pq

    return pq.read_schema(path) if _is_parquet(path) else _arrow_batches(path)[0].schema


def _unit_sizes(path: str) -> list[int]:
    """Rows per shard of one file: its row groups or record batches."""
    import pyarrow.parquet as pq

    if _is_parquet(path):
        metadata = pq.ParquetFile(path).metadata
        return [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    return [batch.num_rows for batch in _arrow_batches(path)]


def _column(path: str, column: str, unit: int | None = None):
    """One column of a file (or of its shard `unit`) as one Arrow array."""
    import pyarrow.parquet as pq

    if _is_parquet(path):
        file = pq.ParquetFile(path)
        table = file.read([column]) if unit is None else file.read_row_group(unit, [column])
        return table.column(0).combine_chunks()
    batches = _arrow_batches(path) if unit is None else [_arrow_batches(path)[unit]]
    import pyarrow as pa

    return pa.chunked_array([batch.column(column) for batch in batches]).combine_chunks()


def _image_bytes(path: str, unit: int, column: str) -> list[bytes | None]:
    """The encoded images of shard `unit` (None where a row has no bytes)."""
    import pyarrow as pa

    array = _column(path, column, unit)
    return (array.field("bytes") if pa.types.is_struct(array.type) else array).to_pylist()


def _checked(path: str, unit: int, column: str, images: list) -> list[bytes]:
    """`images`, refused in one line unless each starts as a JPEG, PNG, BMP or GIF does."""
    for row, image in enumerate(images):
        if not isinstance(image, bytes) or image_files.image_format(image[:16]) is None:
            raise ConfigError(
                f"{path} (row group {unit}, column {column!r}) row {row} is not a JPEG, PNG, "
                "BMP or GIF image; choose the image column with --set data.image_column=NAME, "
                "or write the images in one of those formats"
            )
    return images


def _kind(features: dict, name: str) -> str:
    """ "image", "label", "labels" (a list of ClassLabel) or "" for a column's feature."""
    feature = features.get(name) or {}
    inner = feature.get("feature") or {}
    if feature.get("_type") in LISTS and inner.get("_type") == "ClassLabel":
        return "labels"
    return {"Image": "image", "ClassLabel": "label"}.get(feature.get("_type"), "")


def _columns(schema, features: dict | None, config, where: str) -> Columns:
    """The image and label columns of a split's files: the settings', else the only Image
    and the only ClassLabel (or list of them) among the features."""
    import pyarrow as pa

    metadata = (schema.metadata or {}).get(b"huggingface")
    if metadata:
        features = json.loads(metadata).get("info", {}).get("features") or features
    features = features or {}

    def image_like(name: str) -> bool:  # Without features: a {bytes, path} struct.
        kind = schema.field(name).type
        bytes_struct = pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0
        return _kind(features, name) == "image" or (not features and bytes_struct)

    names = schema.names
    described = [f"{n} ({features.get(n, {}).get('_type') or schema.field(n).type})" for n in names]
    labels = [n for n in names if _kind(features, n) in ("label", "labels")]
    chosen = []
    for key, setting, what, candidates in (
        ("data.image_column", config.image_column, "Image", [n for n in names if image_like(n)]),
        ("data.label_column", config.label_column, "ClassLabel", labels),
    ):
        if setting is not None and setting not in names:
            problem = f"has no column {setting!r}"
        elif setting is None and len(candidates) != 1:
            several = f"has several {what} columns, {', '.join(candidates)},"
            problem = several if candidates else f"has no {what} column"
        else:
            chosen.append(setting or candidates[0])
            continue
        raise ConfigError(
            f"{where} {problem}; its columns are {', '.join(described)}: set {key}=NAME"
        )
    image, label = chosen
    multi = _kind(features, label) == "labels"
    class_label = (features[label].get("feature") if multi else features.get(label)) or {}
    count = class_label.get("num_classes")
    names = class_label.get("names") or (list(map(str, range(count))) if count else None)
    return Columns(image, label, names if _kind(features, label) else None, multi)


def _is_text(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _label_array(path: str, column: str):
    """A file's label column, a category (dictionary) column as its values."""
    import pyarrow as pa

    array = _column(path, column)
    return array.dictionary_decode() if pa.types.is_dictionary(array.type) else array


def _class_names(arrays: list, columns: Columns, config) -> list[str]:
    """The classes, from the train split's label `arrays`: the ClassLabel's names; else, for
    plain labels, `data.class_names` or the ids (0 to the highest), or the sorted names a
    text column holds."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if columns.names is not None:
        return [str(name) for name in columns.names]
    if all(pa.types.is_integer(array.type) for array in arrays):
        highest = max((pc.max(array).as_py() or 0) for array in arrays)
        return list(config.class_names or map(str, range(highest + 1)))
    texts = {t for a in arrays if _is_text(a.type) for t in pc.unique(a).to_pylist()}
    return sorted(text for text in texts if text is not None)


def _label_ids(path: str, array, columns: Columns, names: list[str]):
    """(the class ids of a file's label `array`, -1 where a row has none; the row of each; the
    label of each as stored): for multi-label, one entry per label in a row's list."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = array.flatten() if columns.multi_label else array
    rows = array.value_parent_indices() if columns.multi_label else np.arange(len(array))
    if not pa.types.is_integer(values.type):
        if not _is_text(values.type):
            raise ConfigError(
                f"{path}: column {columns.label!r} holds {values.type}, not class ids or names; "
                "set data.label_column to the label column"
            )
        found = pc.index_in(values, value_set=pa.array(names, values.type))
        ids = pc.if_else(pc.is_null(values), UNLABELLED, found.fill_null(len(names)))
    else:
        ids = values.fill_null(UNLABELLED)
    ids = ids.to_numpy(zero_copy_only=False).astype(np.int64)
    return ids, np.asarray(rows), values


def _labels(
    split: str, files: list[str], arrays: list, columns: Columns, names: list[str], name: str
):
    """A split's labels from its files' label `arrays`: int64 class ids, or uint8 multi-hot
    rows; None when no example has one (the Hub's -1, as in test splits). Refuses one
    outside the classes, naming its file and row group."""
    read = [(path, *_label_ids(path, array, columns, names)) for path, array in zip(files, arrays)]
    ids = np.concatenate([part[1] for part in read]) if read else np.zeros(0, np.int64)
    if not columns.multi_label and len(ids) and (ids == UNLABELLED).all():
        logging.warning("%s: split %r has no labels; it is left out", name, split)
        return None
    count, labels = len(names), []
    for (path, values, rows, stored), array in zip(read, arrays):
        bad = np.flatnonzero((values < 0) | (values >= count))
        if len(bad):
            group = int(np.searchsorted(np.cumsum(_unit_sizes(path)), rows[bad[0]], "right"))
            raise ConfigError(
                f"--dataset={name}: {path} (row group {group}, column {columns.label!r}) has "
                f"label {stored[int(bad[0])].as_py()!r}, outside the {count} classes (0 to "
                f"{count - 1}{', as the train split names them' if columns.names is None else ''}"
                "); fix the file, or set data.label_column to the column of class ids"
            )
        if columns.multi_label:
            hot = np.zeros((len(array), count), np.uint8)
            hot[rows, values] = 1
            values = hot
        labels.append(values)
    return np.concatenate(labels)


def _split(split, files, arrays, columns: Columns, names: list[str], name: str, limit: int):
    """One split (None: unlabelled), its files' label `arrays` read: in memory when its files
    fit in `limit` bytes, else streamed by shard; images stored by path alone are a folder's
    files."""
    labels = _labels(split, files, arrays, columns, names, name)
    if labels is None:
        return None
    sizes = [_unit_sizes(path) for path in files]
    first = next(((path, 0) for path, units in zip(files, sizes) if units), None)
    if first and _image_bytes(*first, columns.image)[0] is None:
        return _by_path(split, files, columns, labels, name, limit)
    if sum(os.path.getsize(path) for path in files) <= limit:
        images = [
            image
            for path, units in zip(files, sizes)
            for unit in range(len(units))
            for image in _checked(
                path, unit, columns.image, _image_bytes(path, unit, columns.image)
            )
        ]
        return Split(split, len(labels), labels=labels, contents=np.array(images, dtype=object))
    for path, units in zip(files, sizes):  # Streamed: each file's first images checked now.
        if units:
            _checked(path, 0, columns.image, _image_bytes(path, 0, columns.image)[:8])
    owners = np.concatenate([np.full(len(units), i) for i, units in enumerate(sizes)])
    units = np.concatenate([np.arange(len(units)) for units in sizes])
    counts = np.concatenate([np.asarray(units, np.int64) for units in sizes])
    stream = ParquetStream(
        0, len(labels), counts, tuple(files), owners, units, columns.image, labels
    )
    return Split(split, len(labels), labels=labels, stream=stream)


def _by_path(
    split: str, files: list[str], columns: Columns, labels: np.ndarray, name: str, limit: int
):
    """A split whose images are files named by path (relative: to the data file's directory),
    read as a folder's: unreadable ones skipped, small sets read into memory once."""
    paths = []
    for path in files:
        names = _column(path, columns.image).field("path").to_pylist()
        paths += [os.path.join(os.path.dirname(path), name or "") for name in names]
    splits = image_files.FileSplits(name, limit)
    made = splits.split(split, paths, labels, f"the paths of column {columns.image!r}")
    splits.finish()
    return made


@register_source("hf", usage="hf:DIR")
def load(root: str, config) -> Source:
    """The dataset in `root`: its splits with the train split's columns and classes."""
    name = PREFIX + root
    layout = check(root)
    train = layout.splits["train"]
    columns = _columns(_schema(train[0]), layout.features, config, train[0])
    labelled = {}  # {split: its files' label arrays}, each read once.
    for split, files in layout.splits.items():
        schema = _schema(files[0])
        if columns.label not in schema.names and split != "train":
            logging.warning(
                "%s: split %r has no column %r; it is left out", name, split, columns.label
            )
            continue
        if split != "train":
            _columns(schema, layout.features, config, files[0])  # The train split's columns.
        labelled[split] = [_label_array(path, columns.label) for path in files]
    names = _class_names(labelled["train"], columns, config)
    limit, splits = image_files.in_memory_bytes(config), {}
    for split, arrays in labelled.items():
        files = layout.splits[split]
        made = _split(split, files, arrays, columns, names, name, limit)
        if made is not None:
            splits[split] = made
    if "train" not in splits:
        raise ConfigError(f"--dataset={name}: the train split has no labels")
    return Source(name, names, None, splits)
