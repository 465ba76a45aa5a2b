"""`python -m resnet_app.evaluate`: evaluate a run's checkpoints.

    python -m resnet_app.evaluate --model_dir=runs/imagenet_resnet50
    python -m resnet_app.evaluate --model_dir=runs/try --checkpoint=all --split=train
    python -m resnet_app.evaluate --model_dir=runs/try --checkpoint=ckpt-4000 --data_dir=/data
    python -m resnet_app.evaluate --model_dir=runs/try --report_dir=/tmp/reports

The model and data come from the run's `config.yaml`, as the trainer wrote it;
`--data_dir` says where the data is now, and `--split` picks another split.
Each checkpoint chosen is restored (only the model: the optimizer and the
rest of the training state are not needed), evaluated on every example of the
split exactly once, and reported as one line of JSON on stdout:

    {"checkpoint": "ckpt-4", "step": 4, "split": "test", "top1": ..., "top5": ...,
     "loss": ..., "num_examples": 37, "report": "/abs/run/reports/ckpt-4-test"}

"report" is the checkpoint's report directory, `REPORT_DIR/<checkpoint>-<split>`
with REPORT_DIR = `--report_dir`, by default `MODEL_DIR/reports` (`eval/` holds
TensorBoard's evaluation events). It holds
`eval_results.json` (the record, per-class accuracy, the confusion matrix and
the most-confused pairs) and `confusion_matrix.png` (with matplotlib, an
optional extra); see `reports.py`. A rerun replaces them.

The same record, with "event": "evaluation", is appended to the run's
`metrics.jsonl`. A mistake (no such run, no such checkpoint, a checkpoint of
another model, a report directory that cannot be made) gets one line on stderr
and exit status 2.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

from absl import flags

from resnet_app import config
from resnet_app.common import checks, cli, run_dir
from resnet_app.common.errors import ConfigError

_MODEL_DIR = flags.DEFINE_string(
    "model_dir", None, "The run directory written by `python -m resnet_app.train`."
)
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint",
    "latest",
    "Which checkpoint(s): latest (the newest readable one), all, ckpt-N or N.",
)
_SPLIT = flags.DEFINE_string(
    "split", None, "The split to evaluate (default: the run's evaluation split)."
)
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size",
    None,
    "Global evaluation batch (default: the run's train.eval_batch_size, else train.batch_size).",
)
_NUM_TOWERS = flags.DEFINE_integer(
    "num_towers", None, "Towers to evaluate on (default: every GPU, or the one CPU)."
)
_DATA_DIR = flags.DEFINE_string(
    "data_dir",
    None,
    "Where the run's data is now, if it moved (default: the run's data.data_dir).",
)
_REPORT_DIR = flags.DEFINE_string(
    "report_dir",
    None,
    "Where the reports go: one directory <checkpoint>-<split> per checkpoint, holding "
    "eval_results.json and confusion_matrix.png (default: MODEL_DIR/reports).",
)


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
        which = f"--report_dir={report_dir}" if report_dir else f"the report directory {root}"
        raise ConfigError(f"{which}: cannot create it ({error.strerror}); pick another") from None
    return root


def _check_report_owners(model_dir: str, report_root: str, chosen, split: str) -> None:
    """A shared --report_dir must not lose another run's reports.

    The default, inside the run directory, is the run's own even after a copy
    or a move, and is not checked.

    Raises:
      ConfigError: when a report to be written names another run directory.
    """
    from resnet_app.serving import reports

    if os.path.realpath(report_root) == os.path.realpath(run_dir.reports_dir(model_dir)):
        return
    run = os.path.realpath(model_dir)
    for _, prefix in chosen:
        name = reports.report_name(os.path.basename(prefix), split)
        directory = os.path.join(report_root, name)
        found = reports.owner(directory)
        if found is not None and os.path.realpath(found) != run:
            raise ConfigError(
                f"{directory} holds the report of another run ({found}); pick another --report_dir"
            )


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    model_dir = _MODEL_DIR.value
    run_config = config.read_run_config(model_dir)
    batch_size = _BATCH_SIZE.value
    if batch_size is None:
        batch_size = run_config.train.eval_batch_size or run_config.train.batch_size
    checks.at_least("--batch_size", batch_size)
    # The data moved, or another split: both are data settings of the run's config.
    changed: dict[str, Any] = {}
    if _DATA_DIR.value:
        changed["data_dir"] = _DATA_DIR.value
    if _SPLIT.value:
        changed["eval_split"] = _SPLIT.value
    data_config = dataclasses.replace(run_config.data, **changed)

    # TensorFlow is imported only once the run directory is known to be one.
    from resnet_app.common import checkpoint, distribute, metrics
    from resnet_app.data import input_pipeline
    from resnet_app.nets import factory
    from resnet_app.serving import evaluation, reports

    strategy = distribute.create_strategy(_NUM_TOWERS.value)  # Before TF runs any op.
    chosen = checkpoint.select(model_dir, _CHECKPOINT.value)  # Before the data loads.
    chief = distribute.is_chief(strategy)
    pipeline = input_pipeline.create_run_pipeline(run_config, data_config, model_dir)
    report_root = os.path.abspath(_REPORT_DIR.value or run_dir.reports_dir(model_dir))
    # Before hours of evaluation, and agreed by every worker: one that stopped
    # alone would leave the others waiting in a collective.
    try:
        if chief:  # Only the chief writes reports.
            make_report_root(model_dir, _REPORT_DIR.value)
        _check_report_owners(model_dir, report_root, chosen, pipeline.eval_split_name)
        refused = None
    except ConfigError as error:
        refused = error
    votes = distribute.gather_from_workers(strategy, float(refused is not None))
    if refused is not None:
        raise refused
    if any(votes):
        raise ConfigError("another worker refused to evaluate (see its error); fix it and rerun")
    with strategy.scope():
        factory.check_num_classes(run_config, pipeline.num_classes)
        model = factory.create_run_model(
            run_config,
            pipeline.num_classes,
            pipeline.preprocessing.image_size,
            run_config.train.precision,
        )

    writer = metrics.MetricsWriter(model_dir, enabled=chief)
    try:
        for step, prefix in chosen:
            checkpoint.restore_model(model, prefix)
            split = pipeline.eval_split_name
            result = evaluation.evaluate(
                model, pipeline, batch_size, strategy, split, confusion=True
            )
            name = os.path.basename(prefix)
            precision = run_config.train.precision  # The model was built at it.
            record = {"checkpoint": name, **evaluation.eval_record(step, split, result, precision)}
            report_dir = os.path.join(report_root, reports.report_name(name, split))
            record["report"] = report_dir
            # The numbers first: one line per checkpoint, as soon as it is
            # known, and in metrics.jsonl, whatever happens to the report.
            sys.stdout.write(metrics.json_text(record) + "\n")
            sys.stdout.flush()
            writer.write({**record, "event": "evaluation"})
            # Every worker holds the whole matrix (it is all-reduced); one writes it.
            if chief:
                details = {k: v for k, v in record.items() if k != "report"}
                details["model_dir"] = os.path.realpath(model_dir)
                try:
                    report = reports.write_report(
                        report_dir, details, result.confusion, pipeline.class_names
                    )
                except OSError as error:
                    raise ConfigError(
                        f"the report {report_dir} cannot be written ({error.strerror}); the "
                        f"numbers above are in metrics.jsonl; free space or pick --report_dir"
                    ) from None
                reports.log_summary(report)
    finally:
        writer.close()


if __name__ == "__main__":
    cli.run(main)
