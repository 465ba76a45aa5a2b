"""Imbalanced classes: loss weights per class and class-balanced sampling.

- `train.class_weights`: each example's loss is scaled by its class's weight. "balanced"
  gives class c the weight n / (classes * count_c) over the classes with training examples
  (scikit-learn's `compute_class_weight`), so every class adds the same total weight to an
  epoch and the weights' mean over the examples is 1; a mapping names some classes' weights.
- `data.sampling: balanced`: each position of an epoch draws a class uniformly, then an
  example of it (with replacement), a stateless function of (seed, epoch, position), so a
  resumed run draws what the interrupted one would have.
Both need one class per image.
"""

from __future__ import annotations

import numpy as np
from absl import logging

from resnet_app.common.errors import ConfigError

SAMPLINGS = ("natural", "balanced")


def class_weights(setting, class_names: list[str], counts: np.ndarray | None) -> np.ndarray | None:
    """float32 [classes] loss weights from `train.class_weights` (None, "balanced" or
    {class name: weight}), or None; "balanced" needs the training examples per class."""
    if setting is None:
        return None
    classes = len(class_names)
    if isinstance(setting, str):  # "balanced"
        if counts is None:
            raise ConfigError(
                "train.class_weights=balanced needs the training labels' counts, which this "
                "source does not know; give a mapping of class names to weights"
            )
        present = counts > 0
        weights = np.ones(classes)
        # A class without training examples weighs nothing either way; it keeps 1.
        weights[present] = counts.sum() / (present.sum() * counts[present])
        logging.info(
            "Class weights (balanced): %.3g to %.3g, from %d to %d examples per class",
            weights[present].min(),
            weights[present].max(),
            counts[present].max(),
            counts[present].min(),
        )
        return weights.astype(np.float32)
    unknown = sorted(set(setting) - set(class_names))
    if unknown:
        shown = ", ".join(class_names[:8]) + (", ..." if classes > 8 else "")
        raise ConfigError(
            f"train.class_weights names {', '.join(unknown)}, which the data does not have; "
            f"its classes are {shown}"
        )
    weights = np.ones(classes, np.float32)
    for name, weight in setting.items():
        weights[class_names.index(name)] = weight
    return weights


def check_single_label_options(config, multi_label: bool) -> None:
    """Refuses, in one line, the options of the run's `config` that need one class per image."""
    if not multi_label:
        return
    refused = []
    if config.train.class_weights is not None:
        refused.append("train.class_weights")
    if config.data.sampling != "natural":
        refused.append(f"data.sampling={config.data.sampling}")
    if config.train.best_metric in ("top5", "ema_top5", "balanced_accuracy"):
        refused.append(f"train.best_metric={config.train.best_metric}")
    if config.data.augment.augmix_jsd:
        refused.append("data.augment.augmix_jsd")
    if refused:
        raise ConfigError(
            f"{config.data.dataset} is multi-label and {', '.join(refused)} needs one class "
            "per image; drop it (multi-label trains sigmoid binary cross-entropy, ranks by map)"
        )


def balanced_order(labels, num_classes: int, seed: int, epoch) -> object:
    """An epoch of class-balanced draws: int64 example indices (position i reads example
    result[i]), a function of (seed, epoch) through the `seeds.SAMPLE` stream."""
    import tensorflow as tf

    from resnet_app.data import seeds

    counts = np.bincount(labels, minlength=num_classes)
    present = np.flatnonzero(counts)
    members = np.argsort(labels, kind="stable")  # Grouped by class, in index order.
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[present]
    size = len(labels)
    class_seed, member_seed = tf.unstack(
        tf.random.experimental.stateless_split(seeds.stream_seed(seed, seeds.SAMPLE, epoch), 2)
    )
    picks = tf.random.stateless_uniform(
        [size], class_seed, minval=0, maxval=len(present), dtype=tf.int64
    )
    share = tf.random.stateless_uniform([size], member_seed, dtype=tf.float64)
    count = tf.gather(tf.constant(counts[present], tf.int64), picks)
    within = tf.minimum(tf.cast(share * tf.cast(count, tf.float64), tf.int64), count - 1)
    first = tf.gather(tf.constant(starts, tf.int64), picks)
    return tf.gather(tf.constant(members, tf.int64), first + within)
