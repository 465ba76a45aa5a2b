"""A run's saved checkpoints, evaluated and reported: the work of `python -m resnet_app.evaluate`.

`evaluate_checkpoints` restores each chosen checkpoint (only the model: the
optimizer and the rest of the training state are not needed), evaluates it on
every example of the split exactly once (`engine/exact_eval.py`), optionally
averaged over flipped or cropped views (`engine/tta.py`), measures its
calibration from every example's logits (`evaluation/calibration.py`; also with
the run's fitted temperature, when it has one), hands its record to the caller
as soon as it is known, appends it to the run's `metrics.jsonl` with "event":
"evaluation", and writes its report directory `REPORT_ROOT/<checkpoint>-<split>`
(`evaluation/reports.py`).

`run_settings` and `create_model` are shared with `evaluation/temperature.py`
(`evaluate --fit_temperature`).

The run's config is read and the settings are checked before TensorFlow is
imported, so a mistake in the command (no such run, a bad batch size) is
answered at once; the functions that need TensorFlow import it themselves.
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
from resnet_app.engine.tta import CROPS, MODES
from resnet_app.evaluation import calibration

if TYPE_CHECKING:
    import tensorflow as tf

    from resnet_app.common.metrics import MetricsWriter
    from resnet_app.data.input_pipeline import InputPipeline
    from resnet_app.data.settings import DataConfig
    from resnet_app.engine.exact_eval import EvalResult

Record = dict[str, Any]


def evaluate_checkpoints(
    model_dir: str,
    which: str = "latest",
    *,
    split: str | None = None,
    batch_size: int | None = None,
    num_towers: int | None = None,
    data_dir: str | None = None,
    report_dir: str | None = None,
    tta: str | None = None,
    weights: str = "auto",
    on_record: Callable[[Record], None] | None = None,
) -> list[Record]:
    """Evaluates a run's checkpoints, each on every example of a split, and reports each.

    Args:
      model_dir: the run directory written by `python -m resnet_app.train`.
      which: latest (the newest readable checkpoint), all, ckpt-N or N.
      split, data_dir: the split to evaluate, and where the data is now; None
        for the run's own (`data.eval_split`, `data.data_dir`).
      batch_size: the global batch; None for the run's `train.eval_batch_size`,
        else its `train.batch_size`.
      num_towers: towers to evaluate on; None for every GPU, or the one CPU.
      report_dir: where the report directories go; None for `model_dir/reports`.
      tta: None, or test-time augmentation: "flip" (any run) or "crops"
        (ImageNet-family runs), see `engine/tta.py`.
      weights: "auto" (the moving average of the weights when kept), "ema" or "raw".
      on_record: called with each record as soon as it is known (the command prints it).

    Returns:
      One record per checkpoint, in order: "checkpoint" (its name),
      `exact_eval.eval_record`'s fields, "tta" (None for one view), "weights"
      ("ema" or "raw"), the calibration "ece" and "nll" (None without
      examples), with a fitted temperature also "temperature", "ece_scaled"
      and "nll_scaled", and "report" (its report directory).

    Raises:
      ConfigError: for a mistake: no such run or checkpoint, a checkpoint of
        another model, a report directory that cannot be made or is another
        run's, an unknown `tta` or crops for a CIFAR-family run, a damaged
        temperature.json.
    """
    session = open_session(
        model_dir,
        split=split,
        batch_size=batch_size,
        num_towers=num_towers,
        data_dir=data_dir,
        report_dir=report_dir,
        tta=tta,
        on_record=on_record,
        chosen=lambda: _chosen(model_dir, which, weights),  # Before the data loads.
    )
    records = []
    try:
        for step, prefix, kind in session.chosen:
            record = session.evaluate(which, step, prefix, kind)
            if record is not None:
                records.append(record)
    finally:
        session.close()
    return records


@dataclasses.dataclass
class Session:
    """A run's model, data, report directory and metrics, ready to evaluate checkpoints.

    Made by `open_session`; `evaluate_checkpoints` and `evaluation/watch.py` use it.
    """

    model_dir: str
    run_config: config.Config
    strategy: tf.distribute.Strategy
    pipeline: InputPipeline
    model: tf.keras.Model
    batch_size: int
    split: str
    tta: str | None
    fitted: Record | None
    report_root: str
    writer: MetricsWriter
    chief: bool
    chosen: list[tuple[int, str, str]]
    on_record: Callable[[Record], None] | None
    # Set by evaluation/watch.py: TensorBoard's directory for "ema" or "raw"
    # weights (None: no events), and fields added to each record in metrics.jsonl.
    events: Callable[[str], str] | None = None
    tags: Record = dataclasses.field(default_factory=dict)

    def evaluate(self, which: str, step: int, prefix: str, kind: str) -> Record | None:
        """Restores and evaluates one checkpoint, reports and saves its record; returns it.

        Args:
          which: how it was chosen (`checkpoint.restore_selected`'s `which`).
          step, prefix, kind: the checkpoint and "ema" or "raw".

        Returns:
          Its record; None when rotation removed it meanwhile (skipped, one warning).
        """
        # A shared --report_dir: not over another run's report (checked again: the
        # watcher picks its checkpoints after the session opened).
        _check_report_owners(
            self.model_dir, self.report_root, [(step, prefix, kind)], self.split, self.tta
        )
        restored = _restored(self.model, self.model_dir, which, step, prefix, kind)
        if restored is None:
            return None
        step, prefix, kind = restored
        result = _evaluate(
            self.model,
            prefix,
            kind,
            self.pipeline,
            self.batch_size,
            self.strategy,
            self.split,
            self.tta,
            self.fitted,
            self.run_config.train.threshold,
        )
        record, reliability = _record(
            prefix,
            step,
            kind,
            self.split,
            result,
            self.run_config.train.precision,
            self.report_root,
        )
        if self.on_record is not None:  # The numbers first, as soon as they are known.
            self.on_record(record)
        events = None if self.events is None else self.events(kind)
        _save(self, record, result, reliability, events)
        return record

    def close(self) -> None:
        self.writer.close()


def open_session(
    model_dir: str,
    *,
    chosen: Callable[[], list[tuple[int, str, str]]],
    split: str | None = None,
    batch_size: int | None = None,
    num_towers: int | None = None,
    data_dir: str | None = None,
    report_dir: str | None = None,
    tta: str | None = None,
    on_record: Callable[[Record], None] | None = None,
) -> Session:
    """Reads the run, makes the strategy, data, model and report directory (`evaluate_checkpoints`'
    arguments); `chosen()` picks the checkpoints once the strategy exists, before the data loads.

    Raises:
      ConfigError: as `evaluate_checkpoints`.
    """
    run_config, data_config, batch_size = run_settings(model_dir, split, batch_size, data_dir)
    _check_tta(tta)
    fitted = calibration.read_temperature_record(model_dir)  # A damaged file: now, not later.
    # TensorFlow is imported only once the run directory is known to be one.
    from resnet_app.common import distribute
    from resnet_app.data import run_pipeline

    strategy = distribute.create_strategy(num_towers)  # Before TF runs any op.
    picked = chosen()
    pipeline = run_pipeline.create_run_pipeline(run_config, data_config, model_dir)
    _check_tta(tta, pipeline.preprocessing.family, pipeline.multi_label)
    split = pipeline.eval_split_name
    report_root = _prepare_report_root(model_dir, report_dir, picked, split, tta, strategy)
    model = create_model(run_config, pipeline, strategy)  # At the run's train.precision.
    chief = distribute.is_chief(strategy)
    return Session(
        model_dir=model_dir,
        run_config=run_config,
        strategy=strategy,
        pipeline=pipeline,
        model=model,
        batch_size=batch_size,
        split=split,
        tta=tta,
        fitted=fitted,
        report_root=report_root,
        writer=_metrics_writer(model_dir, chief),
        chief=chief,
        chosen=picked,
        on_record=on_record,
    )


def _restored(model, model_dir: str, which: str, step: int, prefix: str, kind: str):
    """`checkpoint.restore_selected`'s (step, prefix, kind); None for one of
    --checkpoint=all that rotation removed meanwhile (skipped, one warning)."""
    from resnet_app.common import checkpoint

    try:
        return checkpoint.restore_selected(model, model_dir, which, step, prefix, kind)
    except checkpoint.CheckpointGoneError as gone:
        logging.warning("Skipping it: %s", gone)
        return None


def _metrics_writer(model_dir: str, chief: bool):
    """The run's metrics.jsonl, appended to by the chief unless the run is read-only."""
    from resnet_app.common import metrics

    why = run_dir.unwritable(model_dir) if chief else None
    if why:
        logging.warning(
            "The run directory %s is read-only (%s): the records go to stdout and the "
            "reports only, not to its metrics.jsonl",
            model_dir,
            why,
        )
    return metrics.MetricsWriter(model_dir, enabled=chief and not why)


def _chosen(model_dir: str, which: str, weights: str) -> list[tuple[int, str, str]]:
    """(step, prefix, "ema" or "raw") of each checkpoint `which` and `weights` pick."""
    from resnet_app.common import checkpoint

    return [
        (step, prefix, checkpoint.chosen_weights(prefix, weights))
        for step, prefix in checkpoint.select(model_dir, which)
    ]


def _check_tta(tta: str | None, family: str | None = None, multi_label: bool = False) -> None:
    """An unknown --tta, crops for a run without ImageNet-style evaluation crops, or any
    --tta for multi-label data.

    Raises:
      ConfigError: naming the fix.
    """
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


def _evaluate(
    model: tf.keras.Model,
    prefix: str,
    weights: str,
    pipeline: InputPipeline,
    batch_size: int,
    strategy: tf.distribute.Strategy,
    split: str,
    tta: str | None,
    fitted: Record | None,
    threshold: float,
) -> EvalResult:
    """Checkpoint `prefix`, restored, on the split: confusion, logits, logits at the fitted T.

    Multi-label data: every example's scores instead (no confusion, no calibration).
    """
    from resnet_app.engine import exact_eval

    if pipeline.multi_label:
        return exact_eval.evaluate(
            model, pipeline, batch_size, strategy, split, threshold=threshold
        )
    calibration.warn_if_fitted_elsewhere(fitted, prefix, weights)
    return exact_eval.evaluate(
        model,
        pipeline,
        batch_size,
        strategy,
        split,
        confusion=True,
        collect_logits=True,
        tta=tta,
        temperature=None if fitted is None else fitted["temperature"],
    )


def run_settings(
    model_dir: str, split: str | None, batch_size: int | None, data_dir: str | None
) -> tuple[config.Config, DataConfig, int]:
    """The run's config, its data settings as asked, and the batch size; without TensorFlow.

    Args:
      model_dir: the run directory.
      split, data_dir: the split to evaluate and where the data is now; None
        for the run's own.
      batch_size: the global batch; None for the run's evaluation batch.

    Raises:
      ConfigError: for no such run, or a batch size below 1.
    """
    run_config = config.read_run_config(model_dir)
    if batch_size is None:
        batch_size = run_config.train.eval_batch_size or run_config.train.batch_size
    checks.at_least("--batch_size", batch_size)
    # The data moved, or another split: both are data settings of the run's config.
    changed: dict[str, Any] = {}
    if data_dir:
        changed["data_dir"] = data_dir
    if split:
        changed["eval_split"] = split
    return run_config, dataclasses.replace(run_config.data, **changed), batch_size


def make_report_root(model_dir: str, report_dir: str | None) -> str:
    """Creates the directory the reports go in, before any evaluation runs.

    Args:
      model_dir: the run directory.
      report_dir: `--report_dir`, or None for `model_dir/reports`.

    Returns:
      Its absolute path, so the records in metrics.jsonl mean the same from anywhere.

    Raises:
      ConfigError: when it cannot be created (better now than after hours of evaluation).
    """
    root = os.path.abspath(report_dir or run_dir.reports_dir(model_dir))
    try:
        os.makedirs(root, exist_ok=True)
        # Existing but read-only would fail only after the evaluation.
        probe = os.path.join(root, f".write-test-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as error:
        if not report_dir:
            raise ConfigError(
                f"cannot write the reports into the run directory {model_dir} "
                f"({error.strerror}): pass --report_dir=DIR to write them elsewhere"
            ) from None
        raise ConfigError(
            f"--report_dir={report_dir}: cannot create it ({error.strerror}); pick another"
        ) from None
    return root


def _prepare_report_root(
    model_dir: str,
    report_dir: str | None,
    chosen: list[tuple[int, str, str]],
    split: str,
    tta: str | None,
    strategy: tf.distribute.Strategy,
) -> str:
    """The reports' directory, made and checked before hours of evaluation.

    Every worker must agree: one that stopped alone would leave the others
    waiting in a collective.

    Returns:
      Its absolute path.

    Raises:
      ConfigError: when this worker or another refused.
    """
    from resnet_app.common import distribute

    report_root = os.path.abspath(report_dir or run_dir.reports_dir(model_dir))
    try:
        if distribute.is_chief(strategy):  # Only the chief writes reports.
            make_report_root(model_dir, report_dir)
        _check_report_owners(model_dir, report_root, chosen, split, tta)
        refused = None
    except ConfigError as error:
        refused = error
    another = distribute.any_worker(strategy, refused is not None)
    if refused is not None:
        raise refused
    if another:
        raise ConfigError("another worker refused to evaluate (see its error); fix it and rerun")
    return report_root


def _check_report_owners(
    model_dir: str,
    report_root: str,
    chosen: list[tuple[int, str, str]],
    split: str,
    tta: str | None,
) -> None:
    """A shared --report_dir must not lose another run's reports.

    The default, inside the run directory, is the run's own even after a copy
    or a move, and is not checked.

    Raises:
      ConfigError: when a report to be written names another run directory.
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


def _record(
    prefix: str,
    step: int,
    weights: str,
    split: str,
    result: EvalResult,
    precision: str,
    report_root: str,
) -> tuple[Record, dict[str, Any] | None]:
    """A checkpoint's record, with its calibration and report directory; the reliability bins."""
    from resnet_app.engine import exact_eval
    from resnet_app.evaluation import reports

    name = os.path.basename(prefix)
    record = {"checkpoint": name, **exact_eval.eval_record(step, split, result, precision)}
    record["tta"] = result.tta
    record["weights"] = weights
    fields, reliability = _calibration(result)
    record.update(fields)
    report = reports.report_name(name, split, result.tta, weights)
    record["report"] = os.path.join(report_root, report)
    return record, reliability


def _calibration(result: EvalResult) -> tuple[Record, dict[str, Any] | None]:
    """ECE (15 bins) and NLL of every example's softmax, also at the fitted temperature.

    Returns:
      ({"ece", "nll"} and with a temperature {"temperature", "ece_scaled",
      "nll_scaled"}; None each without examples), and the reliability bins.
    """
    temperature = result.temperature
    fields: Record = {"ece": None, "nll": None}
    if temperature is not None:
        fields.update(temperature=temperature, ece_scaled=None, nll_scaled=None)
    if not result.examples or result.multi_label:  # Softmax calibration: one class per image.
        return fields, None
    raw = calibration.calibration_record(result.logits, result.labels)
    fields.update(ece=raw["ece"], nll=raw["nll"])
    if temperature is not None:
        # Each view's logits were divided by T before the average (`engine/tta.py`).
        scaled = calibration.calibration_record(result.scaled_logits, result.labels)
        fields.update(ece_scaled=scaled["ece"], nll_scaled=scaled["nll"])
    return fields, raw["reliability"]


def _save(
    session: Session,
    record: Record,
    result: EvalResult,
    reliability: dict[str, Any] | None,
    events: str | None = None,
) -> None:
    """Appends a checkpoint's record to metrics.jsonl, then writes its report directory.

    The numbers go first, whatever happens to the report. Every worker holds
    the whole confusion matrix (it is all-reduced) and every example's logits
    (gathered); only the chief writes (metrics.jsonl, unless the run is read-only).
    `events`: TensorBoard's directory for the record's scalars (None: none written).

    Raises:
      ConfigError: when the report cannot be written.
    """
    from resnet_app.evaluation import reports

    writer, chief, model_dir = session.writer, session.chief, session.model_dir
    class_names = session.pipeline.class_names
    writer.write({**record, **session.tags, "event": "evaluation"})
    if events is not None:
        writer.scalars(events, record["step"], _scalars(record))
        writer.flush()
    if not chief:
        return
    report_dir = record["report"]
    details = {key: value for key, value in record.items() if key != "report"}
    details["model_dir"] = os.path.realpath(model_dir)
    try:
        if result.multi_label:
            from resnet_app.evaluation import multi_label_report

            report = multi_label_report.write_report(
                report_dir, details, result.scores, result.labels, class_names, result.threshold
            )
            multi_label_report.log_summary(report)
            return
        report = reports.write_report(
            report_dir, details, result.confusion, class_names, reliability
        )
    except OSError as error:
        raise ConfigError(
            f"the report {report_dir} cannot be written ({error.strerror}); the "
            f"numbers above are in metrics.jsonl; free space or pick --report_dir"
        ) from None
    reports.log_summary(report)


def _scalars(record: Record) -> dict[str, float]:
    """The record's numbers TensorBoard shows, as the trainer's evaluation writes them."""
    from resnet_app.engine.actions import EVAL_SCALARS, LABEL_SCALARS

    return {k: record[k] for k in (*EVAL_SCALARS, *LABEL_SCALARS) if record.get(k) is not None}
