"""`--dataset=hf:DIR`: a Hugging Face dataset on disk, as the Hub holds it or save_to_disk wrote.

Layouts: the Hub's repository (Parquet files named by a README's `configs:`, or
`[data/]{split}-*.parquet`, or one `{config}/` of them) and `Dataset(Dict).save_to_disk`'s
Arrow files beside `state.json`. The image column is an `Image` feature ({bytes, path}); the
label column a `ClassLabel`, or a list of them (multi-label). Features come from the files'
own `huggingface` schema metadata, else `dataset_info.json` or the README's YAML.

A shard is a Parquet row group or an Arrow record batch. Labels are read alone (one column);
a split whose files fit `image_files.MEMORY_LIMIT_BYTES` is read into memory once and indexed
like a folder's, a larger one streams by shard (`sharded_stream.py`). Nothing here uses the
network: a repository that holds only a loading script is refused.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import os
import re

import numpy as np
from absl import logging

from resnet_app.common.errors import ConfigError
from resnet_app.data.sources import image_files
from resnet_app.data.sources.base import Source, Split
from resnet_app.data.sources.registry import register_check, register_source
from resnet_app.data.sources.sharded_stream import ShardedStream

PREFIX = "hf:"
SPLIT_NAMES = {"valid": "validation", "val": "validation", "dev": "validation"}
LISTS = ("List", "Sequence", "LargeList")  # Multi-label: a list of ClassLabel.
UNLABELLED = -1  # The Hub's label for an example without one (a test split's).


@dataclasses.dataclass(frozen=True)
class Layout:
    """A dataset's files by split (sorted) and the features declared beside them, if any."""

    splits: dict[str, list[str]]
    features: dict | None


@dataclasses.dataclass(frozen=True)
class Columns:
    """The image and label columns, the class names (None: ids) and whether multi-label."""

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
        path = self.files[self.owners[shard]]
        return np.array(_image_bytes(path, int(self.units[shard]), self.column), dtype=object)

    def _records(self, shard, offset):
        import tensorflow as tf

        images = tf.numpy_function(self._images, [shard], tf.string, stateful=False)
        images = tf.reshape(images, [-1])
        ids = offset + tf.range(tf.size(images, out_type=tf.int64))
        return tf.data.Dataset.from_tensor_slices((ids, images))

    def _example(self, example_id, record):
        import tensorflow as tf

        return example_id - self.begin, record, tf.gather(tf.constant(self.labels), example_id)


def _front_matter(path: str) -> dict:
    """A README's YAML header ({} when it has none)."""
    import yaml

    with open(path, encoding="utf-8") as file:
        text = file.read()
    if not text.startswith("---"):
        return {}
    try:
        header = yaml.safe_load(text[3 : text.find("\n---", 3)])
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: its YAML header cannot be read ({error.problem})") from None
    return header if isinstance(header, dict) else {}


def _yaml_type(value) -> dict:
    """A README feature's type ("image", {"class_label": ...}) as `datasets` writes it in JSON."""
    if value == "image":
        return {"_type": "Image"}
    if isinstance(value, dict) and "class_label" in value:
        names = (value["class_label"] or {}).get("names") or []
        if isinstance(names, dict):
            names = [names[key] for key in sorted(names, key=int)]
        return {"_type": "ClassLabel", "names": [str(name) for name in names]}
    return {"_type": str(value)}


def _readme(root: str) -> tuple[dict, str, str | None]:
    """(the README's header, its directory, the config `root` names when it is the parent's)."""
    for directory, config in ((root, None), (os.path.dirname(root), os.path.basename(root))):
        path = os.path.join(directory, "README.md")
        if os.path.isfile(path):
            return _front_matter(path), directory, config
    return {}, root, None


def _pick(entries: list, config: str | None, root: str) -> dict | None:
    """The entry of `entries` (configs or dataset_infos, each maybe with `config_name`) that
    `config` names, else the default or only one; refuses a choice it cannot make."""
    if isinstance(entries, dict):
        entries = [entries]
    if not entries:
        return None
    named = {entry.get("config_name", "default"): entry for entry in entries}
    if config is not None:
        return named.get(config)
    defaults = [entry for entry in entries if entry.get("default")] or [named.get("default")]
    if len(named) == 1 or defaults[0] is not None:
        return defaults[0] or entries[0]
    raise ConfigError(
        f"--dataset={PREFIX}{root} has configs {', '.join(named)}: pass "
        f"--dataset={PREFIX}{os.path.join(root, '<config>')}"
    )


def _hub_features(header: dict, config: str | None, root: str) -> dict | None:
    info = _pick(header.get("dataset_info") or [], config, root) if header else None
    features = (info or {}).get("features")
    if not isinstance(features, list):
        return None
    return {entry["name"]: _feature(entry) for entry in features if "name" in entry}


def _feature(entry: dict) -> dict:
    for key in ("list", "sequence"):
        if key in entry:
            return {"_type": "List", "feature": _yaml_type(entry[key])}
    return _yaml_type(entry.get("dtype"))


def _split_name(name: str) -> str:
    return SPLIT_NAMES.get(name, name)


def _parquet_splits(root: str) -> dict[str, list[str]]:
    """{split: files} of Parquet files named `{split}-*.parquet` or kept in `{split}/`, under
    `root/data` or `root`; a single `{config}/` directory is entered."""
    base = os.path.join(root, "data") if os.path.isdir(os.path.join(root, "data")) else root
    splits: dict[str, list[str]] = {}
    for path in sorted(glob.glob(os.path.join(base, "*.parquet"))):
        name = re.split(r"[-.]", os.path.basename(path), maxsplit=1)[0]
        splits.setdefault(_split_name(name), []).append(path)
    folders = sorted(
        entry.name
        for entry in os.scandir(base)
        if entry.is_dir()
        and not entry.name.startswith(".")
        and glob.glob(os.path.join(entry.path, "**", "*.parquet"), recursive=True)
    )
    if splits or not folders:
        return splits
    if "train" in folders:
        return {
            _split_name(folder): sorted(glob.glob(os.path.join(base, folder, "*.parquet")))
            for folder in folders
        }
    if len(folders) == 1:
        return _parquet_splits(os.path.join(base, folders[0]))
    raise ConfigError(
        f"--dataset={PREFIX}{root} has configs {', '.join(folders)}: pass "
        f"--dataset={PREFIX}{os.path.join(root, '<config>')}"
    )


def _saved(directory: str) -> tuple[list[str], dict | None]:
    """A `save_to_disk` split's Arrow files and the features of its dataset_info.json."""
    with open(os.path.join(directory, "state.json"), encoding="utf-8") as file:
        state = json.load(file)
    files = [os.path.join(directory, entry["filename"]) for entry in state["_data_files"]]
    info_path = os.path.join(directory, "dataset_info.json")
    if not os.path.isfile(info_path):
        return files, None
    with open(info_path, encoding="utf-8") as file:
        return files, json.load(file).get("features")


@register_check("hf")
def check(root: str, config=None) -> Layout:
    """The dataset's files by split, found without reading them; refuses a directory that
    holds neither layout, a loading script alone, or no training split."""
    name = PREFIX + root
    if not os.path.isdir(root):
        raise ConfigError(f"--dataset={name}: {root} is not a directory")
    if os.path.isfile(os.path.join(root, "dataset_dict.json")) or os.path.isfile(
        os.path.join(root, "state.json")
    ):
        layout = _saved_layout(root, name)
    else:
        layout = _hub(root)
    scripts = glob.glob(os.path.join(root, "*.py"))
    if not any(layout.splits.values()) and scripts:
        raise ConfigError(
            f"--dataset={name}: {root} holds a loading script ({os.path.basename(scripts[0])}) "
            "that fetches its data from the network; where there is network, run "
            "datasets.load_dataset(...).save_to_disk(DIR) and pass --dataset=hf:DIR"
        )
    if "train" not in layout.splits:
        found = ", ".join(layout.splits) or "no Parquet files and no save_to_disk output"
        raise ConfigError(
            f"--dataset={name}: {root} has {found}; expected a train split: "
            "data/train-*.parquet (the Hub's layout) or Dataset(Dict).save_to_disk's"
        )
    return layout


def _saved_layout(root: str, name: str) -> Layout:
    """The splits `Dataset(Dict).save_to_disk` wrote in `root`."""
    try:
        if not os.path.isfile(os.path.join(root, "dataset_dict.json")):
            files, features = _saved(root)
            return Layout({"train": files}, features)
        with open(os.path.join(root, "dataset_dict.json"), encoding="utf-8") as file:
            saved = {
                split: _saved(os.path.join(root, split)) for split in json.load(file)["splits"]
            }
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"--dataset={name}: its save_to_disk files cannot be read ({error}); write them "
            "again with Dataset.save_to_disk"
        ) from None
    features = next((features for _, features in saved.values() if features), None)
    return Layout({_split_name(split): files for split, (files, _) in saved.items()}, features)


def _hub(root: str) -> Layout:
    header, directory, config = _readme(root)
    features = _hub_features(header, config, root)
    chosen = _pick(header["configs"], config, root) if header.get("configs") else None
    if chosen is None:
        return Layout(_parquet_splits(root), features)
    data_files = chosen.get("data_files") or []
    if not isinstance(data_files, list) or not all(isinstance(e, dict) for e in data_files):
        data_files = [{"split": "train", "path": data_files}]
    splits = {}
    for entry in data_files:
        patterns = entry["path"] if isinstance(entry["path"], list) else [entry["path"]]
        paths = {p for pattern in patterns for p in glob.glob(os.path.join(directory, pattern))}
        splits[_split_name(entry.get("split", "train"))] = sorted(paths)
    return Layout(splits, features)


def _is_parquet(path: str) -> bool:
    return path.endswith(".parquet")


@functools.lru_cache(maxsize=64)
def _arrow_batches(path: str) -> list:
    """An Arrow stream file's record batches, memory-mapped (read as pages are touched)."""
    import pyarrow as pa

    return pa.ipc.open_stream(pa.memory_map(path)).read_all().to_batches()


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


def _image_bytes(path: str, unit: int, column: str, rows: int | None = None) -> list[bytes]:
    """The encoded images of shard `unit` (its first `rows`), each checked by its first
    bytes; an image stored by path alone is read from it (relative: to the file's directory)."""
    import pyarrow as pa

    array = _column(path, column, unit)
    if rows is not None:
        array = array.slice(0, rows)
    is_struct = pa.types.is_struct(array.type)
    values = (array.field("bytes") if is_struct else array).to_pylist()
    paths = array.field("path").to_pylist() if is_struct else [None] * len(values)
    where = f"{path} (row group {unit}, column {column!r})"
    for row, (value, source) in enumerate(zip(values, paths)):
        if value is None and source:
            source = os.path.join(os.path.dirname(path), source)
            try:
                with open(source, "rb") as file:
                    values[row] = value = file.read()
            except OSError as error:
                raise ConfigError(
                    f"{where} row {row} names its image by path, and {source} cannot be read "
                    f"({error.strerror}); embed the images (datasets' Image(decode=True) with "
                    "embed_external_files) or put the file back"
                ) from None
        if not isinstance(value, bytes) or image_files.image_format(value[:16]) is None:
            raise ConfigError(
                f"{where} row {row} is not a JPEG, PNG, BMP or GIF image; choose the image "
                "column with --set data.image_column=NAME, or write the images in one of those"
            )
    return values


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

    described = [
        f"{n} ({features.get(n, {}).get('_type') or schema.field(n).type})" for n in schema.names
    ]
    chosen = []
    for key, setting, what, candidates in (
        (
            "data.image_column",
            config.image_column,
            "Image column",
            [n for n in schema.names if image_like(n)],
        ),
        (
            "data.label_column",
            config.label_column,
            "ClassLabel column",
            [n for n in schema.names if _kind(features, n) in ("label", "labels")],
        ),
    ):
        if setting is not None and setting not in schema.names:
            problem = f"has no column {setting!r}"
        elif setting is None and len(candidates) != 1:
            problem = (
                f"has several {what}s, {', '.join(candidates)}," if candidates else f"has no {what}"
            )
        else:
            chosen.append(setting or candidates[0])
            continue
        raise ConfigError(
            f"{where} {problem}; its columns are {', '.join(described)}: set {key}=NAME"
        )
    image, label = chosen
    multi = _kind(features, label) == "labels"
    class_label = features[label].get("feature") if multi else features.get(label)
    names = (class_label or {}).get("names") if _kind(features, label) else None
    return Columns(image, label, names, multi)


def _labels(path: str, columns: Columns, count: int, name: str) -> np.ndarray | None:
    """One file's labels: int64 class ids, or uint8 multi-hot rows; None when none has one
    (the Hub's -1, a test split's). Refuses one outside the `count` classes, naming its
    row group."""
    array = _column(path, columns.label)
    if columns.multi_label:
        values = array.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
        rows = array.value_parent_indices().to_numpy(zero_copy_only=False)
    else:
        values = array.fill_null(UNLABELLED).to_numpy(zero_copy_only=False).astype(np.int64)
        rows = np.arange(len(values))
        if len(values) and (values == UNLABELLED).all():
            return None
    bad = np.flatnonzero((values < 0) | (values >= count))
    if len(bad):
        group = int(np.searchsorted(np.cumsum(_unit_sizes(path)), rows[bad[0]], side="right"))
        raise ConfigError(
            f"--dataset={name}: {path} (row group {group}, column {columns.label!r}) has label "
            f"{values[bad[0]]}, outside the {count} classes (0 to {count - 1}); fix the file, "
            "or set data.label_column to the column of class ids"
        )
    if not columns.multi_label:
        return values
    hot = np.zeros((len(array), count), np.uint8)
    hot[rows, values] = 1
    return hot


def _split(split: str, files: list[str], columns: Columns, count: int, name: str) -> Split | None:
    """One split, in memory when its files fit, else streamed by shard; None: unlabelled."""
    parts = [_labels(path, columns, count, name) for path in files]
    if any(part is None for part in parts):
        logging.warning("%s: split %r has no labels; it is left out", name, split)
        return None
    labels = np.concatenate(parts)
    sizes = [_unit_sizes(path) for path in files]
    if sum(os.path.getsize(path) for path in files) <= image_files.MEMORY_LIMIT_BYTES:
        images = [
            image
            for path, units in zip(files, sizes)
            for unit in range(len(units))
            for image in _image_bytes(path, unit, columns.image)
        ]
        contents = np.array(images, dtype=object)
        return Split(split, len(labels), labels=labels, contents=contents)
    for path, units in zip(files, sizes):  # Streamed: each file's first images checked now.
        if units:
            _image_bytes(path, 0, columns.image, rows=8)
    owners = np.concatenate([np.full(len(units), i) for i, units in enumerate(sizes)])
    units = np.concatenate([np.arange(len(units)) for units in sizes])
    counts = np.concatenate([np.asarray(units, np.int64) for units in sizes])
    stream = ParquetStream(
        0, len(labels), counts, tuple(files), owners, units, columns.image, labels
    )
    return Split(split, len(labels), labels=labels, stream=stream)


@register_source("hf", usage="hf:DIR")
def load(root: str, config) -> Source:
    """The dataset in `root`: its splits with the train split's columns and classes."""
    name = PREFIX + root
    layout = check(root)
    train = layout.splits["train"]
    columns = _columns(_schema(train[0]), layout.features, config, train[0])
    if columns.names is None:  # Class ids without names: data.class_names, else the ids.
        highest = max(int(_highest(_column(path, columns.label))) for path in train)
        names = list(config.class_names or map(str, range(highest + 1)))
    else:
        names = [str(n) for n in columns.names]
    splits = {}
    for split, files in layout.splits.items():
        for path in files[:1]:  # Every split's files have the train split's columns.
            _columns(_schema(path), layout.features, config, path)
        made = _split(split, files, columns, len(names), name) if files else None
        if made is not None:
            splits[split] = made
    if "train" not in splits:
        raise ConfigError(f"--dataset={name}: the train split has no labels")
    return Source(name, names, None, splits)


def _highest(array) -> int:
    """The largest value of an integer column (-1 when it has none)."""
    import pyarrow.compute as pc

    value = pc.max(array).as_py()
    return -1 if value is None else value
