"""`--dataset=csv:FILE`: a table of image paths and labels (CSV, TSV or JSON lines).

Columns (or JSON keys): `path`, `label` and optionally `split` (train,
validation or val, test). Paths are relative to the table's directory, or
absolute. A label is a class name, or an integer id: with `data.class_names`
the ids index that list, and without it ids 0..max name themselves. A label
cell of several space-separated names (Kaggle's convention, e.g. Planet's
`tags`) makes the table multi-label; `data.multi_label` forces either way.
Without a split column every row trains, and `data.validation_split` holds
some out.

Rows naming a file that does not exist are skipped, with one warning line
that counts them and names the first few; unreadable images are skipped and
counted like a folder's (`image_files.FileSplits`).
"""

from __future__ import annotations

import csv
import json
import os

import numpy as np
from absl import logging

from resnet_app.common.errors import ConfigError
from resnet_app.data.sources.base import Source
from resnet_app.data.sources.image_files import FileSplits
from resnet_app.data.sources.registry import register_check, register_source

PREFIX = "csv:"
SPLIT_NAMES = {"train": "train", "validation": "validation", "val": "validation", "test": "test"}
SHOWN_MISSING = 3


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


def _tokens(value, multi: bool) -> list[str]:
    if isinstance(value, list):
        return [str(item) for item in value]
    text = "" if value is None else str(value).strip()
    return text.split() if multi else ([text] if text else [])


def _is_multi_label(rows: list[dict], forced: bool | None) -> bool:
    several = next(
        (i for i, row in enumerate(rows) if len(_tokens(row["label"], multi=True)) > 1), None
    )
    if forced is False and several is not None:
        raise ConfigError(
            f"row {several + 1} has several labels ({rows[several]['label']!r}) but "
            "data.multi_label=false; drop the setting to train multi-label"
        )
    return forced if forced is not None else several is not None


def _class_names(tokens: list[list[str]], given: tuple[str, ...] | None) -> list[str]:
    values = sorted({token for row in tokens for token in row})
    if given:
        return list(given)
    if values and all(token.lstrip("-").isdigit() for token in values):
        return [str(i) for i in range(max(int(token) for token in values) + 1)]
    return values


def _label_ids(tokens: list[list[str]], class_names: list[str], dataset: str) -> list[list[int]]:
    index = {name: i for i, name in enumerate(class_names)}
    ids = []
    for row, names in enumerate(tokens):
        row_ids = []
        for token in names:
            label = index.get(token)
            if label is None and token.lstrip("-").isdigit():
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


@register_check("csv")
def check(path: str, config=None) -> None:
    """Refuses a table that is not a file (its rows are read, and checked, by `load`)."""
    if not os.path.isfile(path):
        raise ConfigError(f"--dataset={PREFIX + path}: {path} is not a file")


@register_source("csv", usage="csv:FILE")
def load(path: str, config) -> Source:
    """The table at `path` as indexed file splits.

    Args:
      path: the table (.csv, .tsv, .jsonl).
      config: the `DataConfig` (class names, multi-label setting).

    Returns:
      The source; multi-label tables have uint8 [N, classes] multi-hot labels.
    """
    name = PREFIX + path
    rows = _rows(path)
    multi = _is_multi_label(rows, config.multi_label)
    tokens = [_tokens(row["label"], multi) for row in rows]
    empty = next((i for i, names in enumerate(tokens) if not names), None)
    if empty is not None and not multi:
        raise ConfigError(f"--dataset={name}: row {empty + 1} has no label")
    class_names = _class_names(tokens, config.class_names)
    ids = _label_ids(tokens, class_names, name)
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
    missing = [p for p in paths if not os.path.isfile(p)]
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
            ", ".join(missing[:SHOWN_MISSING]),
            ", ..." if len(missing) > SHOWN_MISSING else "",
        )
    present = {p for p in paths if p not in set(missing)}
    builder, splits = FileSplits(name), {}
    for split, rows_of_split in by_split.items():
        members = [i for i in rows_of_split if paths[i] in present]
        if multi:
            labels = np.zeros((len(members), len(class_names)), np.uint8)
            for row, i in enumerate(members):
                labels[row, ids[i]] = 1
        else:
            labels = np.array([ids[i][0] for i in members], np.int64)
        splits[split] = builder.split(
            split, [paths[i] for i in members], labels, f"{path} ({split})"
        )
    builder.finish()
    if multi:
        logging.info("%s is multi-label: %d classes", name, len(class_names))
    return Source(name, class_names, None, splits)
