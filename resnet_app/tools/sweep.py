"""Searches training settings: `resnet-app sweep`.

  resnet-app sweep --study_dir=sweeps/lr --config=cifar10_resnet20 \\
      --set data.validation_split=5000 \\
      --param="optimizer.learning_rate=log(0.02, 0.5)" --trials=20
  resnet-app train --config=sweeps/lr/best.yaml          # the best trial's settings

Each trial is a `resnet-app train` run in `STUDY_DIR/trial-NNNN`, scored on a
validation split (never the test split); Optuna draws and prunes. The same
command resumes a stopped sweep. Needs requirements-sweep.txt; see docs/sweep.md.
"""

from __future__ import annotations

import os
import sys

import yaml
from absl import flags

from resnet_app.common import cli
from resnet_app.common.errors import ConfigError
from resnet_app.config import loading
from resnet_app.engine import command_line
from resnet_app.sweep import runner
from resnet_app.sweep import space as space_lib
from resnet_app.sweep import study as study_lib

_STUDY_DIR = flags.DEFINE_string(
    "study_dir", None, "The sweep's directory: its trials' runs, study.db, the summary."
)
_SPACE = flags.DEFINE_string("space", None, "A YAML file of KEY: SPEC lines, e.g. log(0.01, 1).")
# Flags given as they are to `runner.SweepRequest`'s fields of the same names.
_REQUEST_FLAGS = ("trials", "sampler", "pruner", "prune_after", "parallel", "storage", "study_name")
_PARAM = flags.DEFINE_multi_string(
    "param",
    [],
    "A searched key: --param=KEY=SPEC, SPEC one of log(a, b), uniform(a, b[, step]), "
    "int(a, b[, step]), logint(a, b), choice(x, y, ...) (repeatable).",
)
flags.DEFINE_integer("trials", 20, "Trials the study holds when the sweep ends.")
flags.DEFINE_enum("sampler", "tpe", study_lib.SAMPLERS, "How values are drawn.")
flags.DEFINE_enum("pruner", "median", list(study_lib.PRUNERS), "How weak trials are stopped early.")
flags.DEFINE_integer("prune_after", 3, "Finished trials before the median pruner stops any.")
flags.DEFINE_integer("parallel", 1, "Trials at once.")
_DEVICES = flags.DEFINE_list(
    "devices", [], "Accelerators, one trial on each at once (CUDA_VISIBLE_DEVICES), e.g. 0,1."
)
_SWEEP_SEED = flags.DEFINE_integer("sweep_seed", 0, "The sampler's seed.")
flags.DEFINE_string(
    "storage", None, "The study's database URL (default: sqlite:///STUDY_DIR/study.db)."
)
flags.DEFINE_string("study_name", "sweep", "The study's name in the database.")
# --help lists the training flags too: each trial is given them.
flags.adopt_module_key_flags(command_line)


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    if not _STUDY_DIR.value:
        raise ConfigError("give --study_dir, the sweep's directory (made if missing)")
    for name in ("model_dir", "restart"):
        if flags.FLAGS[name].present:
            raise ConfigError(f"--{name}: each trial runs in its own directory under --study_dir")
    request = runner.SweepRequest(
        study_dir=_STUDY_DIR.value,
        devices=tuple(_DEVICES.value),
        seed=_SWEEP_SEED.value,
        **cli.flag_values(*_REQUEST_FLAGS),
    )
    space = space_lib.parse_space(_read_space(_SPACE.value), _PARAM.value)
    base_argv, flag_keys = command_line.given_flags()
    # A recipe file by its absolute path: a resumed sweep may start from elsewhere.
    base_argv = [_absolute_config(arg) for arg in base_argv]
    plan = runner.make_plan(base_argv, space, command_line.config_from_flags, flag_keys)
    # A dataset or init_from that cannot load: answered once, not by every trial.
    command_line.check_before_tensorflow(plan.resolve([]), None, False)
    sweep = runner.Sweep(request, plan)
    sweep.run()
    if sweep.stopping:  # Stopped by a signal: the same command resumes it.
        sys.exit(128 + sweep.stopping[0])


def _absolute_config(arg: str) -> str:
    name, _, value = arg.partition("=")
    if name == "--config" and os.path.isfile(value):
        return f"--config={os.path.abspath(value)}"
    return arg


def _read_space(path: str | None) -> dict | None:
    """The space file's {KEY: SPEC} mapping, or one line naming what is wrong with it."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            mapping = loading.load_yaml(f)
    except OSError as error:
        raise ConfigError(f"--space={path}: {error.strerror}; check the path") from None
    except (yaml.YAMLError, UnicodeDecodeError):
        raise ConfigError(f"--space={path} is not valid YAML; fix the syntax") from None
    if not isinstance(mapping, dict):
        raise ConfigError(
            f"--space={path}: give KEY: SPEC lines, e.g. optimizer.learning_rate: log(0.01, 1)"
        )
    return mapping


if __name__ == "__main__":
    cli.run(main)
