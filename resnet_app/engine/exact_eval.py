"""Exact evaluation: every example of a split counted once, on any number of towers.

The input pipeline pads the split to whole batches for every replica and marks
the padding with mask 0 (`InputPipeline.eval_dataset`), so no tower gets an
empty or short batch, which a plain Keras step does not survive under
MirroredStrategy. Metrics are mask-weighted sums, reduced across replicas and
divided once at the end by the real example count. On request the step also
counts a confusion matrix, and gathers every example's logits from every
replica and worker (for calibration), and hands each batch's examples, images
included, to a callback (for the report page). Test-time augmentation (`tta.py`)
averages the probabilities of several views inside the step.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from resnet_app.common import distribute
from resnet_app.common.errors import ConfigError
from resnet_app.data.input_pipeline import InputPipeline
from resnet_app.engine import label_metrics
from resnet_app.engine.tta import CROPS, check_mode, mean_probability_logits, view_logits


@dataclasses.dataclass
class EvalResult:
    """What one pass over a split measured (padding excluded).

    `accuracy` is top-1 and `top5_accuracy` top-k with k = min(5, classes).
    `ids`, `labels` and `predictions` are kept with `collect` or
    `collect_logits`, in the order seen; `confusion` (row = true class) with
    `confusion`; `logits` (the log of the views' mean probabilities under TTA)
    and `scaled_logits` (at `temperature`) with `collect_logits`.
    `class_examples` and `class_correct` are single-label per-class counts.
    Multi-label data: `accuracy` is the share whose top class is one of
    theirs, `top5_accuracy` with one of theirs in the top k, `loss` the mean
    binary cross-entropy, `labels` the multi-hot rows, `scores` the sigmoid
    probabilities, and `map`, `f1_micro`, `f1_macro` at `threshold` come
    from `label_metrics.py`.
    """

    examples: int
    accuracy: float
    top5_accuracy: float
    loss: float
    ids: np.ndarray | None = None
    labels: np.ndarray | None = None
    predictions: np.ndarray | None = None
    confusion: np.ndarray | None = None
    logits: np.ndarray | None = None
    scaled_logits: np.ndarray | None = None
    temperature: float | None = None
    tta: str | None = None
    class_examples: np.ndarray | None = None
    class_correct: np.ndarray | None = None
    multi_label: bool = False
    scores: np.ndarray | None = None
    map: float | None = None
    f1_micro: float | None = None
    f1_macro: float | None = None
    threshold: float | None = None

    @property
    def balanced_accuracy(self) -> float | None:
        """The mean per-class recall (single-label), over the classes with examples."""
        if self.class_examples is None:
            return None
        return label_metrics.balanced_accuracy(self.class_examples, self.class_correct)

    def per_class_accuracy(self) -> np.ndarray:
        """Top-1 accuracy of each true class; NaN for a class with no examples.

        Raises:
          ValueError: when the result was evaluated without `confusion=True`.
        """
        if self.confusion is None:
            raise ValueError("per-class accuracy needs evaluate(..., confusion=True)")
        return per_class_accuracy(self.confusion)


def per_class_accuracy(confusion: np.ndarray) -> np.ndarray:
    """float64 [classes]: each true class's top-1 accuracy (rows = true class); NaN for none."""
    return label_metrics.per_class_recall(confusion.sum(axis=1), np.diagonal(confusion))


def eval_record(step: int, split: str, result: EvalResult, precision: str) -> dict[str, Any]:
    """The record of an evaluation in `metrics.jsonl` (trainer and evaluate alike).

    `precision` is the `train.precision` the model computed in. Single-label
    data adds "balanced_accuracy" and "per_class_recall", multi-label "map",
    "f1_micro", "f1_macro" and "threshold".
    """
    record = {
        "step": step,
        "split": split,
        "top1": result.accuracy,
        "top5": result.top5_accuracy,
        "loss": result.loss,
        "num_examples": result.examples,
        "precision": precision,
    }
    if result.multi_label:
        record.update(map=result.map, f1_micro=result.f1_micro, f1_macro=result.f1_macro)
        record["threshold"] = result.threshold
    elif result.class_examples is not None:
        record["balanced_accuracy"] = result.balanced_accuracy
        recall = label_metrics.per_class_recall(result.class_examples, result.class_correct)
        record["per_class_recall"] = [round(float(r), 6) for r in recall]
    return record


def per_replica_batch_size(global_batch_size: int, num_replicas: int) -> int:
    """Evaluation rounds the batch up to a multiple of the replicas; padding fills it."""
    return math.ceil(global_batch_size / num_replicas)


# Compiled evaluation steps, per model: a trainer evaluating every epoch traces once.
_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class _StepOptions:
    """What a compiled step computes besides the metrics; part of its cache key.

    `gather` gathers every replica's per-example outputs, logits included,
    and `temperature` (with `gather`) adds the logits at that temperature.
    """

    top_k: int
    classes: int
    confusion: bool
    gather: bool
    tta: str | None
    temperature: float | None
    multi_label: bool
    images: bool = False


def _sums(
    logits: tf.Tensor, labels: tf.Tensor, mask: tf.Tensor, options: _StepOptions
) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """One replica's mask-weighted metric sums, and its arg-max predictions."""
    predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
    if options.multi_label:
        # The top class is one of the example's; one of the top k is.
        correct = tf.cast(tf.gather(labels, predictions, batch_dims=1) > 0.5, tf.float32)
        top = tf.math.top_k(logits, options.top_k).indices
        in_top_k = tf.cast(
            tf.reduce_any(tf.gather(labels, top, batch_dims=1) > 0.5, axis=-1), tf.float32
        )
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits), -1)
    else:
        correct = tf.cast(tf.equal(predictions, labels), tf.float32)
        in_top_k = tf.cast(tf.math.in_top_k(labels, logits, options.top_k), tf.float32)
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    sums = {
        "examples": tf.reduce_sum(mask),
        "correct": tf.reduce_sum(mask * correct),
        "correct_top_k": tf.reduce_sum(mask * in_top_k),
        "loss": tf.reduce_sum(mask * loss),
    }
    classes = options.classes
    if not options.multi_label:
        sums["class_examples"] = tf.math.unsorted_segment_sum(mask, labels, classes)
        sums["class_correct"] = tf.math.unsorted_segment_sum(mask * correct, labels, classes)
    if options.confusion:
        # Weighted by the mask so padding is not counted; float32 to share the
        # other sums' all-reduce (a step's whole-number counts are exact in it).
        sums["confusion"] = tf.math.confusion_matrix(
            labels, predictions, classes, weights=mask, dtype=tf.float32
        )
    return sums, predictions


def _step_function(model: tf.keras.Model, strategy: tf.distribute.Strategy, options: _StepOptions):
    """The compiled step: (reduced sums, per-example outputs) of one distributed batch.

    The per-example outputs are per-replica values, or with `options.gather`
    every replica's (every worker's too): a collective per step that only a
    caller needing the logits pays.
    """
    key = (id(strategy), options)
    steps = _STEPS.setdefault(model, {})
    if key in steps:
        return steps[key][1]

    model_ref = weakref.ref(model)  # A strong one here would keep the model alive.

    def replica_step(batch):
        views = view_logits(model_ref(), batch["image"], options.tta)
        logits = mean_probability_logits(views)
        labels, mask = batch["label"], batch["mask"]
        sums, predictions = _sums(logits, labels, mask, options)
        per_example = {"id": batch["id"], "label": labels, "prediction": predictions, "mask": mask}
        if options.images:  # float32: a collective gathers no bfloat16.
            per_example["image"] = tf.cast(batch["image"], tf.float32)
        if options.multi_label:
            per_example["score"] = tf.sigmoid(logits)
        if options.gather:
            per_example["logits"] = logits
            if options.temperature is not None:
                per_example["scaled_logits"] = mean_probability_logits(views, options.temperature)
        return sums, per_example

    @tf.function
    def step(batch):
        sums, per_example = strategy.run(replica_step, args=(batch,))
        sums = {
            k: strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in sums.items()
        }
        if options.gather or options.multi_label:
            per_example = {k: strategy.gather(v, axis=0) for k, v in per_example.items()}
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
    *,
    collect_logits: bool = False,
    tta: str | None = None,
    temperature: float | None = None,
    threshold: float = 0.5,
    on_batch: Callable[[dict[str, np.ndarray]], None] | None = None,
) -> EvalResult:
    """Runs `model` (variables made in `strategy.scope()`) over a whole split, in inference mode.

    Args:
      global_batch_size: examples per step over all replicas (rounded up to a
        multiple of the replicas; the extra slots are padding).
      strategy, split: default: the current one, and the pipeline's evaluation split.
      collect: also return every example's id, label and prediction (this
        worker's replicas').
      confusion: also count the confusion matrix (an all-reduce per step).
      collect_logits: also return every example's float32 logits, id, label and
        prediction, gathered from every replica and worker (for calibration).
      tta: None, "flip" or "crops" (`tta.py`): metrics of the views' mean probabilities.
      temperature: with `collect_logits`, also the logits with each view's
        divided by it before the average.
      threshold: multi-label data: the probability at which a class is predicted.
      on_batch: with `collect_logits`, given each batch's real examples, images too.

    Raises:
      ConfigError: for multi-label data with test-time augmentation, a
        temperature or the confusion matrix (single-label notions).
    """
    strategy = strategy or tf.distribute.get_strategy()
    multi_label, classes = pipeline.multi_label, pipeline.num_classes
    if multi_label and (tta or temperature is not None or confusion):
        raise ConfigError(
            "this data is multi-label: test-time augmentation, temperature scaling and the "
            "confusion matrix average or count softmax predictions; drop --tta, --temperature "
            "and calibration"
        )
    options = _StepOptions(
        top_k=min(5, classes),
        classes=classes,
        confusion=confusion,
        gather=collect_logits,
        tta=check_mode(tta),
        temperature=temperature if collect_logits else None,
        multi_label=multi_label,
        images=on_batch is not None,
    )
    replicas = strategy.num_replicas_in_sync
    batch = per_replica_batch_size(global_batch_size, replicas)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        # The split in padded batches, every replica of every worker given a full one.
        return pipeline.eval_dataset(
            batch,
            split,
            num_shards=context.num_input_pipelines,
            shard_index=context.input_pipeline_id,
            batches_multiple_of=replicas // context.num_input_pipelines,
            crops=options.tta == CROPS,
        )

    dataset = distribute.distribute_datasets(strategy, dataset_fn)
    step = _step_function(model, strategy, options)
    keep = collect or collect_logits or multi_label  # Each example's arrays.
    result = _run(dataset, step, strategy, options, keep, on_batch)
    if multi_label:
        scores = np.zeros((0, classes), np.float32) if result.scores is None else result.scores
        labels = result.labels.reshape(-1, classes)
        result.scores, result.labels, result.threshold = scores, labels, threshold
        result.map, _ = label_metrics.mean_average_precision(scores, labels)
        result.f1_micro, result.f1_macro, _ = label_metrics.f1_scores(scores, labels, threshold)
    _log_result(result, pipeline.num_eval_examples(split), options.top_k)
    return result


def _log_result(result: EvalResult, expected: int, top_k: int) -> None:
    """Logs the numbers, and warns when examples are missing (files that failed to decode)."""
    if result.examples != expected:
        logging.warning(
            "Evaluated %d of the %d examples of the split: the others failed to decode "
            "(see the warnings above)",
            result.examples,
            expected,
        )
    if result.multi_label:
        logging.info(
            "Evaluated %d examples: mAP %.4f, F1 micro %.4f, macro %.4f (threshold %g), "
            "top class right %.4f, loss %.4f",
            result.examples, result.map, result.f1_micro, result.f1_macro,
            result.threshold, result.accuracy, result.loss,
        )  # fmt: skip
        return
    views = f" ({result.tta}: views averaged)" if result.tta else ""
    balanced = result.balanced_accuracy
    balanced = "" if balanced is None else f", balanced accuracy {balanced:.4f}"
    logging.info(
        "Evaluated %d examples%s: accuracy %.4f, top-%d %.4f, loss %.4f%s",
        result.examples, views, result.accuracy, top_k, result.top5_accuracy, result.loss,
        balanced,
    )  # fmt: skip


def _run(
    dataset: tf.data.Dataset | tf.distribute.DistributedDataset,
    step,
    strategy: tf.distribute.Strategy,
    options: _StepOptions,
    keep: bool,
    on_batch: Callable[[dict[str, np.ndarray]], None] | None = None,
) -> EvalResult:
    """Steps through the dataset: the metrics, and with `keep` the real examples' arrays
    (each batch's also to `on_batch`).

    The host sums in float64 and counts in int64, as float32 stops being exact past 2**24.
    """
    totals: dict = dict.fromkeys(("examples", "correct", "correct_top_k", "loss"), 0.0)
    classes = options.classes
    matrix = np.zeros((classes, classes), np.int64) if options.confusion else None
    parts: list[dict[str, np.ndarray]] = []
    for batch in dataset:
        sums, per_example = step(batch)
        if options.confusion:  # Each step's counts are whole numbers.
            matrix += np.rint(sums.pop("confusion").numpy()).astype(np.int64)
        for key, value in sums.items():
            if value.shape.rank:  # The per-class counts, whole numbers each step.
                totals[key] = totals.get(key, 0) + value.numpy().astype(np.float64)
            else:
                totals[key] += float(value.numpy())
        if keep:  # One dict per local replica (gathered outputs: one, already everyone's).
            keys = list(per_example)
            for values in zip(*(strategy.experimental_local_results(per_example[k]) for k in keys)):
                arrays = {k: v.numpy() for k, v in zip(keys, values)}
                real = arrays.pop("mask") > 0
                arrays = {k: v[real] for k, v in arrays.items()}
                if on_batch is not None:
                    on_batch(arrays)
                arrays.pop("image", None)
                parts.append(arrays)
    count = int(round(totals["examples"]))
    denominator = max(count, 1)  # Each sum divided once by the real example count.
    result = EvalResult(
        examples=count,
        accuracy=totals["correct"] / denominator,
        top5_accuracy=totals["correct_top_k"] / denominator,
        loss=totals["loss"] / denominator,
        confusion=matrix,
        multi_label=options.multi_label,
        tta=options.tta,
        temperature=options.temperature,
    )
    if "class_examples" in totals:
        result.class_examples = np.rint(totals["class_examples"]).astype(np.int64)
        result.class_correct = np.rint(totals["class_correct"]).astype(np.int64)
    if keep:
        if not parts:  # No step: empty int64 arrays.
            parts = [dict.fromkeys(("id", "label", "prediction"), np.zeros(0, np.int64))]
        examples = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
        result.ids, result.labels = examples["id"], examples["label"]
        result.predictions, result.scores = examples["prediction"], examples.get("score")
        result.logits, result.scaled_logits = examples.get("logits"), examples.get("scaled_logits")
    return result
