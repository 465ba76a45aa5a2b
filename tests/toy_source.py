"""A data source of the user's own, as a plugin: one module, one registration line.

`RESNET_APP_PLUGINS=tests.toy_source` (or an entry point of the group
`resnet_app.sources`) makes `--dataset=arrays:FILE.npz` read a NumPy archive
holding `train_images`, `train_labels`, `test_images` and `test_labels`
(uint8 [N, H, W, C] images, integer labels), with optional `class_names`.
tests/test_source_plugin.py runs it through every command.
"""

import os

import numpy as np

from resnet_app.common.errors import ConfigError
from resnet_app.data.sources import Source, Split, register_source


def write_example(directory, images, labels, splits):
    """The images and labels as one archive under `directory`; its `--dataset` value."""
    path = os.path.join(directory, "toy.npz")
    chosen = {name: np.array([split == name for split in splits]) for name in ("train", "test")}
    arrays = {f"{name}_images": images[rows] for name, rows in chosen.items()}
    arrays.update({f"{name}_labels": np.asarray(labels)[rows] for name, rows in chosen.items()})
    np.savez(path, **arrays)
    return f"arrays:{path}"


@register_source("arrays", usage="arrays:FILE.npz", example=write_example)
def load(argument, config=None):
    """The archive's "train" and "test" splits, in memory."""
    if not os.path.isfile(argument):
        raise ConfigError(f"--dataset=arrays:{argument}: no such file; give a .npz archive")
    with np.load(argument) as archive:
        arrays = dict(archive)
    labels = np.concatenate([arrays["train_labels"], arrays["test_labels"]])
    count = int(labels.max()) + 1
    classes = [str(name) for name in arrays.get("class_names", range(count))]
    splits = {
        name: Split(
            name,
            len(arrays[f"{name}_labels"]),
            labels=arrays[f"{name}_labels"].astype(np.int64),
            images=arrays[f"{name}_images"],
        )
        for name in ("train", "test")
    }
    height, width = arrays["train_images"].shape[1:3]
    return Source(f"arrays:{argument}", classes, height if height == width else None, splits)
