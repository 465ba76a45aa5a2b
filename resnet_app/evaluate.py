"""`python -m resnet_app.evaluate`: evaluate a run's checkpoints.

    python -m resnet_app.evaluate --model_dir=runs/imagenet_resnet50
    python -m resnet_app.evaluate --model_dir=runs/try --checkpoint=all --split=train
    python -m resnet_app.evaluate --model_dir=runs/try --checkpoint=ckpt-4000 --data_dir=/data
    python -m resnet_app.evaluate --model_dir=runs/try --report_dir=/tmp/reports
    python -m resnet_app.evaluate --model_dir=runs/try --tta=flip
    python -m resnet_app.evaluate --model_dir=runs/imagenet_resnet50 --tta=crops
    python -m resnet_app.evaluate --model_dir=runs/try --checkpoint=ckpt-4000 --fit_temperature
    python -m resnet_app.evaluate --model_dir=runs/try --weights=raw
    python -m resnet_app.evaluate --model_dir=runs/try --watch   # beside a running trainer

The model and data come from the run's `config.yaml`, as the trainer wrote it;
`--data_dir` says where the data is now, and `--split` picks another split.
Each checkpoint chosen is restored (only the model: the optimizer and the
rest of the training state are not needed), evaluated on every example of the
split exactly once, and reported as one line of JSON on stdout:

    {"checkpoint": "ckpt-4", "step": 4, "split": "test", "top1": ..., "top5": ...,
     "loss": ..., "num_examples": 37, "precision": "fp32", "tta": null,
     "weights": "raw", "ece": ..., "nll": ..., "report": "/abs/run/reports/ckpt-4-test"}

A run that kept a moving average of its weights (`train.ema_decay`) is
evaluated with the average by default ("weights": "ema", and the report
directory ends in `-ema`); `--weights=raw` evaluates the trained weights,
`--weights=ema` refuses a checkpoint without an average.

"ece" is the expected calibration error (15 equal-width confidence bins) and
"nll" the mean negative log-likelihood of the softmax (the same number as
"loss", computed in float64 from every example's logits; see
`resnet_app/evaluation/calibration.py`). They measure the raw model. When the run
has a fitted temperature (`temperature.json`, below), the record also holds
"temperature", "ece_scaled" and "nll_scaled": the same with the logits divided
by it (top-1 and top-5 do not change).

`--tta=flip` averages the softmax probabilities of each image and its mirror
image; `--tta=crops` (runs with ImageNet-style preprocessing only) those of 10
views: the centre and four corner crops of the image resized as for
evaluation, and their mirrors. Every number of the record is then of the
averaged probabilities, the record says "tta": "flip" or "crops" (null for a
single view), and its report directory is `<checkpoint>-<split>-<tta>`. Crops
put 10 images through the model per example: lower `--batch_size` if memory
runs out.

`--fit_temperature` fits the softmax temperature T of one checkpoint
(`--checkpoint`, not all) by minimizing the NLL on the run's holdout split
(which needs a run trained with `--set data.validation_split=N`), writes it to
`MODEL_DIR/temperature.json` and prints it as one line of JSON:

    {"temperature": 1.7, "checkpoint": "ckpt-4000", "step": 4000, "split": "holdout",
     "num_examples": 5000, "nll_before": ..., "nll_after": ..., "ece_before": ...,
     "ece_after": ...}

Later evaluations report the scaled calibration, and exports apply T.

"report" is the checkpoint's report directory, `REPORT_DIR/<checkpoint>-<split>`
with REPORT_DIR = `--report_dir`, by default `MODEL_DIR/reports` (`eval/` holds
TensorBoard's evaluation events). It holds
`eval_results.json` (the record, per-class accuracy, the confusion matrix,
the most-confused pairs and the reliability bins), `confusion_matrix.png` and
`reliability.png` (with matplotlib, an optional extra); see
`resnet_app/evaluation/reports.py`. A rerun replaces them.

`--watch` follows a run that is training: it evaluates each checkpoint once
as it appears, exactly as `--checkpoint=ckpt-N` would, writes the records
also to TensorBoard (`MODEL_DIR/evaluator`) and exits when the run ends
(`resnet_app/evaluation/watch.py`; `--watch_every`, `--watch_timeout`).

The same record, with "event": "evaluation", is appended to the run's
`metrics.jsonl`. A mistake (no such run, no such checkpoint, a checkpoint of
another model, a report directory that cannot be made, --tta=crops for a
CIFAR-style run, --fit_temperature without a holdout split) gets one line on
stderr and exit status 2. The work is done by `evaluate_checkpoints` in
`resnet_app/evaluation/checkpoint_eval.py` and `fit_run_temperature` in
`resnet_app/evaluation/temperature.py`, which tests can call directly.
"""

from __future__ import annotations

import sys

from absl import flags

from resnet_app.common import cli
from resnet_app.common.errors import ConfigError
from resnet_app.engine.tta import MODES
from resnet_app.evaluation import checkpoint_eval, temperature, watch

_MODEL_DIR = flags.DEFINE_string(
    "model_dir", None, "The run directory written by `python -m resnet_app.train`."
)
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint",
    "latest",
    "Which checkpoint(s): latest (the newest readable one), all, best (the best evaluation, "
    "kept in MODEL_DIR/best/ by train.keep_best), averaged (resnet-app average's), ckpt-N or N.",
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
    "eval_results.json, confusion_matrix.png and reliability.png (default: MODEL_DIR/reports).",
)
_TTA = flags.DEFINE_enum(
    "tta",
    None,
    list(MODES),
    "Test-time augmentation: average the probabilities of each image and its mirror (flip), "
    "or of 10 crops (crops: ImageNet-style runs). Default: one view.",
)
_WEIGHTS = cli.define_weights_flag()
_FIT_TEMPERATURE = flags.DEFINE_boolean(
    "fit_temperature",
    False,
    "Fit the softmax temperature of one checkpoint on the run's holdout split and store it "
    "in MODEL_DIR/temperature.json, instead of evaluating.",
)


_WATCH = flags.DEFINE_boolean(
    "watch",
    False,
    "Follow a run that is training: evaluate each new checkpoint once, as it appears, until "
    "the run ends (an evaluator beside the trainer; see resnet_app/evaluation/watch.py).",
)
_WATCH_EVERY = flags.DEFINE_float(
    "watch_every", 10.0, "With --watch: seconds between looks at the run directory."
)
_WATCH_TIMEOUT = flags.DEFINE_float(
    "watch_timeout",
    None,
    "With --watch: stop after this many seconds without a new checkpoint (default: wait for "
    "the run's end).",
)


def _print_record(record: dict) -> None:
    """One line of JSON per checkpoint on stdout, as soon as its numbers are known."""
    from resnet_app.common.metrics import json_text  # TensorFlow is loaded by now.

    sys.stdout.write(json_text(record) + "\n")
    sys.stdout.flush()


def _fit_temperature() -> None:
    """--fit_temperature: the holdout split, one view, no report; other choices refused."""
    given = [flag.name for flag in (_SPLIT, _TTA, _REPORT_DIR) if flag.value is not None]
    if given:
        flags_given = ", ".join(f"--{name}" for name in given)
        raise ConfigError(
            f"--fit_temperature fits on the holdout split, one view, and writes no report: "
            f"drop {flags_given}"
        )
    temperature.fit_run_temperature(
        _MODEL_DIR.value,
        _CHECKPOINT.value,
        batch_size=_BATCH_SIZE.value,
        num_towers=_NUM_TOWERS.value,
        data_dir=_DATA_DIR.value,
        weights=_WEIGHTS.value,
        on_record=_print_record,
    )


def _watch() -> None:
    """--watch: every checkpoint as it appears; --checkpoint and --fit_temperature refused."""
    given = [flag.name for flag in (_CHECKPOINT, _FIT_TEMPERATURE) if flag.present]
    if given:
        raise ConfigError(
            f"--watch evaluates every checkpoint as the run saves it: drop --{given[0]}"
        )
    for flag in (_WATCH_EVERY, _WATCH_TIMEOUT):
        if flag.value is not None and not flag.value > 0:
            raise ConfigError(f"--{flag.name}={flag.value:g}: give seconds above 0")
    watch.watch_run(
        _MODEL_DIR.value,
        poll_seconds=_WATCH_EVERY.value,
        timeout=_WATCH_TIMEOUT.value,
        **_evaluation_options(),
    )


def _evaluation_options() -> dict:
    """The flags `evaluate_checkpoints` and `watch_run` share, as their keyword arguments."""
    return dict(
        split=_SPLIT.value,
        batch_size=_BATCH_SIZE.value,
        num_towers=_NUM_TOWERS.value,
        data_dir=_DATA_DIR.value,
        report_dir=_REPORT_DIR.value,
        tta=_TTA.value,
        weights=_WEIGHTS.value,
        on_record=_print_record,
    )


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    if _WATCH.value:
        _watch()
        return
    if _FIT_TEMPERATURE.value:
        _fit_temperature()
        return
    checkpoint_eval.evaluate_checkpoints(
        _MODEL_DIR.value, _CHECKPOINT.value, **_evaluation_options()
    )


if __name__ == "__main__":
    cli.run(main)
