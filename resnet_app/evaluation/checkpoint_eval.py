"""A run's saved checkpoints, evaluated and reported: the work of `python -m resnet_app.evaluate`.

Each chosen checkpoint's model is restored and evaluated on every example of
the split once (`engine/exact_eval.py`, optionally over test-time augmented
views), with its calibration (also at the run's fitted temperature); its
record goes to the caller as soon as it is known, to the run's
`metrics.jsonl` ("event": "evaluation") and to its report directory
`REPORT_ROOT/<checkpoint>-<split>` (`evaluation/reports.py`). The run's config
and the settings are checked before TensorFlow is imported.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from absl import logging

from resnet_app import config
from resnet_app.common import checks, run_dir
from resnet_app.common.errors import ConfigError
from resnet_app.data import families
from resnet_app.data.sources import registry
from resnet_app.engine.tta import CROPS, MODES
from resnet_app.evaluation import calibration

if TYPE_CHECKING:
    import tensorflow as tf

    from resnet_app.data.input_pipeline import InputPipeline
    from resnet_app.data.settings import DataConfig
    from resnet_app.engine.exact_eval import EvalResult

Record = dict[str, Any]
Chosen = list[tuple[int, str, str]]  # (step, prefix, "ema" or "raw") of each checkpoint.


def evaluate_checkpoints(
    model_dir: str, which: str = "latest", *, weights: str = "auto", **options: Any
) -> list[Record]:
    """Evaluates a run's checkpoints, each on every example of a split, and reports each.

    `which`: latest, all, best, averaged, ckpt-N or N; `weights`: "auto" (the
    moving average when kept), "ema" or "raw"; `options`: `Session`'s
    (None: the run's own split, data_dir and batch; every GPU; `reports/`).

    Returns:
      One record per checkpoint: "checkpoint", `exact_eval.eval_record`'s
      fields, "tta", "weights", "ece" and "nll" (None without examples), with
      a fitted temperature "temperature", "ece_scaled" and "nll_scaled", and
      "report" (its directory).

    Raises:
      ConfigError: for a mistake in the command or the run.
    """
    # The checkpoints are chosen before the data loads.
    session = Session(model_dir, chosen=lambda: _chosen(model_dir, which, weights), **options)
    records = []
    try:
        for step, prefix, kind in session.chosen:
            record = session.evaluate(which, step, prefix, kind)
            if record is not None:
                records.append(record)
    finally:
        session.writer.close()
    return records


class Session:
    """A run's model, data, report directory and metrics, ready to evaluate checkpoints.

    Made from the options of `evaluate_checkpoints`; `chosen()` picks the
    checkpoints before the data loads. `events` (TensorBoard's directory for
    "ema" or "raw" weights, None for no events) and `tags` (fields added to
    each record) are the watcher's.
    """

    def __init__(
        self,
        model_dir: str,
        *,
        chosen: Callable[[], Chosen],
        split: str | None = None,
        batch_size: int | None = None,
        num_towers: int | None = None,
        data_dir: str | None = None,
        report_dir: str | None = None,
        tta: str | None = None,
        on_record: Callable[[Record], None] | None = None,
        top_losses: int | None = None,
    ):
        self.run_config, data_config, self.batch_size = run_settings(
            model_dir, split, batch_size, data_dir
        )
        _check_tta(tta)
        # A damaged file: now, not later.
        self.fitted = calibration.read_temperature_record(model_dir)
        from resnet_app.common import distribute, metrics
        from resnet_app.data import run_pipeline

        self.strategy = distribute.create_strategy(num_towers)  # Before TF runs any op.
        self.chosen = chosen()
        self.pipeline = run_pipeline.create_run_pipeline(self.run_config, data_config, model_dir)
        _check_tta(tta, self.pipeline.preprocessing.family, self.pipeline.multi_label)
        self.model_dir, self.split, self.tta = model_dir, self.pipeline.eval_split_name, tta
        self.on_record, self.events, self.tags = on_record, None, {}
        self.top_losses = top_losses  # With a number: `report`'s page too (`page.py`).
        self.report_root = _prepare_report_root(
            model_dir, report_dir, self.chosen, self.split, tta, self.strategy
        )
        # At the run's train.precision.
        self.model = create_model(self.run_config, self.pipeline, self.strategy)
        self.chief = distribute.is_chief(self.strategy)
        why = run_dir.unwritable(model_dir) if self.chief else None
        if why:
            logging.warning(
                "The run directory %s is read-only (%s): the records go to stdout and the "
                "reports only, not to its metrics.jsonl",
                model_dir,
                why,
            )
        self.writer = metrics.MetricsWriter(model_dir, enabled=self.chief and not why)

    def evaluate(self, which: str, step: int, prefix: str, kind: str) -> Record | None:
        """Restores, evaluates and reports one checkpoint (`kind` "ema" or "raw"); its record.

        `which` is how it was chosen (`checkpoint.restore_selected`'s). None
        when rotation removed it meanwhile (skipped, one warning).
        """
        from resnet_app.common import checkpoint
        from resnet_app.engine import exact_eval
        from resnet_app.evaluation import reports

        # A shared --report_dir: checked again, as the watcher picks checkpoints later.
        _check_report_owners(
            self.model_dir, self.report_root, [(step, prefix, kind)], self.split, self.tta
        )
        try:
            step, prefix, kind = checkpoint.restore_selected(
                self.model, self.model_dir, which, step, prefix, kind
            )
        except checkpoint.CheckpointGoneError as gone:
            logging.warning("Skipping it: %s", gone)
            return None
        train = self.run_config.train
        # Multi-label data: every example's scores, no confusion and no calibration.
        options: Record = {"threshold": train.threshold}
        if not self.pipeline.multi_label:
            calibration.warn_if_fitted_elsewhere(self.fitted, prefix, kind)
            temperature = None if self.fitted is None else self.fitted["temperature"]
            options = dict(
                confusion=True, collect_logits=True, tta=self.tta, temperature=temperature
            )
        gallery = None
        if self.top_losses:
            from resnet_app.evaluation.gallery import Gallery

            image_stats = self.pipeline.preprocessing
            gallery = Gallery(
                self.top_losses, image_stats.mean, image_stats.std, self.pipeline.multi_label
            )
            options.update(collect_logits=True, on_batch=gallery.add)
        result = exact_eval.evaluate(
            self.model, self.pipeline, self.batch_size, self.strategy, self.split, **options
        )
        name = os.path.basename(prefix)
        record = {
            "checkpoint": name,
            **exact_eval.eval_record(step, self.split, result, train.precision),
        }
        record.update(tta=result.tta, weights=kind)
        fields, reliability = _calibration(result)
        record.update(fields)
        record["report"] = os.path.join(
            self.report_root, reports.report_name(name, self.split, result.tta, kind)
        )
        if self.on_record is not None:  # The numbers first, as soon as they are known.
            self.on_record(record)
        self._save(record, result, reliability, gallery)
        return record

    def _save(
        self, record: Record, result: EvalResult, reliability: Record | None, gallery: Any
    ) -> None:
        """Appends the record to metrics.jsonl (and TensorBoard), then the chief writes its report
        (with a `gallery.Gallery`, and its page).

        Every worker holds the whole confusion matrix and every example's logits.
        """
        from resnet_app.engine.actions import EVAL_SCALARS, LABEL_SCALARS
        from resnet_app.evaluation import reports

        self.writer.write({**record, **self.tags, "event": "evaluation"})
        if self.events is not None:
            keys = (*EVAL_SCALARS, *LABEL_SCALARS)
            scalars = {k: record[k] for k in keys if record.get(k) is not None}
            self.writer.scalars(self.events(record["weights"]), record["step"], scalars)
            self.writer.flush()
        if not self.chief:
            return
        directory = record["report"]
        details = {key: value for key, value in record.items() if key != "report"}
        details["model_dir"] = os.path.realpath(self.model_dir)
        names = self.pipeline.class_names
        try:
            if result.multi_label:
                report = reports.write_multi_label_report(
                    directory, details, result.scores, result.labels, names, result.threshold
                )
            else:
                report = reports.write_report(
                    directory, details, result.confusion, names, reliability
                )
            if gallery is not None:
                from resnet_app.evaluation import page

                path = page.write_page(self, directory, report, result, gallery)
                logging.info("The report page: %s", path)
        except OSError as error:
            raise ConfigError(
                f"the report {directory} cannot be written ({error.strerror}); the "
                f"numbers above are in metrics.jsonl; free space or pick --report_dir"
            ) from None
        reports.log_summary(report)


def _chosen(model_dir: str, which: str, weights: str) -> Chosen:
    """(step, prefix, "ema" or "raw") of each checkpoint `which` and `weights` pick."""
    from resnet_app.common import checkpoint

    return [
        (step, prefix, checkpoint.chosen_weights(prefix, weights))
        for step, prefix in checkpoint.select(model_dir, which)
    ]


def _check_tta(tta: str | None, family: str | None = None, multi_label: bool = False) -> None:
    """Refuses (ConfigError) an unknown --tta, crops for a run without ImageNet-style
    evaluation crops, or any --tta for multi-label data."""
    if tta is not None and tta not in MODES:
        raise ConfigError(f"--tta={tta}: use {' or '.join(MODES)}")
    if tta and multi_label:
        raise ConfigError(
            f"--tta={tta} averages softmax predictions; this run's data is multi-label: drop --tta"
        )
    if tta == CROPS and family is not None and not families.named(family).crops:
        raise ConfigError(
            f"--tta=crops takes corner crops of ImageNet-style evaluation images; this run "
            f"uses the {family} recipe, whose images are not cropped: use --tta=flip"
        )


def run_settings(
    model_dir: str, split: str | None, batch_size: int | None, data_dir: str | None
) -> tuple[config.Config, DataConfig, int]:
    """The run's config, its data settings with `split` and `data_dir` (None: the run's; for
    data from a path, `registry.moved`'s), and the batch size (None: the run's evaluation
    batch); without TensorFlow.

    Raises:
      ConfigError: for no such run, a batch size below 1, or data that moved.
    """
    run_config = config.read_run_config(model_dir)
    if batch_size is None:
        batch_size = run_config.train.eval_batch_size or run_config.train.batch_size
    checks.at_least("--batch_size", batch_size)
    dataset = registry.moved(run_config.data.dataset, data_dir)
    given = {"data_dir": data_dir, "eval_split": split, "dataset": dataset}
    changed = {field: value for field, value in given.items() if value}
    return run_config, dataclasses.replace(run_config.data, **changed), batch_size


def _prepare_report_root(
    model_dir: str,
    report_dir: str | None,
    chosen: Chosen,
    split: str,
    tta: str | None,
    strategy: tf.distribute.Strategy,
) -> str:
    """The reports' absolute directory, made and checked before hours of evaluation.

    Every worker must agree (one that stopped alone would leave the others
    waiting in a collective), so a refusal anywhere is raised everywhere.
    """
    from resnet_app.common import distribute

    root = os.path.abspath(report_dir or run_dir.reports_dir(model_dir))
    refused = None
    try:
        if distribute.is_chief(strategy):  # Only the chief writes reports: a probe file now.
            _probe(root, model_dir, report_dir)
        _check_report_owners(model_dir, root, chosen, split, tta)
    except ConfigError as error:
        refused = error
    another = distribute.any_worker(strategy, refused is not None)
    if refused is not None:
        raise refused
    if another:
        raise ConfigError("another worker refused to evaluate (see its error); fix it and rerun")
    return root


def _probe(root: str, model_dir: str, report_dir: str | None) -> None:
    """Creates `root` and checks that it takes a file (read-only would fail only at the end)."""
    try:
        os.makedirs(root, exist_ok=True)
        why = run_dir.unwritable(root)
    except OSError as error:
        why = error.strerror
    if why:
        raise ConfigError(
            f"--report_dir={report_dir}: cannot create it ({why}); pick another"
            if report_dir
            else f"cannot write the reports into the run directory {model_dir} "
            f"({why}): pass --report_dir=DIR to write them elsewhere"
        )


def _check_report_owners(
    model_dir: str, report_root: str, chosen: Chosen, split: str, tta: str | None
) -> None:
    """Refuses (ConfigError) to write over another run's report in a shared --report_dir.

    The default, inside the run directory, is the run's own even after a copy
    or a move, and is not checked.
    """
    from resnet_app.evaluation import reports

    if os.path.realpath(report_root) == os.path.realpath(run_dir.reports_dir(model_dir)):
        return
    run = os.path.realpath(model_dir)
    for _, prefix, weights in chosen:
        name = reports.report_name(os.path.basename(prefix), split, tta, weights)
        directory = os.path.join(report_root, name)
        found = reports.owner(directory)
        if found is not None and os.path.realpath(found) != run:
            raise ConfigError(
                f"{directory} holds the report of another run ({found}); pick another --report_dir"
            )


def create_model(
    run_config: config.Config, pipeline: InputPipeline, strategy: tf.distribute.Strategy
) -> tf.keras.Model:
    """The run's model for the pipeline's classes and image size, built in the strategy's scope."""
    from resnet_app.nets import factory

    with strategy.scope():
        return factory.create_run_model(
            run_config,
            pipeline.num_classes,
            pipeline.preprocessing.image_size,
            run_config.train.precision,
            pipeline.channels,
        )


def _calibration(result: EvalResult) -> tuple[Record, Record | None]:
    """ECE (15 bins) and NLL of every example's softmax, also at the fitted temperature
    (None each without examples); and the reliability bins."""
    measured = result.examples and not result.multi_label  # Softmax: one class per image.

    def measure(logits) -> Record:
        return calibration.calibration_record(logits, result.labels) if measured else {}

    raw = measure(result.logits)
    fields: Record = {"ece": raw.get("ece"), "nll": raw.get("nll")}
    if result.temperature is not None:
        # Each view's logits were divided by T before the average (`engine/tta.py`).
        scaled = measure(result.scaled_logits)
        fields.update(
            temperature=result.temperature,
            ece_scaled=scaled.get("ece"),
            nll_scaled=scaled.get("nll"),
        )
    return fields, raw.get("reliability")
