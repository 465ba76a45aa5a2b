"""The training config: defaults, YAML recipes, `--set KEY=VALUE`, validated without TF.

A config has six sections, each a YAML mapping:
- `model`: `name` (a preset) plus any `ResNetConfig` field to override;
- `data`: any `DataConfig` field except `seed` (which is `train.seed`);
- `optimizer`: `class` and its arguments (see `optim.py`);
- `schedule`: the learning-rate schedule (see `schedules.create_schedule`);
- `train`: the `TrainSettings` below;
- `sync`: how the towers and workers keep one model, the `SyncSettings` below.

The defaults are He et al.'s CIFAR recipe for ResNet-20 (batch 128, momentum
0.9, LR 0.1 divided by 10 at 32k and 48k steps, 64k steps, weight decay 1e-4).
A recipe in `configs/` overrides a few fields; `--set section.key=value`
overrides any one (the value is read as YAML: `0.1`, `true`, `[30, 60]`).
Unknown sections and keys, wrong types and impossible values raise a
`ConfigError` naming the key.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from resnet_app.common import files
from resnet_app.common.errors import ConfigError
from resnet_app.data.settings import DataConfig
from resnet_app.engine import schedules
from resnet_app.nets import presets

SECTIONS = ("model", "data", "optimizer", "schedule", "train", "sync")
CONFIG_FILE = "config.yaml"  # The resolved config, in every run directory.
# Sections whose keys depend on a kind: a new kind starts from an empty section.
KIND_KEYS = {"optimizer": "class", "schedule": "name"}
# Keys that replace each other: setting one drops the other.
ALTERNATIVES = {
    "train": [("epochs", "train_steps")],
    "schedule": [
        ("values", "multipliers"),
        ("warmup_steps", "warmup_epochs"),
        ("decay_steps", "decay_epochs"),
        ("total_steps", "total_epochs"),
    ],
    "optimizer": [("clipnorm", "global_clipnorm")],
}


ON_NAN = ("stop", "rollback")
# train.precision -> the images' dtype (data.dtype, unless set).
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
MAX_ROLLBACKS = 3
SYNC_MODES = ("allreduce", "model_average")

# Settings a resumed run may change: they do not change what it computes (or,
# for the run's length, only where it ends: the trainer checks separately that
# the learning rate of the steps left stays the same, and that a change of
# towers keeps the batch BatchNorm normalizes over). The `sync` keys are not
# here: model averaging, and its interval, change the weights a run reaches.
RESUMABLE_CHANGES = frozenset(
    {
        "data.data_dir",
        "data.eval_split",
        "data.eval_examples",
        "data.eval_resize",
        "train.epochs",
        "train.train_steps",
        "train.eval_every",
        "train.log_every",
        "train.steps_per_loop",
        "train.checkpoint_every",
        "train.num_towers",
        "train.eval_batch_size",
        "train.keep_checkpoints",
        "train.keep_checkpoint_every_n_hours",
        "train.deterministic",
        "train.jit",
        "train.on_nan",
        "train.nan_lr_factor",
    }
)


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """How long and how to train; every field is a `train.` config key.

    Attributes:
      batch_size: the global batch: examples per step over all towers and
        workers.
      epochs: train this many epochs (may be fractional); or set train_steps.
      train_steps: train this many steps; or set epochs.
      eval_every: evaluate every this many steps (default: once per epoch),
        and always at the end.
      log_every: log training metrics every this many steps.
      steps_per_loop: steps run per call of the compiled loop (default and
        at most: log_every; a call also stops at evaluation and checkpoint
        steps); the learning rate is still set for every step.
      checkpoint_every: save a checkpoint every this many steps (default: at
        every evaluation); also saved at every evaluation and at the end.
      num_towers: towers (GPUs, or logical CPU devices on a CPU-only machine);
        default all GPUs, or one CPU.
      seed: seeds the weights, the data order and the augmentation.
      label_smoothing: cross-entropy label smoothing (0 for none).
      eval_batch_size: global evaluation batch (default: batch_size).
      keep_checkpoints: the newest checkpoints kept (older ones are deleted).
      keep_checkpoint_every_n_hours: also keep one checkpoint per this many
        hours of training, forever (default: none).
      deterministic: TensorFlow's op determinism: a run, and a run resumed
        from any checkpoint, give bitwise the same weights (slower).
      on_nan: what a non-finite loss does: "stop" with an error, or
        "rollback" to the last good checkpoint, multiply the learning rate by
        nan_lr_factor and go on (at most MAX_ROLLBACKS times).
      nan_lr_factor: the learning-rate multiplier of a rollback.
      precision: "fp32", or mixed precision: "bf16" (bfloat16 compute with
        float32 weights; CPUs with AVX512_BF16 or AMX, TPUs, Ampere+ GPUs) or
        "fp16" (float16 with dynamic loss scaling; GPUs). Logits, loss and
        BatchNorm statistics stay float32.
      jit: compile each tower's forward and backward pass with XLA.
    """

    batch_size: int = 128
    epochs: float | None = None
    train_steps: int | None = 64_000
    eval_every: int | None = None
    log_every: int = 100
    steps_per_loop: int | None = None
    checkpoint_every: int | None = None
    num_towers: int | None = None
    seed: int = 0
    label_smoothing: float = 0.0
    eval_batch_size: int | None = None
    keep_checkpoints: int = 3
    keep_checkpoint_every_n_hours: float | None = None
    deterministic: bool = False
    on_nan: str = "stop"
    nan_lr_factor: float = 0.5
    precision: str = "fp32"
    jit: bool = False

    def __post_init__(self):
        for name in ("batch_size", "log_every"):
            _require(getattr(self, name) >= 1, f"train.{name}={getattr(self, name)}; use 1 or more")
        for name in (
            "train_steps",
            "eval_every",
            "steps_per_loop",
            "checkpoint_every",
            "num_towers",
            "eval_batch_size",
            "keep_checkpoints",
        ):
            value = getattr(self, name)
            _require(value is None or value >= 1, f"train.{name}={value}; use 1 or more")
        _require(
            (self.epochs is None) != (self.train_steps is None),
            "give exactly one of train.epochs and train.train_steps "
            f"(got epochs={self.epochs}, train_steps={self.train_steps})",
        )
        _require(
            self.epochs is None or 0 < self.epochs < math.inf,
            f"train.epochs={self.epochs}; use a number more than 0",
        )
        _require(
            0 <= self.label_smoothing < 1,
            f"train.label_smoothing={self.label_smoothing}; use a value in [0, 1)",
        )
        hours = self.keep_checkpoint_every_n_hours
        _require(
            hours is None or hours > 0,
            f"train.keep_checkpoint_every_n_hours={hours}; use a number of hours more than 0",
        )
        _require(
            self.on_nan in ON_NAN,
            f"train.on_nan={self.on_nan!r}; use one of: {', '.join(ON_NAN)}",
        )
        _require(
            self.precision in PRECISIONS,
            f"train.precision={self.precision!r}; use one of: {', '.join(PRECISIONS)}",
        )
        _require(
            0 < self.nan_lr_factor < 1,
            f"train.nan_lr_factor={self.nan_lr_factor}; use a value in (0, 1)",
        )


@dataclasses.dataclass(frozen=True)
class SyncSettings:
    """How the replicas (towers and workers) keep one model; `sync.` config keys.

    Attributes:
      mode: "allreduce" (gradients summed across replicas at every step) or
        "model_average" (local SGD: each replica steps on its own share of
        the batch, and the replicas average their weights, BatchNorm moving
        statistics and optimizer slots every `interval` steps; see
        `averaging.py`).
      interval: steps between averages with mode model_average (1 or more;
        1 is the all-reduce update).
    """

    mode: str = "allreduce"
    interval: int = 8

    def __post_init__(self):
        _require(
            self.mode in SYNC_MODES,
            f"sync.mode={self.mode!r}; use one of: {', '.join(SYNC_MODES)}",
        )
        _require(self.interval >= 1, f"sync.interval={self.interval}; use 1 or more")


DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {"name": "resnet20"},
    "data": {"dataset": "shapes"},
    "optimizer": {"class": "momentum", "learning_rate": 0.1, "momentum": 0.9, "nesterov": False},
    "schedule": {
        "name": "piecewise",
        "boundaries": [32_000, 48_000],  # steps
        "multipliers": [1.0, 0.1, 0.01],
    },
    "train": {},
    "sync": {},
}


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclasses.dataclass(frozen=True)
class Config:
    """A resolved, validated training config.

    Attributes:
      model: the preset `name` and the `ResNetConfig` fields it overrides.
      data: the input settings.
      optimizer: `class` and arguments, checked when the optimizer is built.
      schedule: the learning-rate schedule spec.
      train: the training settings.
      sync: how the replicas keep one model.
    """

    model: dict[str, Any]
    data: DataConfig
    optimizer: dict[str, Any]
    schedule: dict[str, Any]
    train: TrainSettings
    sync: SyncSettings = SyncSettings()

    @property
    def model_name(self) -> str:
        return self.model["name"]

    @property
    def model_overrides(self) -> dict[str, Any]:
        return {k: v for k, v in self.model.items() if k != "name"}

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The config as plain YAML-ready data, every field spelled out."""
        data = dataclasses.asdict(self.data)
        data.pop("seed")
        return _plain(
            {
                "model": self.model,
                "data": data,
                "optimizer": self.optimizer,
                "schedule": self.schedule,
                "train": dataclasses.asdict(self.train),
                "sync": dataclasses.asdict(self.sync),
            }
        )


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class _Loader(yaml.SafeLoader):
    """YAML as people write numbers: `1e-4` is a float (YAML 1.1 wants `1.0e-4`)."""


class _Dumper(yaml.SafeDumper):
    """Quotes a string such as "1e5", which `_Loader` would read as a number."""


for _yaml_class in (_Loader, _Dumper):
    _yaml_class.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
        list("-+0123456789."),
    )


def load_yaml(text) -> Any:
    """Parses YAML text or a file object, reading `1e-4` as a number."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader.


def read_yaml(path: str) -> dict[str, Any]:
    """Reads a config file; a missing or malformed file is a one-line `ConfigError`."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path} not found; recipes are in configs/")
    try:
        with open(path) as f:
            content = load_yaml(f)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}; fix the syntax") from None
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise ConfigError(
            f"config file {path} must be a mapping of sections ({', '.join(SECTIONS)})"
        )
    return content


def parse_set(assignment: str) -> tuple[list[str], Any]:
    """Splits `section.key=value` into its key path and its YAML-parsed value."""
    key, equals, text = assignment.partition("=")
    if not equals or not key:
        raise ConfigError(
            f"--set {assignment}: use --set section.key=value, e.g. train.batch_size=256"
        )
    try:
        value = load_yaml(text) if text else ""
    except yaml.YAMLError:
        value = text
    return key.strip().split("."), value


def _merge(tree: dict[str, Any], layer: Mapping[str, Any], where: str) -> None:
    """Applies one layer of settings (a file, the --sets, the flags) to `tree`.

    Within a layer the order of keys does not matter. A new optimizer class or
    schedule name starts its section afresh (their keys differ), then the
    layer's keys apply. Giving one of two alternative keys (epochs or
    train_steps, values or multipliers, ...) drops the other one set before.
    """
    for section, values in layer.items():
        if section not in SECTIONS:
            raise ConfigError(
                f"unknown config section '{section}'{where}; valid sections: {', '.join(SECTIONS)}"
            )
        if not isinstance(values, Mapping):
            raise ConfigError(f"config section '{section}'{where} must be a mapping of keys")
        kind = KIND_KEYS.get(section)
        if kind in values and values[kind] != tree[section].get(kind):
            tree[section] = {}
        for pair in ALTERNATIVES.get(section, ()):
            given = [key for key in pair if values.get(key) is not None]
            if len(given) == 1:
                other = pair[1 - pair.index(given[0])]
                # TrainSettings has a default for train_steps: clear it explicitly.
                if section == "train":
                    tree[section][other] = None
                else:
                    tree[section].pop(other, None)
        tree[section].update(values)


def _set_layer(sets: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The --set assignments as one layer {section: {key: value}}; later ones win."""
    layer: dict[str, dict[str, Any]] = {}
    for assignment in sets:
        path, value = parse_set(assignment)
        key = ".".join(path)
        if len(path) != 2:
            raise ConfigError(
                f"--set {key}: keys look like section.key, e.g. train.batch_size; sections: "
                f"{', '.join(SECTIONS)}"
            )
        if path[0] not in SECTIONS:
            raise ConfigError(
                f"unknown config section '{path[0]}' in --set {key}; valid sections: "
                f"{', '.join(SECTIONS)}"
            )
        section = layer.setdefault(path[0], {})
        section.pop(path[1], None)  # Keep the order of the last assignment.
        section[path[1]] = value
    return layer


def _typed(section: str, name: str, value: Any, annotation: str) -> Any:
    """Checks `value` against a dataclass field annotation (a string)."""
    optional = "None" in annotation
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{section}.{name} must not be empty")
    kind = annotation.split("|")[0].strip()
    bad = ConfigError(f"{section}.{name}={value!r}: expected {kind.split('[')[0]}")
    if kind.startswith("tuple"):
        item = kind[len("tuple[") :].split(",")[0].strip()
        if not isinstance(value, (list, tuple)):
            raise bad
        numbers = all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in value
        )
        if item in ("int", "float") and not numbers:
            raise ConfigError(f"{section}.{name}={value!r}: expected a list of numbers")
        if item == "int" and not all(float(v).is_integer() for v in value):
            raise ConfigError(f"{section}.{name}={value!r}: expected a list of integers")
        return tuple(int(v) if item == "int" else float(v) for v in value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise bad
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        if not math.isfinite(value):
            raise ConfigError(f"{section}.{name}={value}: expected a finite number")
        return float(value)
    if kind == "str":
        if not isinstance(value, str):
            raise bad
        return value
    return value


def _build(cls: type, section: str, values: Mapping[str, Any], exclude: Iterable[str] = ()):
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in exclude}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown {section} key(s) {', '.join(unknown)}; "
            f"valid keys: {', '.join(sorted(fields))}"
        )
    typed = {k: _typed(section, k, v, str(fields[k].type)) for k, v in values.items()}
    return typed


def resolve(
    config_file: str | None = None,
    sets: Iterable[str] = (),
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Builds the config: defaults, then the file, then `--set`s, then `overrides`.

    Args:
      config_file: a YAML recipe, or None.
      sets: `section.key=value` strings.
      overrides: {section: {key: value}} from dedicated flags (--batch_size...),
        applied last. See `_merge` for how a layer replaces what came before.

    Returns:
      The validated `Config`.

    Raises:
      ConfigError: naming the first bad section, key or value.
    """
    tree = copy.deepcopy(DEFAULTS)
    if config_file:
        _merge(tree, read_yaml(config_file), f" in {config_file}")
    _merge(tree, _set_layer(sets), " in --set")
    _merge(tree, overrides or {}, "")
    return from_dict(tree)


def from_dict(tree: Mapping[str, Mapping[str, Any]]) -> Config:
    """Validates a full config tree (as written to config.yaml)."""
    tree = {section: dict(tree.get(section) or {}) for section in SECTIONS}
    train = TrainSettings(**_build(TrainSettings, "train", tree["train"]))
    sync = SyncSettings(**_build(SyncSettings, "sync", tree["sync"]))
    _require(
        not (sync.mode == "model_average" and train.precision == "fp16"),
        "sync.mode=model_average cannot use train.precision=fp16: its loss scale is not "
        "kept per replica; use bf16 or fp32",
    )

    model = dict(tree["model"])
    name = model.pop("name", None)
    if not isinstance(name, str):
        raise ConfigError(f"model.name={name!r}; valid models: {', '.join(presets.model_names())}")
    model_fields = _build(presets.ResNetConfig, "model", model)
    presets.get_config(name, **model_fields)  # Validates name and values.

    data_fields = _build(DataConfig, "data", tree["data"], exclude=("seed",))
    data_fields.setdefault("dtype", PRECISIONS[train.precision])
    data = DataConfig(**data_fields, seed=train.seed)

    for section in ("optimizer", "schedule"):
        for key in tree[section]:
            if not isinstance(key, str):
                raise ConfigError(f"{section} key {key!r} must be a name")
    # The schedule's keys and values are checked now, before TensorFlow loads;
    # its length and the optimizer are checked when training starts.
    learning_rate = tree["optimizer"].get("learning_rate", 0.1)
    schedules.create_schedule(
        tree["schedule"],
        base_lr=learning_rate if isinstance(learning_rate, (int, float)) else 0.1,
        global_batch_size=train.batch_size,
        total_steps=train.train_steps or 1,
    )
    return Config(
        model={"name": name, **model_fields},
        data=data,
        optimizer=dict(tree["optimizer"]),
        schedule=dict(tree["schedule"]),
        train=train,
        sync=sync,
    )


def changes(old: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """The settings that differ between two configs: {"section.key": (old, new)}.

    Model keys compare as the preset resolves them: `bn_synchronized: false`
    given or left at its default is the same setting.
    """

    def flat(config: Config, model_keys: Iterable[str]) -> dict[str, Any]:
        tree = config.to_dict()
        preset = presets.get_config(config.model_name, **config.model_overrides)
        tree["model"] = {"name": config.model_name}
        tree["model"].update({key: _plain(getattr(preset, key)) for key in model_keys})
        return {
            f"{section}.{key}": value
            for section, values in tree.items()
            for key, value in values.items()
        }

    model_keys = set(old.model_overrides) | set(new.model_overrides)
    before, after = flat(old, model_keys), flat(new, model_keys)
    return {
        key: (before.get(key), after.get(key))
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    }


def to_yaml(config: Config) -> str:
    """The resolved config as YAML text; `from_yaml` reads it back equal."""
    return yaml.dump(config.to_dict(), Dumper=_Dumper, sort_keys=False)


def from_yaml(text: str, where: str) -> Config:
    """Reads `to_yaml`'s text back; `where` names its origin in errors."""
    try:
        tree = load_yaml(text)
    except yaml.YAMLError:
        raise ConfigError(f"{where} is not valid YAML; it was not written by resnet_app") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{where} must be a mapping of sections ({', '.join(SECTIONS)})")
    return from_dict(tree)


def write_yaml(config: Config, path: str) -> None:
    """Writes the resolved config (atomically: a reader never sees half a file)."""
    files.write_text_atomically(path, to_yaml(config))


def read_run_config(model_dir: str | None) -> Config:
    """The config a run was trained with, from `model_dir/config.yaml`.

    Raises:
      ConfigError: when `model_dir` is not a run directory, or its config is
        not valid.
    """
    path = os.path.join(model_dir or "", CONFIG_FILE)
    if not model_dir or not os.path.isfile(path):
        found = f"{model_dir} has no {CONFIG_FILE}" if model_dir else "it is not set"
        raise ConfigError(
            f"--model_dir must be a run directory written by `python -m resnet_app.train` ({found})"
        )
    try:
        return from_dict(read_yaml(path))
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
