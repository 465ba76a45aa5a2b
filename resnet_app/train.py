"""`python -m resnet_app.train`: train and evaluate a ResNet.

    python -m resnet_app.train --dataset=cifar10
    python -m resnet_app.train --config=configs/cifar10_resnet56.yaml --num_towers=2
    python -m resnet_app.train --config=configs/shapes_resnet20.yaml --set optimizer.momentum=0.8

Flags are parsed and the config is checked before TensorFlow is imported, so
a mistake is answered at once, in one line. The work is done by
`trainer.train_and_evaluate(config, model_dir)`, which tests call directly.
"""

from __future__ import annotations

import os
import time

from absl import flags

from resnet_app import cli, config

_CONFIG = flags.DEFINE_string("config", None, "A YAML recipe, e.g. configs/cifar10_resnet20.yaml.")
_SET = flags.DEFINE_multi_string(
    "set",
    [],
    "Override any config key: --set section.key=value (repeatable), e.g. "
    "--set optimizer.learning_rate=0.05 --set model.bn_synchronized=true.",
)
_MODEL_DIR = flags.DEFINE_string(
    "model_dir",
    None,
    "The run directory (default: a new folder under ./runs/). An existing "
    "run directory is resumed from its latest checkpoint.",
)
_LR_SCHEDULE = flags.DEFINE_string(
    "lr_schedule",
    None,
    "A schedule script, PATH.py:FUNCTION, with FUNCTION(step, "
    "steps_per_epoch) -> learning rate; see scripts/schedules/.",
)
# Shortcuts for the most used keys: flag -> (section, key).
SHORTCUTS = {
    "dataset": (
        "data",
        "dataset",
        flags.DEFINE_string,
        "shapes, synthetic, folder:PATH or a tfds name.",
    ),
    "data_dir": ("data", "data_dir", flags.DEFINE_string, "The tfds data directory."),
    "model": ("model", "name", flags.DEFINE_string, "A model preset, e.g. resnet20, resnet50."),
    "batch_size": ("train", "batch_size", flags.DEFINE_integer, "The global batch size."),
    "epochs": ("train", "epochs", flags.DEFINE_float, "Epochs to train (replaces train_steps)."),
    "train_steps": (
        "train",
        "train_steps",
        flags.DEFINE_integer,
        "Steps to train (replaces epochs).",
    ),
    "num_towers": (
        "train",
        "num_towers",
        flags.DEFINE_integer,
        "Towers: GPUs, or logical CPU devices on a CPU-only machine.",
    ),
    "eval_every": ("train", "eval_every", flags.DEFINE_integer, "Evaluate every N steps."),
    "log_every": ("train", "log_every", flags.DEFINE_integer, "Log every N steps."),
    "steps_per_loop": (
        "train",
        "steps_per_loop",
        flags.DEFINE_integer,
        "Steps per call of the compiled loop.",
    ),
    "seed": (
        "train",
        "seed",
        flags.DEFINE_integer,
        "Seed of the weights, data order, augmentation.",
    ),
}
for _name, (_section, _key, _define, _help) in SHORTCUTS.items():
    _define(_name, None, f"{_help} (config key {_section}.{_key})")

FLAGS = flags.FLAGS


def config_from_flags() -> config.Config:
    """The config the command line describes: defaults, --config, --set, then flags."""
    overrides: dict[str, dict] = {}
    for name, (section, key, _, _) in SHORTCUTS.items():
        if FLAGS[name].present:
            overrides.setdefault(section, {})[key] = FLAGS[name].value
    if _LR_SCHEDULE.value:
        overrides["schedule"] = {"name": "script", "path": _LR_SCHEDULE.value}
    return config.resolve(_CONFIG.value, _SET.value, overrides)


def default_model_dir(resolved: config.Config) -> str:
    """`runs/<dataset>_<model>_<date-time>` under the current directory."""
    dataset = resolved.data.dataset.replace("folder:", "").strip("/").replace("/", "_")
    return os.path.join("runs", f"{dataset}_{resolved.model_name}_{time.strftime('%Y%m%d-%H%M%S')}")


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    resolved = config_from_flags()
    from resnet_app import trainer  # TensorFlow is imported only once the config is valid.

    trainer.train_and_evaluate(resolved, _MODEL_DIR.value or default_model_dir(resolved))


if __name__ == "__main__":
    cli.run(main)
