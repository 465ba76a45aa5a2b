"""The examples a report page shows, picked while the evaluation passes over the split.

A `Gallery` is `exact_eval.evaluate`'s `on_batch`: it keeps the `count`
examples of highest loss (their model inputs, for Grad-CAM) and, for each
(true, predicted) pair of a mistake, thumbnails of its `per_pair` highest-loss
examples. Memory stays bounded by those, whatever the split's size.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from resnet_app.evaluation import calibration

THUMBNAIL = 96  # Pixels: larger images are shrunk to it, smaller ones drawn at it by the page.


def example_losses(logits: np.ndarray, labels: np.ndarray, multi_label: bool) -> np.ndarray:
    """float64 [examples]: cross-entropy of the softmax (multi-label: the mean binary
    cross-entropy of the sigmoids), as the evaluation's loss counts it."""
    logits = logits.astype(np.float64)
    if multi_label:
        bce = np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
        return bce.mean(axis=1)
    return -calibration.log_softmax(logits)[np.arange(len(labels)), labels]


def pixels(images: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """uint8 [..., channels]: normalized model inputs back on the 0-255 scale."""
    std, mean = np.asarray(std, np.float32), np.asarray(mean, np.float32)
    restored = images.astype(np.float32) * std + mean
    return np.clip(np.rint(restored), 0, 255).astype(np.uint8)


def resized(images: np.ndarray, size: int) -> np.ndarray:
    """[batch, size, size, channels] float32: square images scaled, averaging pixels when
    shrinking and repeating them when growing (no blur on a 28-pixel image)."""
    method = "area" if images.shape[1] > size else "nearest"
    return tf.image.resize(tf.cast(images, tf.float32), [size, size], method=method).numpy()


def thumbnails(pixels_: np.ndarray) -> np.ndarray:
    """uint8: images larger than `THUMBNAIL` shrunk to it; smaller ones as they are."""
    if pixels_.shape[1] <= THUMBNAIL:
        return pixels_
    return np.clip(np.rint(resized(pixels_, THUMBNAIL)), 0, 255).astype(np.uint8)


class Gallery:
    """The split's highest-loss examples and each confused pair's, from `add(batch)` calls."""

    def __init__(self, count: int, mean, std, multi_label: bool, per_pair: int = 3):
        self.count, self.per_pair, self.multi_label = count, per_pair, multi_label
        self.mean, self.std = mean, std
        # The worst so far: arrays of equal length, highest loss first.
        self.worst: dict[str, np.ndarray] = {}
        # (true, predicted) -> [(loss, id, thumbnail)], highest loss first.
        self.pairs: dict[tuple[int, int], list[tuple[float, int, np.ndarray]]] = {}

    def add(self, batch: dict[str, np.ndarray]) -> None:
        """Takes one batch of real examples: "id", "label", "prediction", "logits", "image"."""
        losses = example_losses(batch["logits"], batch["label"], self.multi_label)
        keys = ("id", "label", "prediction", "logits", "image")
        merged = {key: batch[key] for key in keys}
        merged["loss"] = losses
        if self.worst:
            merged = {key: np.concatenate([self.worst[key], merged[key]]) for key in merged}
        # Highest loss first; equal losses by example id, so the order is the split's own.
        order = np.lexsort((merged["id"], -merged["loss"]))[: self.count]
        self.worst = {key: value[order] for key, value in merged.items()}
        if not self.multi_label:
            self._add_pairs(batch, losses)

    def _add_pairs(self, batch: dict[str, np.ndarray], losses: np.ndarray) -> None:
        """Keeps the thumbnails of the mistakes that rank among their pair's `per_pair` worst."""
        entering = []
        for index in np.flatnonzero(batch["label"] != batch["prediction"]):
            kept = self.pairs.get((int(batch["label"][index]), int(batch["prediction"][index])))
            if kept is None or len(kept) < self.per_pair or losses[index] > kept[-1][0]:
                entering.append(index)
        if not entering:
            return
        small = thumbnails(pixels(batch["image"][entering], self.mean, self.std))
        for index, thumbnail in zip(entering, small):
            pair = (int(batch["label"][index]), int(batch["prediction"][index]))
            kept = self.pairs.setdefault(pair, [])
            kept.append((float(losses[index]), int(batch["id"][index]), thumbnail))
            kept.sort(key=lambda entry: (-entry[0], entry[1]))
            del kept[self.per_pair :]
