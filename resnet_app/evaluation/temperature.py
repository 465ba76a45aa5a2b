"""Temperature scaling of a run (`evaluate --fit_temperature`): fitted on its holdout split.

One checkpoint's logits on every example the run held out of training
(`data.validation_split`), the T minimizing their NLL (`calibration.fit_temperature`),
written to the run's `temperature.json`, which evaluate and the exports read.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from absl import logging

from resnet_app.common import run_dir
from resnet_app.common.errors import ConfigError
from resnet_app.evaluation import calibration, checkpoint_eval

if TYPE_CHECKING:
    import numpy as np

    from resnet_app import config

Record = dict[str, Any]


def fit_run_temperature(
    model_dir: str,
    which: str = "latest",
    *,
    batch_size: int | None = None,
    num_towers: int | None = None,
    data_dir: str | None = None,
    weights: str = "auto",
    on_record: Callable[[Record], None] | None = None,
) -> Record:
    """Fits one checkpoint's softmax temperature on every holdout example, and stores it.

    The arguments are `checkpoint_eval.evaluate_checkpoints`'. Every worker
    fits the same T from the gathered logits; the chief writes the file.

    Returns:
      The record temperature.json holds (`calibration.TEMPERATURE_FIELDS`).

    Raises:
      ConfigError: for `all` checkpoints, a run without a holdout split, and
        the mistakes `evaluate_checkpoints` refuses.
    """
    run_config, data_config, batch_size = checkpoint_eval.run_settings(
        model_dir, None, batch_size, data_dir
    )
    why = run_dir.unwritable(model_dir)
    if why:
        raise ConfigError(
            f"--fit_temperature writes {run_dir.TEMPERATURE_FILE} into the run directory "
            f"{model_dir}, which cannot be written ({why}); copy the run somewhere writable"
        )
    _check_fit(model_dir, which, run_config)
    from resnet_app.common import checkpoint, distribute
    from resnet_app.data import run_pipeline
    from resnet_app.data.sources import HOLDOUT_SPLIT
    from resnet_app.engine import exact_eval

    strategy = distribute.create_strategy(num_towers)  # Before TF runs any op.
    [(step, prefix)] = checkpoint.select(model_dir, which)
    data_config = dataclasses.replace(data_config, eval_examples=None)
    pipeline = run_pipeline.create_run_pipeline(run_config, data_config, model_dir)
    model = checkpoint_eval.create_model(run_config, pipeline, strategy)
    step, prefix, chosen = checkpoint.restore_selected(
        model, model_dir, which, step, prefix, weights
    )
    result = exact_eval.evaluate(
        model, pipeline, batch_size, strategy, HOLDOUT_SPLIT, collect_logits=True
    )
    temperature = calibration.fit_temperature(result.logits, result.labels)
    record = {
        "temperature": temperature,
        "checkpoint": os.path.basename(prefix),
        "step": step,
        "weights": chosen,
        "split": HOLDOUT_SPLIT,
        "num_examples": result.examples,
        **_before_and_after(result.logits, result.labels, temperature),
    }
    if on_record is not None:
        on_record(record)
    if distribute.is_chief(strategy):
        logging.info("Wrote %s", calibration.save_temperature(model_dir, record))
    return record


def _check_fit(model_dir: str, which: str, run_config: config.Config) -> None:
    """Refuses (ConfigError), before TensorFlow, all checkpoints, multi-label data and a run
    without a holdout split."""
    if which == "all":
        raise ConfigError(
            "--fit_temperature fits one checkpoint: pick --checkpoint=latest, ckpt-N or N, not all"
        )
    if run_dir.recorded_multi_label(model_dir):
        raise ConfigError(
            "--fit_temperature fits the softmax of one class per image; this run's data is "
            "multi-label, whose sigmoid probabilities it does not scale: drop it"
        )
    if run_config.data.validation_split <= 0:
        raise ConfigError(
            f"--fit_temperature needs a holdout split, and {model_dir} was trained without one; "
            "train with --set data.validation_split=N (examples held out of training)"
        )


def _before_and_after(logits: np.ndarray, labels: np.ndarray, temperature: float) -> Record:
    """The NLL and ECE before (T = 1) and after temperature scaling; logged."""
    measured = {
        "before": calibration.calibration_record(logits, labels),
        "after": calibration.calibration_record(logits, labels, temperature),
    }
    # nll_before, nll_after, ece_before, ece_after.
    fields = {f"{key}_{when}": measured[when][key] for key in ("nll", "ece") for when in measured}
    logging.info(
        "Temperature %.4f fitted on %d holdout examples: NLL %.4f -> %.4f, ECE %.4f -> %.4f",
        temperature,
        len(labels),
        *fields.values(),
    )
    return fields
