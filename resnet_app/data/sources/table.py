"""`--dataset=csv:FILE`: a table of image paths and labels (CSV, TSV or JSON lines).

Columns (or JSON keys): `path` (relative to the table's directory, or absolute), `label`
and optionally `split` (train, validation or val, test; without it every row trains). A
label is a class name, or an integer id: it indexes `data.class_names`, or without them ids
0..max name themselves while that many classes is plausible (`_class_names`). A cell of
several labels separated by `data.label_separator` (whitespace: Kaggle's convention) makes
the table multi-label (`data.multi_label` forces either way); labels joined by another
separator are refused in one line, rather than each combination becoming a class
(`_other_separator`). Rows naming a missing file are skipped with one warning, found with
one listing per directory (`_existing`); unreadable images are skipped like a folder's.
"""

from __future__ import annotations

import collections
import csv
import json
import os

import numpy as np
from absl import logging

from resnet_app.common.errors import ConfigError
from resnet_app.data.sources.base import Source
from resnet_app.data.sources.image_files import FileSplits, in_memory_bytes
from resnet_app.data.sources.registry import register_check, register_source

PREFIX = "csv:"
SPLIT_NAMES = {"train": "train", "validation": "validation", "val": "validation", "test": "test"}
SHOWN = 3  # Missing files and joined labels named in a message.
# Integer labels are class ids 0..max up to IDS_ALWAYS_CLASSES of them (ImageNet's 1,000,
# of which a sample may hold a few), beyond while at least 1 in SPARSE_IDS of 0..max occurs.
# Sparser ids (a product id 100234 for a handful of classes) are most likely names.
IDS_ALWAYS_CLASSES = 1000
SPARSE_IDS = 2
# Separators people join labels with, besides `data.label_separator` (not whitespace:
# names with spaces are common, "golden retriever").
LIKELY_SEPARATORS = ("|", ",", ";")


def _rows(path: str) -> list[dict]:
    """The table's rows as {column: text}, from its extension: .tsv, .jsonl/.json, else CSV."""
    name = PREFIX + path
    check(path)
    extension = os.path.splitext(path)[1].lower()
    try:
        with open(path, newline="", encoding="utf-8-sig") as file:
            if extension in (".jsonl", ".json", ".ndjson"):
                rows = []
                for number, line in enumerate(file, 1):
                    if line.strip():
                        row = json.loads(line)
                        if not isinstance(row, dict):
                            raise ValueError(f"line {number} is not a JSON object")
                        rows.append(row)
                columns = set().union(*rows) if rows else set()
            else:
                reader = csv.DictReader(file, delimiter="\t" if extension == ".tsv" else ",")
                rows, columns = list(reader), set(reader.fieldnames or ())
    except (UnicodeDecodeError, ValueError, csv.Error) as error:
        raise ConfigError(f"--dataset={name}: {path} cannot be read as a table: {error}") from None
    missing = [column for column in ("path", "label") if column not in columns]
    if missing:
        raise ConfigError(
            f"--dataset={name}: {path} has no {' or '.join(repr(c) for c in missing)} column; "
            f"its columns are {', '.join(sorted(columns)) or 'none'}: name them path, label "
            "(and optionally split)"
        )
    if not rows:
        raise ConfigError(f"--dataset={name}: {path} has no rows")
    return rows


def _split(text: str, separator: str) -> list[str]:
    """The labels of a cell: a space separates by any run of whitespace, as `str.split()`."""
    if separator == " ":
        return text.split()
    return [part.strip() for part in text.split(separator) if part.strip()]


def _tokens(value, multi: bool, separator: str) -> list[str]:
    if isinstance(value, list):
        return [str(item) for item in value]
    text = "" if value is None else str(value).strip()
    return _split(text, separator) if multi else ([text] if text else [])


def _is_multi_label(rows: list[dict], forced: bool | None, separator: str) -> bool:
    several = next(
        (i for i, row in enumerate(rows) if len(_tokens(row["label"], True, separator)) > 1),
        None,
    )
    if forced is False and several is not None:
        raise ConfigError(
            f"row {several + 1} has several labels ({rows[several]['label']!r}) but "
            "data.multi_label=false; drop the setting to train multi-label"
        )
    return forced if forced is not None else several is not None


def _is_id(token: str) -> bool:
    """Whether a label is an integer (which `int` reads: "-1" is, "--1" and "²" are not)."""
    return (token[1:] if token.startswith("-") else token).isdecimal()


def _other_separator(labels: set[str], separator: str) -> str | None:
    """A separator other than `separator` that joins several of the distinct `labels`.

    A candidate joins labels when every part of every label it splits occurs in at least
    two of them, alone or joined ("cat|dog" next to "cat" and "dog"); a name that holds one
    ("Paris,France", "tench, Tinca tinca") has parts found nowhere else.
    """
    found, most = None, 0
    for candidate in LIKELY_SEPARATORS:
        if candidate == separator:
            continue
        joined = [label for label in labels if candidate in label]
        if not joined:
            continue
        occurrences = collections.Counter(
            part for label in labels for part in set(_split(label, candidate))
        )
        parts = {part for label in joined for part in _split(label, candidate)}
        if all(occurrences[part] >= 2 for part in parts) and len(joined) > most:
            found, most = candidate, len(joined)
    return found


def _class_names(
    tokens: list[list[str]], given: tuple[str, ...] | None, num_classes: int, dataset: str
) -> list[str]:
    """The classes: `data.class_names`, else the integer ids 0..max, else the sorted names;
    refuses ids too sparse to be class ids unless `data.num_classes` confirms them."""
    values = sorted({token for row in tokens for token in row})
    if given:
        return list(given)
    if not values or not all(_is_id(token) for token in values):
        return values
    largest = max(int(token) for token in values)
    count = largest + 1
    if count > max(IDS_ALWAYS_CLASSES, SPARSE_IDS * len(values)):
        if num_classes < count:
            raise ConfigError(
                f"--dataset={dataset}: column 'label' holds integer ids up to {largest}, which "
                f"as class ids make {count} classes for its {len(values)} distinct labels: if "
                f"they are class ids, set data.num_classes={count}; if they are names, list "
                "them in data.class_names or write them as names (e.g. with a letter before)"
            )
        count = num_classes
    return [str(i) for i in range(count)]


def _label_ids(tokens: list[list[str]], class_names: list[str], dataset: str) -> list[list[int]]:
    index = {name: i for i, name in enumerate(class_names)}
    ids = []
    for row, names in enumerate(tokens):
        row_ids = []
        for token in names:
            label = index.get(token)
            if label is None and _is_id(token):
                label = int(token) if 0 <= int(token) < len(class_names) else None
            if label is None:
                raise ConfigError(
                    f"--dataset={dataset}: row {row + 1}'s label {token!r} is neither one of "
                    f"the {len(class_names)} classes ({', '.join(class_names[:5])}"
                    f"{', ...' if len(class_names) > 5 else ''}) nor an id 0 to "
                    f"{len(class_names) - 1}: fix the row or data.class_names"
                )
            row_ids.append(label)
        ids.append(row_ids)
    return ids


def _existing(paths: list[str]) -> list[bool]:
    """Whether each of `paths` is a file, from one listing of each directory (a call per
    path would be 1.28M round trips for ImageNet); one that cannot be listed is asked path
    by path."""
    listings: dict[str, set[str] | None] = {}
    found = []
    for path in paths:
        directory, name = os.path.split(path)
        if directory not in listings:
            try:
                with os.scandir(directory) as entries:
                    listings[directory] = {entry.name for entry in entries if entry.is_file()}
            except (FileNotFoundError, NotADirectoryError):
                listings[directory] = set()
            except OSError:
                listings[directory] = None
        files = listings[directory]
        found.append(name in files if files is not None else os.path.isfile(path))
    return found


@register_check("csv")
def check(path: str, config=None) -> None:
    """Refuses a table that is not a file (`load` checks its rows)."""
    if not os.path.isfile(path):
        raise ConfigError(f"--dataset={PREFIX + path}: {path} is not a file")


def _labels(name: str, rows: list[dict], config) -> tuple[bool, list[str], list[list[int]]]:
    """(whether multi-label, the class names, each row's class ids)."""
    separator = config.label_separator
    multi = _is_multi_label(rows, config.multi_label, separator)
    tokens = [_tokens(row["label"], multi, separator) for row in rows]
    empty = next((i for i, names in enumerate(tokens) if not names), None)
    if empty is not None and not multi:
        raise ConfigError(f"--dataset={name}: row {empty + 1} has no label")
    distinct = {token for names in tokens for token in names}
    other = None if config.multi_label is False else _other_separator(distinct, separator)
    if other is not None:
        joined = sorted(label for label in distinct if other in label)
        raise ConfigError(
            f"--dataset={name}: labels joined by {other!r} "
            f"({', '.join(repr(label) for label in joined[:SHOWN])}"
            f"{', ...' if len(joined) > SHOWN else ''}: {len(joined)} of "
            f"{len(distinct)}) would each be a class of its own: to read several labels per "
            f"image, set data.label_separator: {json.dumps(other)} (--set "
            f"'data.label_separator={json.dumps(other)}'); to keep the combinations as "
            "classes, data.multi_label=false"
        )
    class_names = _class_names(tokens, config.class_names, config.num_classes, name)
    return multi, class_names, _label_ids(tokens, class_names, name)


@register_source("csv", usage="csv:FILE")
def load(path: str, config) -> Source:
    """The table at `path` as indexed file splits (multi-label: uint8 multi-hot labels)."""
    name = PREFIX + path
    rows = _rows(path)
    multi, class_names, ids = _labels(name, rows, config)
    root = os.path.dirname(os.path.abspath(path))
    by_split: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        value = str(row.get("split") or "train").strip().lower()
        if value not in SPLIT_NAMES:
            raise ConfigError(
                f"--dataset={name}: row {i + 1}'s split {value!r} is not one of "
                f"{', '.join(SPLIT_NAMES)}"
            )
        by_split.setdefault(SPLIT_NAMES[value], []).append(i)
    if "train" not in by_split:
        raise ConfigError(f"--dataset={name}: no row has split 'train'")
    paths = [os.path.join(root, str(row["path"]).strip()) for row in rows]
    exists = _existing(paths)
    missing = [p for p, found in zip(paths, exists, strict=True) if not found]
    if len(missing) == len(paths):
        raise ConfigError(
            f"--dataset={name}: none of the {len(paths)} files it names exists (the first: "
            f"{missing[0]}); paths are relative to {root} or absolute"
        )
    if missing:
        logging.warning(
            "%s: %d of %d files it names do not exist and are skipped: %s%s",
            name,
            len(missing),
            len(paths),
            ", ".join(missing[:SHOWN]),
            ", ..." if len(missing) > SHOWN else "",
        )
    builder, splits = FileSplits(name, in_memory_bytes(config)), {}
    for split, rows_of_split in by_split.items():
        members = [i for i in rows_of_split if exists[i]]
        if multi:
            labels = np.zeros((len(members), len(class_names)), np.uint8)
            for row, i in enumerate(members):
                labels[row, ids[i]] = 1
        else:
            labels = np.array([ids[i][0] for i in members], np.int64)
        where = f"{path} ({split})"
        splits[split] = builder.split(split, [paths[i] for i in members], labels, where)
    builder.finish()
    if multi:
        logging.info("%s is multi-label: %d classes", name, len(class_names))
    return Source(name, class_names, None, splits)
