"""The training command line: its flags, the config they describe, and the checks made
before TensorFlow loads (no TensorFlow here). `resnet-app train`, `lr-find` and
`schedule` define these flags by importing it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from absl import flags, logging

from resnet_app import config
from resnet_app.common import cli, run_dir
from resnet_app.common.fields import field_types
from resnet_app.data.settings import DataConfig

CONFIG = flags.DEFINE_string("config", None, "A YAML recipe, e.g. configs/cifar10_resnet20.yaml.")
SET = flags.DEFINE_multi_string(
    "set",
    [],
    "Override any config key: --set section.key=value (repeatable), e.g. "
    "--set optimizer.learning_rate=0.05 --set model.bn_synchronized=true.",
)
MODEL_DIR = flags.DEFINE_string(
    "model_dir",
    None,
    "The run directory (default: a new folder under ./runs/). An existing "
    "run directory is resumed from its latest checkpoint, with its own "
    "settings (config.yaml) unless --config is given.",
)
RESTART = flags.DEFINE_bool(
    "restart",
    False,
    "Start over in an existing --model_dir: its contents are moved to "
    "model_dir/previous-<time>/ first.",
)
ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
    "allow_config_change",
    False,
    "Resume even though settings that change what the run computes (model, "
    "data, batch, optimizer, schedule, seed, sync, towers with per-tower "
    "BatchNorm or model averaging) differ from the run's config.yaml.",
)
LR_SCHEDULE = flags.DEFINE_string(
    "lr_schedule",
    None,
    "A schedule script, PATH.py:FUNCTION, with FUNCTION(step, steps_per_epoch) -> learning rate.",
)
ALLOW_SCRIPTS = flags.DEFINE_bool(
    "allow_scripts",
    False,
    "Run a schedule script that the config (--config, or a resumed run's "
    "config.yaml) names. Without it only --lr_schedule's script runs, or one "
    "this run already ran with the same content.",
)
# Flags for the most used config keys; --set reaches every other one.
SHORTCUTS = {
    "dataset": "data.dataset", "data_dir": "data.data_dir", "model": "model.name",
    "batch_size": "train.batch_size", "epochs": "train.epochs",
    "train_steps": "train.train_steps", "num_towers": "train.num_towers",
    "eval_every": "train.eval_every", "log_every": "train.log_every",
    "steps_per_loop": "train.steps_per_loop", "seed": "train.seed",
    "deterministic": "train.deterministic", "on_nan": "train.on_nan",
    "precision": "train.precision", "jit": "train.jit", "init_from": "train.init_from",
    "sync": "sync.mode", "average_interval": "sync.interval",
}  # fmt: skip
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


def config_from_flags(extra_sets: Sequence[str] = ()) -> config.Config:
    """The config the command line describes: defaults, --config (else the run
    directory's config.yaml: `--model_dir=DIR` resumes with its own settings), --set,
    `extra_sets` (`KEY=VALUE`, a sweep trial's), then the flags."""
    config_file, resumed = CONFIG.value, False
    if not config_file and MODEL_DIR.value:
        saved = run_dir.config_path(MODEL_DIR.value)
        if os.path.isfile(saved):
            logging.info("Settings from %s, then the command line", saved)
            config_file, resumed = saved, True
    overrides: dict[str, dict] = {}
    for name, key in SHORTCUTS.items():
        if FLAGS[name].present:
            section, field = key.split(".")
            overrides.setdefault(section, {})[field] = FLAGS[name].value
    if LR_SCHEDULE.value:
        overrides["schedule"] = {"name": "script", "path": os.path.abspath(LR_SCHEDULE.value)}
    sets = [*SET.value, *extra_sets]
    resolved = config.resolve(config_file, sets, overrides, resumed=resumed)
    if resolved.schedule.RUNS_CODE:
        from resnet_app.config import script_permission
        from resnet_app.engine import schedules  # Pure Python: no TensorFlow.

        spec = resolved.schedule.path
        if LR_SCHEDULE.value:
            named = spec == os.path.abspath(LR_SCHEDULE.value)
        else:
            named = any(item.partition("=")[0].strip() == "schedule.path" for item in sets)
        script_permission.check_allowed(spec, named, ALLOW_SCRIPTS.value, MODEL_DIR.value)
        schedules.load_script(spec)  # A bad script is answered now.
    return resolved


def given_flags() -> tuple[list[str], dict[str, str]]:
    """The training flags given on the command line, as arguments again (--model_dir and
    --restart left out), and {config key: flag} of the shortcut flags among them."""
    names = ["config", "set", "lr_schedule", "allow_scripts", *SHORTCUTS]
    given = [name for name in names if FLAGS[name].present]
    argv = [text for name in given for text in FLAGS[name].serialize().split("\n")]
    return argv, {key: name for name, key in SHORTCUTS.items() if FLAGS[name].present}


def default_model_dir(resolved: config.Config) -> str:
    """`runs/<dataset>_<model>_<date-time>` under the current directory."""
    from resnet_app.data.sources import registry  # No TensorFlow.

    dataset = registry.file_label(resolved.data.dataset)
    return os.path.join("runs", f"{dataset}_{resolved.model_name}_{time.strftime('%Y%m%d-%H%M%S')}")


def check_before_tensorflow(resolved: config.Config, model_dir: str | None, restart: bool) -> None:
    """Answers, before TensorFlow loads, a dataset, `init_from` or teacher that cannot
    load (`ConfigError`); a resumed run does not read the last two again."""
    from resnet_app.data.sources import registry  # No TensorFlow.
    from resnet_app.pretrained import sources

    registry.check_source(resolved.data)
    resumed = bool(model_dir) and os.path.isfile(run_dir.config_path(model_dir)) and not restart
    if resolved.train.init_from and not resumed:
        sources.parse(resolved.train.init_from)
    if resolved.train.teacher and not resumed:
        sources.check_teacher(resolved.train.teacher, resolved.train.teacher_model)
