"""Exact evaluation: every example of a split counted once, on any number of towers.

The input pipeline pads the split to whole batches for every replica and marks
the padding with mask 0 (see `InputPipeline.eval_dataset` in
`data/input_pipeline.py`), so no tower
ever receives an empty or short batch, which a plain Keras step does not
survive under MirroredStrategy. Metrics are mask-weighted sums, reduced across
replicas, and divided once at the end by the real example count. On request
the step also counts a confusion matrix the same way, from which per-class
accuracy follows, and gathers every example's logits from every replica and
worker (for calibration, `evaluation/calibration.py`). Test-time augmentation
(`engine/tta.py`) averages the probabilities of several views of each image
inside the step, on every tower; the metrics are then those of the average.
`eval_record` is the record an evaluation writes to
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

from resnet_app.common import distribute
from resnet_app.common.errors import ConfigError
from resnet_app.data.input_pipeline import InputPipeline
from resnet_app.engine import label_metrics
from resnet_app.engine.tta import CROPS, check_mode, mean_probability_logits, view_logits


@dataclasses.dataclass
class EvalResult:
    """What one pass over a split measured.

    Attributes:
      examples: real examples seen (padding excluded).
      accuracy: top-1 accuracy.
      top5_accuracy: top-5 accuracy (top-k with k = min(5, classes)).
      loss: mean cross-entropy.
      ids: with `collect=True` or `collect_logits=True`, each example's id,
        in the order seen.
      labels: as `ids`: the true labels.
      predictions: as `ids`: the predicted (arg-max) labels.
      confusion: with `confusion=True`, the [classes, classes] int64 counts:
        row = true class, column = predicted class (padding excluded).
      logits: with `collect_logits=True`, float32 [examples, classes] in the
        order of `ids`: the model's logits, or with test-time augmentation
        the log of the views' averaged probabilities (`engine/tta.py`),
        whose softmax is that average.
      scaled_logits: with `collect_logits=True` and a temperature: the same
        with each view's logits divided by the temperature first.
      temperature: the temperature of `scaled_logits` (None without them).
      tta: the test-time augmentation evaluated: None, "flip" or "crops".
      class_examples: single-label data: int64 [classes] examples per true class.
      class_correct: as `class_examples`: the correct ones.
      multi_label: whether the labels were multi-hot rows; then `accuracy` is
        the share of examples whose top class is one of theirs, `top5_accuracy`
        the share with one of theirs in the top k, `loss` the mean binary
        cross-entropy, `labels` the [examples, classes] rows and `scores`
        the sigmoid probabilities.
      scores: multi-label: float32 [examples, classes] probabilities, in the order of `ids`.
      map, f1_micro, f1_macro, average_precision: multi-label: the mean
        average precision, the F1 scores at `threshold` and the per-class AP
        (`label_metrics.py`).
      threshold: multi-label: the probability at which a class is predicted.
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
    average_precision: np.ndarray | None = None
    threshold: float | None = None

    def per_class_recall(self) -> np.ndarray | None:
        """Each true class's recall (single-label); NaN for a class without examples."""
        if self.class_examples is None:
            return None
        return label_metrics.per_class_recall(self.class_examples, self.class_correct)

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

    def metrics(self) -> dict[str, float]:
        values = {
            "examples": self.examples,
            "accuracy": self.accuracy,
            "top5_accuracy": self.top5_accuracy,
            "loss": self.loss,
        }
        if self.multi_label:
            values.update(map=self.map, f1_micro=self.f1_micro, f1_macro=self.f1_macro)
        elif self.class_examples is not None:
            values["balanced_accuracy"] = self.balanced_accuracy
        return values


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
      {"step", "split", "top1", "top5", "loss", "num_examples", "precision"},
      and "balanced_accuracy" and "per_class_recall" (single-label), or "map",
      "f1_micro", "f1_macro" and "threshold" (multi-label).
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
        record.update(
            map=result.map,
            f1_micro=result.f1_micro,
            f1_macro=result.f1_macro,
            threshold=result.threshold,
        )
    elif result.class_examples is not None:
        record["balanced_accuracy"] = result.balanced_accuracy
        record["per_class_recall"] = [round(float(r), 6) for r in result.per_class_recall()]
    return record


def per_replica_batch_size(global_batch_size: int, num_replicas: int) -> int:
    """Evaluation rounds the batch up to a multiple of the replicas; padding fills it."""
    return math.ceil(global_batch_size / num_replicas)


def _distributed_eval_dataset(
    pipeline: InputPipeline,
    global_batch_size: int,
    strategy: tf.distribute.Strategy,
    split: str | None,
    crops: bool = False,
) -> tf.data.Dataset | tf.distribute.DistributedDataset:
    """The split in padded batches, every replica of every worker given a full one.

    With `crops`, each image is its 5 crops (`InputPipeline.eval_dataset`).
    """
    replicas = strategy.num_replicas_in_sync
    batch = per_replica_batch_size(global_batch_size, replicas)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        return pipeline.eval_dataset(
            batch,
            split,
            num_shards=context.num_input_pipelines,
            shard_index=context.input_pipeline_id,
            batches_multiple_of=replicas // context.num_input_pipelines,
            crops=crops,
        )

    return distribute.distribute_datasets(strategy, dataset_fn)


# Compiled evaluation steps, per model: a trainer evaluating every epoch traces once.
_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class _StepOptions:
    """What a compiled step computes besides the metrics; part of its cache key.

    Attributes:
      top_k: k of the top-k accuracy.
      num_classes: set: also count the confusion matrix.
      gather: gather every replica's per-example outputs, logits included.
      tta: None, "flip" or "crops" (`engine/tta.py`).
      temperature: with `gather`: also the logits at this temperature.
      classes: the number of classes: single-label data counts examples and
        correct ones per class ([classes] sums, for balanced accuracy).
      multi_label: multi-hot labels (sigmoid scores, gathered).
    """

    top_k: int
    num_classes: int | None = None
    gather: bool = False
    tta: str | None = None
    temperature: float | None = None
    classes: int = 0
    multi_label: bool = False


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
    if options.classes and not options.multi_label:
        sums["class_examples"] = tf.math.unsorted_segment_sum(mask, labels, options.classes)
        sums["class_correct"] = tf.math.unsorted_segment_sum(
            mask * correct, labels, options.classes
        )
    if options.num_classes:
        # Weighted by the mask so padding is not counted; float32 so that it
        # takes the same all-reduce as the other sums. A step's counts (at
        # most the global batch) are whole numbers, exact in float32.
        sums["confusion"] = tf.math.confusion_matrix(
            labels, predictions, options.num_classes, weights=mask, dtype=tf.float32
        )
    return sums, predictions


def _step_function(model: tf.keras.Model, strategy: tf.distribute.Strategy, options: _StepOptions):
    """The compiled step: (reduced sums, per-example outputs) of one distributed batch.

    The per-example outputs are per-replica values, or with `options.gather`
    tensors holding every replica's (every worker's too): a gather costs a
    collective per step, which only a caller that needs the logits pays.
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
      collect_logits: also return every example's float32 logits, with its
        id, label and prediction. These are gathered from every replica and
        every worker at each step (so calibration, computed from them, covers
        the whole split on each worker alike); off by default, as that gather
        is a collective per step the trainer need not pay.
      tta: None, or the test-time augmentation "flip" or "crops"
        (`engine/tta.py`; "crops" needs ImageNet-family preprocessing). Its
        views' probabilities are averaged, and every metric is of the average.
      temperature: with `collect_logits`, also return the logits with each
        view's logits divided by this temperature before the average.
      threshold: multi-label data: the probability at which a class is
        predicted, for the F1 scores.

    Returns:
      The `EvalResult`.

    Raises:
      ConfigError: for multi-label data with test-time augmentation, a
        temperature or the confusion matrix (single-label notions).
    """
    strategy = strategy or tf.distribute.get_strategy()
    multi_label = pipeline.multi_label
    options = _step_options(pipeline, confusion, collect_logits, tta, temperature)
    crops = options.tta == CROPS
    dataset = _distributed_eval_dataset(pipeline, global_batch_size, strategy, split, crops)
    step = _step_function(model, strategy, options)
    keep = collect or collect_logits or multi_label
    totals, matrix, examples = _run(dataset, step, strategy, options, keep)
    result = _result(totals, matrix)
    result.multi_label = multi_label
    result.tta, result.temperature = options.tta, options.temperature
    if "class_examples" in totals:
        result.class_examples = np.rint(totals["class_examples"]).astype(np.int64)
        result.class_correct = np.rint(totals["class_correct"]).astype(np.int64)
    if examples is not None:
        result.ids, result.labels, result.predictions = (
            examples[k] for k in ("id", "label", "prediction")
        )
        result.logits, result.scaled_logits = examples.get("logits"), examples.get("scaled_logits")
    if multi_label:
        _multi_label_metrics(result, examples, pipeline.num_classes, threshold)
    _log_result(result, pipeline.num_eval_examples(split), options.top_k)
    return result


def _step_options(
    pipeline: InputPipeline,
    confusion: bool,
    collect_logits: bool,
    tta: str | None,
    temperature: float | None,
) -> _StepOptions:
    """What `evaluate`'s step computes; single-label notions refused for multi-label data."""
    if pipeline.multi_label and (tta or temperature is not None or confusion):
        raise ConfigError(
            "this data is multi-label: test-time augmentation, temperature scaling and the "
            "confusion matrix average or count softmax predictions; drop --tta, --temperature "
            "and calibration"
        )
    return _StepOptions(
        top_k=min(5, pipeline.num_classes),
        num_classes=pipeline.num_classes if confusion else None,
        gather=collect_logits,
        tta=check_mode(tta),
        temperature=temperature if collect_logits else None,
        classes=pipeline.num_classes,
        multi_label=pipeline.multi_label,
    )


def _multi_label_metrics(result: EvalResult, examples: dict, classes: int, threshold: float):
    """mAP, F1 and per-class AP from every example's scores (`label_metrics.py`)."""
    scores = examples.get("score", np.zeros((0, classes), np.float32))
    labels = examples["label"].reshape(-1, classes)
    result.scores, result.labels, result.threshold = scores, labels, threshold
    result.map, result.average_precision = label_metrics.mean_average_precision(scores, labels)
    result.f1_micro, result.f1_macro, _ = label_metrics.f1_scores(scores, labels, threshold)


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
            result.examples,
            result.map,
            result.f1_micro,
            result.f1_macro,
            result.threshold,
            result.accuracy,
            result.loss,
        )
        return
    logging.info(
        "Evaluated %d examples%s: accuracy %.4f, top-%d %.4f, loss %.4f%s",
        result.examples,
        f" ({result.tta}: views averaged)" if result.tta else "",
        result.accuracy,
        top_k,
        result.top5_accuracy,
        result.loss,
        f", balanced accuracy {result.balanced_accuracy:.4f}"
        if result.class_examples is not None
        else "",
    )


def _run(
    dataset: tf.data.Dataset | tf.distribute.DistributedDataset,
    step,
    strategy: tf.distribute.Strategy,
    options: _StepOptions,
    keep: bool,
) -> tuple[dict[str, float], np.ndarray | None, dict[str, np.ndarray] | None]:
    """Steps through the dataset: the host's sums, the confusion counts, the real examples.

    Returns:
      (sums, confusion or None, per-example arrays of the real examples or
      None without `keep`): sums in float64 and counts in int64 on the host,
      as float32 stops being exact past 2**24.
    """
    totals: dict = dict.fromkeys(("examples", "correct", "correct_top_k", "loss"), 0.0)
    classes = options.num_classes
    matrix = np.zeros((classes, classes), np.int64) if classes else None
    parts: list[dict[str, np.ndarray]] = []
    for batch in dataset:
        sums, per_example = step(batch)
        if classes:  # Each step's counts are whole numbers.
            matrix += np.rint(sums.pop("confusion").numpy()).astype(np.int64)
        for key, value in sums.items():
            if value.shape.rank:  # The per-class counts, whole numbers each step.
                totals[key] = totals.get(key, 0) + value.numpy().astype(np.float64)
            else:
                totals[key] += float(value.numpy())
        if keep:
            parts.extend(_real_examples(per_example, strategy))
    return totals, matrix, _concatenate(parts) if keep else None


def _real_examples(per_example: dict, strategy: tf.distribute.Strategy) -> list[dict]:
    """A step's per-example outputs as NumPy, padding dropped: one dict per local replica.

    Gathered outputs are plain tensors, already every replica's: one dict.
    """
    keys = list(per_example)
    locals_ = [strategy.experimental_local_results(per_example[k]) for k in keys]
    found = []
    for values in zip(*locals_):
        arrays = {k: v.numpy() for k, v in zip(keys, values)}
        real = arrays.pop("mask") > 0
        found.append({k: v[real] for k, v in arrays.items()})
    return found


def _concatenate(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The per-step arrays joined, in the order seen; empty int64 arrays for no step."""
    if not parts:
        return dict.fromkeys(("id", "label", "prediction"), np.zeros(0, np.int64))
    return {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}


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
