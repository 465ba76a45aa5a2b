"""Exact evaluation: every example of a split counted once, on any number of towers.

The input pipeline pads the split to whole batches for every replica and marks
the padding with mask 0 (see `InputPipeline.eval_dataset` in
`data/input_pipeline.py`), so no tower
ever receives an empty or short batch, which a plain Keras step does not
survive under MirroredStrategy. Metrics are mask-weighted sums, reduced across
replicas, and divided once at the end by the real example count. On request
the step also counts a confusion matrix the same way, from which per-class
accuracy follows. `eval_record` is the record an evaluation writes to
`metrics.jsonl`, the same for the trainer and `python -m resnet_app.evaluate`.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from resnet_app.data.input_pipeline import InputPipeline


@dataclasses.dataclass
class EvalResult:
    """What one pass over a split measured.

    Attributes:
      examples: real examples seen (padding excluded).
      accuracy: top-1 accuracy.
      top5_accuracy: top-5 accuracy (top-k with k = min(5, classes)).
      loss: mean cross-entropy.
      ids: with `collect=True`, each example's id, in the order seen.
      labels: with `collect=True`, the true labels.
      predictions: with `collect=True`, the predicted (arg-max) labels.
      confusion: with `confusion=True`, the [classes, classes] int64 counts:
        row = true class, column = predicted class (padding excluded).
    """

    examples: int
    accuracy: float
    top5_accuracy: float
    loss: float
    ids: np.ndarray | None = None
    labels: np.ndarray | None = None
    predictions: np.ndarray | None = None
    confusion: np.ndarray | None = None

    def per_class_accuracy(self) -> np.ndarray:
        """Top-1 accuracy of each true class; NaN for a class with no examples.

        Raises:
          ValueError: when the result was evaluated without `confusion=True`.
        """
        if self.confusion is None:
            raise ValueError("per-class accuracy needs evaluate(..., confusion=True)")
        return per_class_accuracy(self.confusion)

    def metrics(self) -> dict[str, float]:
        return {
            "examples": self.examples,
            "accuracy": self.accuracy,
            "top5_accuracy": self.top5_accuracy,
            "loss": self.loss,
        }


def per_class_accuracy(confusion: np.ndarray) -> np.ndarray:
    """Each true class's top-1 accuracy from a confusion matrix (rows = true class).

    Args:
      confusion: [classes, classes] counts, row = true class, column = predicted.

    Returns:
      float64 [classes]: the diagonal over the row sums; NaN for an empty row.
    """
    examples = confusion.sum(axis=1)
    correct = np.diagonal(confusion)
    return np.where(examples > 0, correct / np.maximum(examples, 1), np.nan)


def eval_record(step: int, split: str, result: EvalResult, precision: str) -> dict[str, Any]:
    """The record of an evaluation, as `metrics.jsonl` holds it (trainer and evaluate alike).

    Args:
      step: the training step of the weights evaluated.
      split: the split evaluated.
      result: what the evaluation measured.
      precision: the `train.precision` the model computed in ("fp32", "bf16"
        or "fp16"): a mixed-precision run is evaluated at its own precision.

    Returns:
      {"step", "split", "top1", "top5", "loss", "num_examples", "precision"}.
    """
    return {
        "step": step,
        "split": split,
        "top1": result.accuracy,
        "top5": result.top5_accuracy,
        "loss": result.loss,
        "num_examples": result.examples,
        "precision": precision,
    }


def per_replica_batch_size(global_batch_size: int, num_replicas: int) -> int:
    """Evaluation rounds the batch up to a multiple of the replicas; padding fills it."""
    return math.ceil(global_batch_size / num_replicas)


def _distributed_eval_dataset(
    pipeline: InputPipeline,
    global_batch_size: int,
    strategy: tf.distribute.Strategy,
    split: str | None,
) -> tf.distribute.DistributedDataset:
    """The split in padded batches, every replica of every worker given a full one."""
    replicas = strategy.num_replicas_in_sync
    batch = per_replica_batch_size(global_batch_size, replicas)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        return pipeline.eval_dataset(
            batch,
            split,
            num_shards=context.num_input_pipelines,
            shard_index=context.input_pipeline_id,
            batches_multiple_of=replicas // context.num_input_pipelines,
        )

    return strategy.distribute_datasets_from_function(dataset_fn)


# Compiled evaluation steps, per model: a trainer evaluating every epoch traces once.
_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _step_function(
    model: tf.keras.Model, strategy: tf.distribute.Strategy, top_k: int, num_classes: int | None
):
    """The compiled step; `num_classes` set means it also counts a confusion matrix."""
    key = (id(strategy), top_k, num_classes)
    steps = _STEPS.setdefault(model, {})
    if key in steps:
        return steps[key][1]

    model_ref = weakref.ref(model)  # A strong one here would keep the model alive.

    def replica_step(batch):
        logits = tf.cast(model_ref()(batch["image"], training=False), tf.float32)
        labels, mask = batch["label"], batch["mask"]
        predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
        correct = tf.cast(tf.equal(predictions, labels), tf.float32)
        in_top_k = tf.cast(tf.math.in_top_k(labels, logits, top_k), tf.float32)
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        sums = {
            "examples": tf.reduce_sum(mask),
            "correct": tf.reduce_sum(mask * correct),
            "correct_top_k": tf.reduce_sum(mask * in_top_k),
            "loss": tf.reduce_sum(mask * loss),
        }
        if num_classes:
            # Weighted by the mask so padding is not counted; float32 so that it
            # takes the same all-reduce as the other sums. A step's counts (at
            # most the global batch) are whole numbers, exact in float32.
            sums["confusion"] = tf.math.confusion_matrix(
                labels, predictions, num_classes, weights=mask, dtype=tf.float32
            )
        return sums, (batch["id"], labels, predictions, mask)

    @tf.function
    def step(batch):
        sums, per_example = strategy.run(replica_step, args=(batch,))
        sums = {
            k: strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in sums.items()
        }
        return sums, per_example

    # The strategy is kept alive with its function, so its id cannot be reused.
    steps[key] = (strategy, step)
    return step


def evaluate(
    model: tf.keras.Model,
    pipeline: InputPipeline,
    global_batch_size: int,
    strategy: tf.distribute.Strategy | None = None,
    split: str | None = None,
    collect: bool = False,
    confusion: bool = False,
) -> EvalResult:
    """Runs `model` over a whole split, in inference mode.

    Args:
      model: maps a batch of images to logits; its variables were created in
        `strategy.scope()`.
      pipeline: the input pipeline.
      global_batch_size: examples per step over all replicas (rounded up to a
        multiple of the replicas; the extra slots are padding).
      strategy: the distribution strategy (default: the current one).
      split: the split (default: the pipeline's evaluation split).
      collect: also return every example's id, label and prediction (those
        of this worker's replicas, in a multi-worker run).
      confusion: also count the confusion matrix over every example of the
        split (all replicas and workers). Off by default: it costs a
        [classes, classes] all-reduce per step, which the trainer's periodic
        evaluations need not pay.

    Returns:
      The `EvalResult`.
    """
    strategy = strategy or tf.distribute.get_strategy()
    dataset = _distributed_eval_dataset(pipeline, global_batch_size, strategy, split)
    top_k = min(5, pipeline.num_classes)
    num_classes = pipeline.num_classes
    step = _step_function(model, strategy, top_k, num_classes if confusion else None)

    # Sums in float64 on the host: float32 counts stop being exact past 2**24.
    totals = dict.fromkeys(("examples", "correct", "correct_top_k", "loss"), 0.0)
    # Counts in int64 on the host, for the same reason; each step's are whole numbers.
    matrix = np.zeros((num_classes, num_classes), np.int64)
    seen = []
    for batch in dataset:
        sums, per_example = step(batch)
        if confusion:
            matrix += np.rint(sums.pop("confusion").numpy()).astype(np.int64)
        for key, value in sums.items():
            totals[key] += float(value.numpy())
        if collect:
            locals_ = [strategy.experimental_local_results(t) for t in per_example]
            for ids, labels, predictions, mask in zip(*locals_):
                real = mask.numpy() > 0
                seen.append((ids.numpy()[real], labels.numpy()[real], predictions.numpy()[real]))
    result = _result(totals, matrix if confusion else None)
    count, expected = result.examples, pipeline.num_eval_examples(split)
    if count != expected:
        logging.warning(
            "Evaluated %d of the %d examples of the split: the others failed to decode "
            "(see the warnings above)",
            count,
            expected,
        )
    if collect:
        columns = list(zip(*seen)) or [[np.zeros(0, np.int64)]] * 3
        result.ids, result.labels, result.predictions = (np.concatenate(c) for c in columns)
    logging.info(
        "Evaluated %d examples: accuracy %.4f, top-%d %.4f, loss %.4f",
        result.examples,
        result.accuracy,
        top_k,
        result.top5_accuracy,
        result.loss,
    )
    return result


def _result(totals: dict[str, float], confusion: np.ndarray | None) -> EvalResult:
    """The metrics from the host's sums: each divided once by the real example count."""
    count = int(round(totals["examples"]))
    denominator = max(count, 1)
    return EvalResult(
        examples=count,
        accuracy=totals["correct"] / denominator,
        top5_accuracy=totals["correct_top_k"] / denominator,
        loss=totals["loss"] / denominator,
        confusion=confusion,
    )
