"""Checkpoint averaging, the work of `resnet-app average`: uniform, or a greedy soup.

- Uniform: every model variable is the mean of its values in the chosen
  checkpoints (timm's `avg_checkpoints.py`).
- Greedy soup (Wortsman et al. 2022): the checkpoints ranked by their own
  score on a held-out split; each joins the soup if its score is no worse.
- With `bn_batches` > 0, the average's BatchNorm statistics are measured
  again on training batches (SWA's `update_bn`, Izmailov et al. 2018).

The average is written as the run's averaged checkpoint (`averaged/`), which
`--checkpoint=averaged` picks. A soup chooses on a split, so it refuses the
test split.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import numpy as np
from absl import logging

from resnet_app import config
from resnet_app.common import run_dir
from resnet_app.common.errors import ConfigError
from resnet_app.common.fields import AT_LEAST_1, check_declared, one_of, setting, whole_at_least

T = TypeVar("T")
MODES = ("uniform", "soup")
TEST_SPLITS = ("test",)  # A soup never chooses on these.


@dataclasses.dataclass(frozen=True)
class AverageRequest:
    """What `resnet-app average` was asked for: each field is the command's flag of that name.

    Attributes:
      last: average the newest `last` checkpoints (None: all kept).
      best: or the `best` ones by the trainer's evaluations on a held-out split.
      bn_batches: training batches BatchNorm's statistics are measured on (0: averaged).
      split: the held-out split a soup scores on (None: the run's evaluation split).
    """

    last: int | None = setting(None, AT_LEAST_1)
    best: int | None = setting(None, AT_LEAST_1)
    mode: str = setting("uniform", one_of(MODES))
    weights: str = setting("auto", one_of(run_dir.WEIGHTS))
    bn_batches: int = setting(100, whole_at_least(0))
    split: str | None = None
    batch_size: int | None = setting(None, AT_LEAST_1)
    data_dir: str | None = None

    def __post_init__(self):
        check_declared(self, "--{}")
        if self.last and self.best:
            raise ConfigError("give --last or --best, not both")


def mean_weights(weight_sets: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """The element-wise mean of several models' variables (in float64, then each one's dtype)."""
    count = len(weight_sets)
    return [
        (sum(np.asarray(w, np.float64) for w in same) / count).astype(np.asarray(same[0]).dtype)
        for same in zip(*weight_sets)
    ]


def greedy_soup(
    ranked: Sequence[T], score: Callable[[list[T]], float], higher_is_better: bool = True
) -> tuple[list[T], float]:
    """(the members in the order they joined, the score) of the greedy soup over `ranked`
    (best alone first); `score(members)` evaluates their uniform mean."""
    soup = [ranked[0]]
    best = score(soup)
    for candidate in ranked[1:]:
        trial = score([*soup, candidate])
        if trial >= best if higher_is_better else trial <= best:
            soup, best = [*soup, candidate], trial
    return soup, best


def recompute_batch_norm(model, batches: Iterable[dict[str, Any]], seed: int = 0) -> int:
    """Measures the BatchNorm moving statistics of `model`'s weights on training batches.

    Each trainable BatchNorm's moving mean and variance become the mean over
    the batches of its batch mean and biased variance (frozen ones keep
    theirs). A batch passes every image the step trained on, AugMix's views
    too. Returns the number of batches used.
    """
    import keras
    import tensorflow as tf

    from resnet_app.common import compat
    from resnet_app.engine.losses import consistency
    from resnet_app.nets import drop_path

    layers = [
        layer
        for layer in compat.nested_layers(model)
        if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable
    ]
    momenta = [layer.momentum for layer in layers]
    keyed = getattr(model, "uses_example_keys", False)

    @tf.function
    def forward(images, keys):
        if keyed:
            model(images, training=True, drop_keys=keys)
        else:
            model(images, training=True)

    moving = [v for layer in layers for v in (layer.moving_mean, layer.moving_variance)]
    sums = [np.zeros(variable.shape, np.float64) for variable in moving]
    count = 0
    try:
        for layer in layers:
            layer.momentum = 0.0  # Read when traced: the moving statistics = the batch's.
        for batch in batches:
            images = consistency.stacked_images(batch)
            keys = None
            if keyed:
                keys = drop_path.example_keys(seed, count, *consistency.stacked_keys(batch))
            forward(images, keys)
            for total, variable in zip(sums, moving):
                total += variable.numpy()
            count += 1
    finally:
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum
    if count:
        for total, variable in zip(sums, moving):
            variable.assign(total / count)
    return count


def chosen_checkpoints(
    model_dir: str, request: AverageRequest, run_config: config.Config
) -> list[tuple[int, str]]:
    """(step, prefix) of the readable checkpoints to average, oldest first: all, the newest
    `request.last`, or the `request.best` the trainer's evaluations rank best by the run's
    keep-best metric (`train.best_by`).

    Raises:
      ConfigError: for --best when those evaluations were on the test split, or a
        checkpoint has none.
    """
    from resnet_app.common import checkpoint, metrics

    found = checkpoint.select(model_dir, "all")
    if not request.best:
        return found[-request.last :] if request.last else found
    key = run_config.train.best_by
    recorded: dict[int, dict[str, Any]] = {}
    for record in metrics.read_records(os.path.join(model_dir, metrics.METRICS_FILE)):
        if key in record and "split" in record and "checkpoint" not in record:
            recorded[record["step"]] = record  # The trainer's; the last at a step wins.
    splits = {recorded[step]["split"] for step, _ in found if step in recorded}
    if splits & set(TEST_SPLITS):
        raise ConfigError(
            "--best ranks the checkpoints by their evaluation on the test split, which is "
            "choosing on test: train with a held-out split (--set data.validation_split=5000), "
            "or use --last"
        )
    missing = [step for step, _ in found if step not in recorded]
    if missing:
        raise ConfigError(
            f"--best: the run recorded no evaluation ({key}) at steps {missing}; use --last"
        )
    sign = -1 if run_config.train.best_direction == "max" else 1  # Ties: the earlier one.
    ranked = sorted(found, key=lambda item: sign * recorded[item[0]][key])
    return sorted(ranked[: request.best])


def average_run(model_dir: str, request: AverageRequest) -> dict[str, Any]:
    """Averages a run's checkpoints as `request` says and writes the run's averaged checkpoint.

    Returns:
      The record `averaged.json` holds: "checkpoint" (its prefix), "step",
      "mode", "members", "weights", "bn_batches", "metric", "scores" (each
      checkpoint's own, for a soup) and "evaluation" (the average's record).

    Raises:
      ConfigError: for no such run or no readable checkpoint, a soup on the
        test split, or a checkpoint of another model.
    """
    from resnet_app.evaluation import checkpoint_eval

    run_config, data_config, batch_size = checkpoint_eval.run_settings(
        model_dir, request.split, request.batch_size, request.data_dir
    )
    import tensorflow as tf

    from resnet_app.common import averaged_checkpoint, checkpoint
    from resnet_app.data import run_pipeline

    chosen = chosen_checkpoints(model_dir, request, run_config)  # Before the data loads.
    kinds = [checkpoint.chosen_weights(prefix, request.weights) for _, prefix in chosen]
    pipeline = run_pipeline.create_run_pipeline(run_config, data_config, model_dir)
    split = pipeline.eval_split_name
    if request.mode == "soup" and split in TEST_SPLITS:
        raise ConfigError(
            f"a soup chooses its members by their score on the {split} split, which is tuning "
            "on test: train with a held-out split (--set data.validation_split=5000) and "
            "average that run, or use --mode=uniform"
        )
    model = checkpoint_eval.create_model(run_config, pipeline, tf.distribute.get_strategy())
    bench = _Bench(model, pipeline, batch_size, split, run_config, chosen, kinds)
    names = [prefix.rsplit("/", 1)[-1] for _, prefix in chosen]
    # The run's keep-best metric of the weights themselves ("ema_top1" ranks by "top1").
    metric = run_config.train.best_by.removeprefix("ema_")
    higher = run_config.train.best_direction == "max"
    scores: dict[str, float] = {}
    members = list(range(len(chosen)))
    if request.mode == "soup":
        # Each alone with its own statistics, then each soup with BatchNorm measured again.
        scores = {names[i]: bench.evaluate([i])[metric] for i in members}
        ranked = sorted(members, key=lambda i: scores[names[i]], reverse=higher)
        members, _ = greedy_soup(
            ranked, lambda soup: bench.evaluate(soup, request.bn_batches)[metric], higher
        )
    step = max(chosen[i][0] for i in members)
    evaluation = bench.evaluate(members, request.bn_batches)
    record = {
        "mode": request.mode,
        "members": [names[i] for i in members],
        "weights": [kinds[i] for i in members],
        "bn_batches": bench.bn_batches_used,
        "metric": metric,
        "scores": scores,
        "evaluation": evaluation,
    }
    prefix = averaged_checkpoint.write(
        model_dir, step, lambda path: _save_model(model, path), record
    )
    logging.info(
        "Averaged %d of %d checkpoints (%s) into %s: %s %.4f on %s",
        len(members),
        len(chosen),
        request.mode,
        prefix,
        metric,
        evaluation[metric],
        split,
    )
    return {"checkpoint": prefix, "step": step, **record}


def swa_checkpoint(model_dir: str, bn_batches: int) -> dict[str, Any]:
    """SWA's end (`loop.train`): the run's last average, its BatchNorm measured on
    `bn_batches` training batches, as the run's averaged checkpoint."""
    return average_run(model_dir, AverageRequest(last=1, weights="ema", bn_batches=bn_batches))


def _save_model(model, prefix: str) -> None:
    """Writes `model` as a training checkpoint's `model` (with its save counter, as read)."""
    import tensorflow as tf

    saved = tf.train.Checkpoint(model=model)
    saved.save_counter.assign(1)  # Made, so that a restore finds every object it has.
    saved.write(prefix)


class _Bench:
    """One model set to the mean of some of the chosen checkpoints' weights, and evaluated."""

    def __init__(self, model, pipeline, batch_size, split, run_config, chosen, kinds):
        from resnet_app.common import checkpoint

        self.model, self.pipeline, self.batch_size = model, pipeline, batch_size
        self.split, self.train, self.steps = split, run_config.train, [step for step, _ in chosen]
        self.ingredients = []
        for (_, prefix), kind in zip(chosen, kinds):
            checkpoint.restore_model(model, prefix, kind)
            self.ingredients.append([variable.numpy() for variable in model.weights])
        self.bn_batches_used = 0

    def evaluate(self, members: list[int], bn_batches: int = 0) -> dict[str, Any]:
        """The record of `members`' mean (at the newest one's step), with BatchNorm's statistics
        measured on `bn_batches` training batches (0: averaged)."""
        import itertools

        from resnet_app.engine import exact_eval

        weights = mean_weights([self.ingredients[i] for i in members])
        for variable, value in zip(self.model.weights, weights):
            variable.assign(value)
        if bn_batches:
            stream = self.pipeline.train_dataset(self.batch_size)
            batches = itertools.islice(iter(stream), bn_batches)
            self.bn_batches_used = recompute_batch_norm(self.model, batches, self.train.seed)
        result = exact_eval.evaluate(
            self.model,
            self.pipeline,
            self.batch_size,
            split=self.split,
            threshold=self.train.threshold,
        )
        step = max(self.steps[i] for i in members)
        return exact_eval.eval_record(step, self.split, result, self.train.precision)
