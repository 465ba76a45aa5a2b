"""`--dataset=shapes`: the built-in, procedurally generated dataset (`data/shapes.py`)."""

from __future__ import annotations

from resnet_app.data import shapes
from resnet_app.data.sources.base import Source, Split
from resnet_app.data.sources.registry import register_source


def load_shapes(
    cache_dir: str | None = None,
    train_examples: int | None = None,
    test_examples: int | None = None,
) -> Source:
    """The `shapes` splits, generated or cached, as in-memory arrays."""
    splits = {}
    for name, count in (("train", train_examples), ("test", test_examples)):
        images, labels = shapes.load(name, count, cache_dir=cache_dir)
        splits[name] = Split(name, len(labels), labels=labels, images=images)
    return Source("shapes", list(shapes.CLASS_NAMES), shapes.IMAGE_SIZE, splits)


@register_source("shapes", usage="shapes", needs_argument=False)
def load(argument: str, config) -> Source:
    return load_shapes(config.data_dir, config.train_examples, config.eval_examples)
