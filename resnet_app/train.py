"""`python -m resnet_app.train`: train and evaluate a ResNet.

    python -m resnet_app.train --dataset=cifar10
    python -m resnet_app.train --config=configs/cifar10_resnet56.yaml --num_towers=2
    python -m resnet_app.train --config=configs/shapes_resnet20.yaml --set optimizer.momentum=0.8
    python -m resnet_app.train --model_dir=runs/shapes_resnet20_20261130-060000  # resume

Flags are parsed and the whole config (optimizer and schedule included) is
checked before TensorFlow is imported, so most mistakes are answered at once;
every one gets one line and exit status 2. The work is done by
`train_and_evaluate(config, model_dir)` in `resnet_app/engine/loop.py`,
which tests call directly.
"""

from __future__ import annotations

import os
import time

from absl import flags, logging

from resnet_app import config
from resnet_app.common import cli, run_dir, run_lock, slurm, tf_config
from resnet_app.common.fields import field_types
from resnet_app.data.settings import DataConfig

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
    "run directory is resumed from its latest checkpoint, with its own "
    "settings (config.yaml) unless --config is given.",
)
_RESTART = flags.DEFINE_bool(
    "restart",
    False,
    "Start over in an existing --model_dir: its contents are moved to "
    "model_dir/previous-<time>/ first.",
)
_ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
    "allow_config_change",
    False,
    "Resume even though settings that change what the run computes (model, "
    "data, batch, optimizer, schedule, seed, sync, towers with per-tower "
    "BatchNorm or model averaging) "
    "differ from the run's config.yaml.",
)
_LR_SCHEDULE = flags.DEFINE_string(
    "lr_schedule",
    None,
    "A schedule script, PATH.py:FUNCTION, with FUNCTION(step, "
    "steps_per_epoch) -> learning rate; see scripts/schedules/.",
)
_ALLOW_SCRIPTS = flags.DEFINE_bool(
    "allow_scripts",
    False,
    "Run a schedule script that the config (--config, or a resumed run's "
    "config.yaml) names. Without it only --lr_schedule's script runs, or one "
    "this run already ran with the same content.",
)
# Flags for the most used config keys; --set reaches every other one.
SHORTCUTS = {
    "dataset": "data.dataset",
    "data_dir": "data.data_dir",
    "model": "model.name",
    "batch_size": "train.batch_size",
    "epochs": "train.epochs",
    "train_steps": "train.train_steps",
    "num_towers": "train.num_towers",
    "eval_every": "train.eval_every",
    "log_every": "train.log_every",
    "steps_per_loop": "train.steps_per_loop",
    "seed": "train.seed",
    "deterministic": "train.deterministic",
    "on_nan": "train.on_nan",
    "precision": "train.precision",
    "jit": "train.jit",
    "init_from": "train.init_from",
    "sync": "sync.mode",
    "average_interval": "sync.interval",
}
_OWNERS = {"data": DataConfig, "train": config.TrainSettings, "sync": config.SyncSettings}


def _define_shortcuts() -> None:
    """One flag per SHORTCUTS entry, of its config field's type, unset by default."""
    for name, key in SHORTCUTS.items():
        section, field = key.split(".")
        if section == "model":
            flags.DEFINE_string(name, None, f"A model preset, e.g. resnet20 or resnet50 ({key}).")
            continue
        owner = _OWNERS[section]
        text = cli.attribute_help(owner).get(field, field)
        cli.define_flag(name, field_types(owner)[field], None, f"{text} ({key})")


_define_shortcuts()
FLAGS = flags.FLAGS


def config_from_flags() -> config.Config:
    """The config the command line describes: defaults, --config, --set, then flags.

    Without --config, an existing run directory's config.yaml takes its place:
    `--model_dir=DIR` resumes a run with its own settings, plus any flag given.
    """
    config_file, resumed = _CONFIG.value, False
    if not config_file and _MODEL_DIR.value:
        saved = run_dir.config_path(_MODEL_DIR.value)
        if os.path.isfile(saved):
            logging.info("Settings from %s, then the command line", saved)
            config_file, resumed = saved, True
    overrides: dict[str, dict] = {}
    for name, key in SHORTCUTS.items():
        if FLAGS[name].present:
            section, field = key.split(".")
            overrides.setdefault(section, {})[field] = FLAGS[name].value
    if _LR_SCHEDULE.value:
        overrides["schedule"] = {"name": "script", "path": os.path.abspath(_LR_SCHEDULE.value)}
    resolved = config.resolve(config_file, _SET.value, overrides, resumed=resumed)
    if resolved.schedule.kind == "script":
        from resnet_app.config import script_permission
        from resnet_app.engine import schedules  # Pure Python: no TensorFlow.

        spec = resolved.schedule.path
        named = any(item.partition("=")[0].strip() == "schedule.path" for item in _SET.value)
        if _LR_SCHEDULE.value:
            named = spec == os.path.abspath(_LR_SCHEDULE.value)
        script_permission.check_allowed(spec, named, _ALLOW_SCRIPTS.value, _MODEL_DIR.value)
        schedules.load_script(spec)  # A bad script is answered now.
    return resolved


def default_model_dir(resolved: config.Config) -> str:
    """`runs/<dataset>_<model>_<date-time>` under the current directory."""
    from resnet_app.data.sources import registry  # No TensorFlow.

    dataset = registry.file_label(resolved.data.dataset)
    return os.path.join("runs", f"{dataset}_{resolved.model_name}_{time.strftime('%Y%m%d-%H%M%S')}")


def check_before_tensorflow(resolved: config.Config, model_dir: str | None, restart: bool) -> None:
    """Answers, before TensorFlow loads, a dataset or `init_from` that cannot load.

    A resumed run does not read its `init_from` again (it may be gone), so
    only a run that starts is checked.

    Raises:
      ConfigError: one line naming the problem and the fix.
    """
    from resnet_app.data.sources import registry  # No TensorFlow.
    from resnet_app.pretrained import sources

    registry.check_source(resolved.data)
    resumed = bool(model_dir) and os.path.isfile(run_dir.config_path(model_dir)) and not restart
    if resolved.train.init_from and not resumed:
        sources.parse(resolved.train.init_from)


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    resolved = config_from_flags()
    check_before_tensorflow(resolved, _MODEL_DIR.value, _RESTART.value)
    slurm_worker = slurm.check_before_tensorflow()  # A partial SLURM environment: one line.
    tf_config.check(tf_config.read(), "train")  # Kubernetes' evaluator task, a ps job: one line.
    if _MODEL_DIR.value and "TF_CONFIG" not in os.environ and not slurm_worker:
        # A second trainer on a run directory in use: answered before TensorFlow loads
        # (a worker of a multi-worker job shares the directory with its chief).
        run_lock.refuse_if_held(_MODEL_DIR.value)
    from resnet_app.engine import loop

    loop.train_and_evaluate(
        resolved,
        _MODEL_DIR.value or default_model_dir(resolved),
        restart=_RESTART.value,
        allow_config_change=_ALLOW_CONFIG_CHANGE.value,
    )


if __name__ == "__main__":
    cli.run(main)
