"""`python -m resnet_app.evaluate`: evaluate a run's checkpoints.

    python -m resnet_app.evaluate --model_dir=runs/try --checkpoint=all --split=train
    python -m resnet_app.evaluate --model_dir=runs/try --tta=flip --weights=raw
    python -m resnet_app.evaluate --model_dir=runs/try --checkpoint=ckpt-4000 --fit_temperature
    python -m resnet_app.evaluate --model_dir=runs/try --watch   # beside a running trainer

Each chosen checkpoint's model is evaluated on every example of the split
exactly once; its record goes to stdout and metrics.jsonl as one JSON line
("checkpoint", "step", "split", "top1", "top5", "loss", "ece", "nll", "report",
...), and its report directory holds eval_results.json and pictures. `--watch`
evaluates each checkpoint as the run saves it. See docs/evaluation.md.
"""

from __future__ import annotations

from absl import flags

from resnet_app.common import cli
from resnet_app.common.errors import ConfigError
from resnet_app.engine.tta import MODES
from resnet_app.evaluation import checkpoint_eval, temperature, watch

cli.define_checkpoint_flags()
FLAGS = flags.FLAGS
_TTA = flags.DEFINE_enum(
    "tta",
    None,
    list(MODES),
    "Test-time augmentation: average the probabilities of each image and its mirror (flip), "
    "or of 10 crops (crops: ImageNet-style runs). Default: one view.",
)
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
# The flags every mode passes on, by their names.
_SHARED = ("batch_size", "num_towers", "data_dir", "weights")


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    shared = {**cli.flag_values(*_SHARED), "on_record": cli.print_record}
    if _WATCH.value:
        given = [flag for flag in ("checkpoint", "fit_temperature") if FLAGS[flag].present]
        if given:
            raise ConfigError(
                f"--watch evaluates every checkpoint as the run saves it: drop --{given[0]}"
            )
        for flag in (_WATCH_EVERY, _WATCH_TIMEOUT):
            if flag.value is not None and not flag.value > 0:
                raise ConfigError(f"--{flag.name}={flag.value:g}: give seconds above 0")
        watch.watch_run(
            FLAGS.model_dir,
            poll_seconds=_WATCH_EVERY.value,
            timeout=_WATCH_TIMEOUT.value,
            **cli.flag_values("split", "report_dir", "tta"),
            **shared,
        )
    elif _FIT_TEMPERATURE.value:
        given = [name for name in ("split", "tta", "report_dir") if FLAGS[name].value is not None]
        if given:
            raise ConfigError(
                "--fit_temperature fits on the holdout split, one view, and writes no report: "
                f"drop {', '.join(f'--{name}' for name in given)}"
            )
        temperature.fit_run_temperature(FLAGS.model_dir, FLAGS.checkpoint, **shared)
    else:
        checkpoint_eval.evaluate_checkpoints(
            FLAGS.model_dir,
            FLAGS.checkpoint,
            **cli.flag_values("split", "report_dir", "tta"),
            **shared,
        )


if __name__ == "__main__":
    cli.run(main)
