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
optional extra); see `resnet_app/serving/reports.py`. A rerun replaces them.

The same record, with "event": "evaluation", is appended to the run's
`metrics.jsonl`. A mistake (no such run, no such checkpoint, a checkpoint of
another model, a report directory that cannot be made) gets one line on stderr
and exit status 2. The work is done by `evaluate_checkpoints` in
`resnet_app/serving/checkpoint_eval.py`, which tests can call directly.
"""

from __future__ import annotations

import sys

from absl import flags

from resnet_app.common import cli
from resnet_app.serving import checkpoint_eval

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


def _print_record(record: dict) -> None:
    """One line of JSON per checkpoint on stdout, as soon as its numbers are known."""
    from resnet_app.common.metrics import json_text  # TensorFlow is loaded by now.

    sys.stdout.write(json_text(record) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    checkpoint_eval.evaluate_checkpoints(
        _MODEL_DIR.value,
        _CHECKPOINT.value,
        split=_SPLIT.value,
        batch_size=_BATCH_SIZE.value,
        num_towers=_NUM_TOWERS.value,
        data_dir=_DATA_DIR.value,
        report_dir=_REPORT_DIR.value,
        on_record=_print_record,
    )


if __name__ == "__main__":
    cli.run(main)
