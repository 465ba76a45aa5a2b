"""`--dataset=folder:PATH`: an image folder in the ImageNet layout, PATH/<split>/<class>/<file>.

Classes are the sorted folders of PATH/train; a class's images may sit in subfolders
(`train/cat/2019/x.jpg`), read as torchvision's `ImageFolder` and Keras's
`image_dataset_from_directory` read them. Unreadable files are skipped and counted.
"""

from __future__ import annotations

import os

import numpy as np

from resnet_app.common.errors import ConfigError
from resnet_app.data.sources.base import Source
from resnet_app.data.sources.image_files import FileSplits, in_memory_bytes
from resnet_app.data.sources.registry import register_check, register_source

PREFIX = "folder:"
EVAL_SPLITS = ("val", "validation", "test")


def _class_files(class_dir: str) -> list[str]:
    """The files in `class_dir` and its subfolders at any depth, hidden ones skipped: a
    folder's files by name, then its subfolders by name. Linked folders are followed, each
    real folder once (a link to a parent would otherwise never end)."""
    paths, seen = [], set()
    for directory, subdirectories, names in os.walk(class_dir, followlinks=True):
        real = os.path.realpath(directory)
        if real in seen:
            subdirectories[:] = []
            continue
        seen.add(real)
        subdirectories[:] = sorted(name for name in subdirectories if not name.startswith("."))
        for name in sorted(names):
            path = os.path.join(directory, name)
            if not name.startswith(".") and os.path.isfile(path):
                paths.append(path)
    return paths


def _folders(path: str) -> list[str]:
    """The names of `path`'s subfolders, sorted, hidden ones skipped."""
    names = sorted(name for name in os.listdir(path) if not name.startswith("."))
    return [name for name in names if os.path.isdir(os.path.join(path, name))]


def _list_split(root: str, split: str, class_names: list[str]) -> tuple[list, list]:
    paths, labels = [], []
    split_dir = os.path.join(root, split)
    for entry in _folders(split_dir):
        class_dir = os.path.join(split_dir, entry)
        if entry not in class_names:
            raise ConfigError(
                f"{class_dir} is a class that train/ does not have; every split of "
                f"folder:{root} must use the classes of train/"
            )
        files = _class_files(class_dir)
        paths.extend(files)
        labels.extend([class_names.index(entry)] * len(files))
    return paths, labels


@register_check("folder")
def check(root: str, config=None) -> tuple[list[str], list[str]]:
    """(the folder's split directories, its class names); refuses a wrong layout."""
    name = PREFIX + root
    if not os.path.isdir(root):
        raise ConfigError(f"--dataset={name}: {root} is not a directory")
    split_names = _folders(root)
    if "train" not in split_names:
        raise ConfigError(
            f"--dataset={name}: no train/ in {root}; expected {root}/train/<class>/<image> "
            f"(and optionally {root}/val/<class>/<image>)"
        )
    train_dir = os.path.join(root, "train")
    class_names = _folders(train_dir)
    if not class_names:
        raise ConfigError(f"--dataset={name}: {train_dir} has no class subdirectories")
    return split_names, class_names


@register_source("folder", usage="folder:PATH")
def load(root: str, config=None) -> Source:
    """An image folder: `root/train/<class>/<image>`, optionally val/, validation/, test/."""
    name = PREFIX + root
    split_names, class_names = check(root)
    builder, splits = FileSplits(name, in_memory_bytes(config)), {}
    for split in ["train"] + [s for s in EVAL_SPLITS if s in split_names]:
        paths, labels = _list_split(root, split, class_names)
        splits[split] = builder.split(split, paths, np.array(labels, np.int64), f"{root}/{split}")
    builder.finish()
    return Source(name, class_names, None, splits)
